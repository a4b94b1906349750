"""Chapter 08 on the model: with chunked prefill the outputs are the unchunked run's, token for token,
no step computes more than its budget, and decodes keep coming while a long prompt is prefilled.
The oracles: the same engine without chunks, and the per-request engine (one sequence at a time)."""

import random

import pytest

from minipaged import LLM, SamplingParams
from minipaged.beam_search import BeamSearchParams
from minipaged.metrics_reader import find

rng = random.Random(8)
LONG = [rng.randrange(1, 250) for _ in range(150)]  # a "document" far longer than any budget below
PROMPTS = [[rng.randrange(1, 250) for _ in range(rng.randrange(3, 40))] for _ in range(9)]
PROMPTS[3], PROMPTS[6] = LONG, LONG[:97] + [5, 6]  # long prompts arriving among short ones
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def make(chunked: bool, budget=None, **kw):
    options = dict(kv_policy="on_demand", kv_capacity_tokens=2048, block_size=4, max_model_len=256,
                   max_num_seqs=4, progress=False)
    return LLM("tiny", enable_chunked_prefill=chunked, max_num_batched_tokens=budget, **{**options, **kw})


def computed(llm):
    """Tokens run through the model over the LLM's lifetime (prompts, recomputed ones, decodes)."""
    return find(llm.get_metrics(), "tokens_computed").value


def generate(llm, prompts, params):
    """(outputs, tokens computed in each engine step of this call)."""
    with llm.engine.metrics.steps.recording() as rec:
        outs = llm.generate(prompts, params, use_tqdm=False)
    return outs, rec.series("num_tokens")


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def whole():
    """The oracle: prompts prefilled whole, by the per-request engine, one sequence at a time."""
    llm = LLM("tiny", kv_policy="per_request", progress=False, max_model_len=256)
    return tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))


@pytest.mark.parametrize("budget", [4, 7, 16, 64])
def test_chunked_outputs_equal_whole_prefill_and_stay_within_the_budget(whole, budget):
    llm = make(True, budget)
    outs, step_tokens = generate(llm, PROMPTS, GREEDY)
    assert tokens(outs) == whole
    assert max(step_tokens) <= budget
    assert computed(llm) == sum(len(p) + 15 for p in PROMPTS), "every token computed exactly once"
    llm.engine.check_invariants(idle=True)


def test_without_chunks_a_long_prompt_makes_a_long_step(whole):
    llm = make(False)
    outs, step_tokens = generate(llm, PROMPTS, GREEDY)
    assert tokens(outs) == whole
    assert max(step_tokens) >= len(LONG)


def test_decodes_go_on_while_a_long_prompt_is_prefilled():
    """Three short requests decode; a long one arrives behind them. Chunked, every step of its
    prefill also decodes the other three; unchunked, one step computes the whole long prompt."""
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], LONG]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (40, 40, 40, 8)]
    for chunked in (False, True):
        llm = make(chunked, 16 if chunked else None, max_num_seqs=4)
        with llm.engine.metrics.steps.recording() as rec:
            llm.generate(prompts, params, use_tqdm=False)
        steps = list(zip(rec.series("num_tokens"), rec.series("num_decodes")))
        if chunked:  # once the three short ones decode, LONG fills what is left of each step: 13 tokens
            assert all(t <= 16 for t, _ in steps)
            assert sum(1 for t, d in steps if (t, d) == (16, 3)) >= (len(LONG) - 16) // 13
        else:
            assert max(t for t, _ in steps) >= len(LONG)


def test_token_times_record_every_output_token():
    llm = make(True, 8)
    outs = llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False)
    for o in outs:
        times = o.metrics["token_times"][0]
        assert len(times) == len(o.outputs[0].token_ids) == 16
        assert times == sorted(times) and times[0] == o.metrics["first_token_time"]
        assert times[-1] == o.metrics["finished_time"]


@pytest.mark.parametrize("policy", ["block_table", "on_demand", "shared"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_chunks_under_memory_pressure_keep_the_tokens(whole, policy, mode):
    llm = make(True, 8, kv_policy=policy, kv_capacity_tokens=192, preemption_mode=mode,
               **({"reservation": "oracle"} if policy == "block_table" else {}))
    outs, step_tokens = generate(llm, PROMPTS, GREEDY)
    assert tokens(outs) == whole
    if policy != "block_table":  # reserving memory up front never preempts
        assert llm.engine.stats["preemptions"] > 0
    assert max(step_tokens) <= 8
    llm.engine.check_invariants(idle=True)


def test_a_chunk_promises_only_the_blocks_it_fills():
    """The policy alone: after a chunk of 5 tokens (blocks of 4), one block is findable; after the
    next chunk, the blocks that chunk filled too."""
    from minipaged.kv import PrefixCachingPolicy

    policy = PrefixCachingPolicy(256, block_size=4, watermark=0.0)
    prompt = LONG[:30]
    policy.allocate("doc", len(prompt), 8, token_ids=prompt)
    policy.append_slots("doc", 5)
    assert policy.cached_prefix_tokens(prompt) == 4
    policy.commit_tokens("doc", prompt[:5])
    policy.append_slots("doc", 11)
    assert policy.cached_prefix_tokens(prompt) == 16
    policy.commit_tokens("doc", prompt[5:16])
    policy.append_slots("doc", 14)
    assert policy.cached_prefix_tokens(prompt) == 28  # 29 tokens at most: the last one is always computed


def test_with_the_prefix_cache_chunks_promise_only_what_they_write():
    """A prompt computed in chunks shares its blocks with a later prompt that starts the same, and
    the later one hits only blocks that earlier chunks have written or are writing."""
    prompts = [LONG + [1, 2], LONG[:120] + [3, 4, 5]]
    plain = make(False, kv_policy="shared")
    ref = tokens(plain.generate(prompts, GREEDY, use_tqdm=False))
    llm = make(True, 16, kv_policy="shared", enable_prefix_caching=True)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert tokens(outs) == ref
    # the second is admitted once the first's chunks leave room in the budget: it finds the part of
    # LONG that has slots already, a whole number of blocks, and computes the rest itself
    assert outs[1].num_cached_tokens % 4 == 0 and 0 < outs[1].num_cached_tokens <= 120
    assert computed(llm) == sum(map(len, prompts)) + 2 * 15 - outs[1].num_cached_tokens
    llm.engine.check_invariants(idle=True)


def test_parallel_samples_fork_after_the_last_chunk():
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    ref = tokens(make(False, kv_policy="shared").generate([LONG, PROMPTS[0]], params, use_tqdm=False))
    llm = make(True, 8, kv_policy="shared")
    outs = llm.generate([LONG, PROMPTS[0]], params, use_tqdm=False)
    assert tokens(outs) == ref and llm.engine.stats["forks"] == 4
    # each prompt computed once, by its first sample, then 11 decodes for each of the 3 samples: a fork
    # before the last chunk would have had the children compute the prompt again
    assert computed(llm) == len(LONG) + len(PROMPTS[0]) + 2 * 3 * 11
    llm.engine.check_invariants(idle=True)


def test_beam_search_still_works_with_chunked_prefill_on():
    params = BeamSearchParams(beam_width=3, max_tokens=8)
    ref = make(False, kv_policy="shared").beam_search([LONG[:60]], params)
    out = make(True, 8, kv_policy="shared").beam_search([LONG[:60]], params)
    assert [s.tokens for s in out[0].sequences] == [s.tokens for s in ref[0].sequences]


@pytest.mark.parametrize("kwargs, field", [
    ({"kv_policy": "per_request"}, "kv_policy"),
    ({"scheduler": "static"}, "scheduler"),
    ({"budget": 3}, "max_num_batched_tokens=3"),
    ({"budget": 2, "max_num_seqs": 64}, "max_num_seqs=64"),
])
def test_bad_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make(True, **kwargs)


def test_enable_chunked_prefill_must_be_a_bool():
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        LLM("tiny", kv_policy="on_demand", enable_chunked_prefill="yes", progress=False)


def test_the_default_budget_is_used_when_none_is_given():
    from minipaged.scheduler import DEFAULT_CHUNKED_BUDGET

    llm = make(True, max_model_len=512)
    assert llm.engine.scheduler.max_num_batched_tokens == DEFAULT_CHUNKED_BUDGET
    _, step_tokens = generate(llm, [LONG * 2], GREEDY)  # 300 tokens: one chunk of the default, then the rest
    assert max(step_tokens) == DEFAULT_CHUNKED_BUDGET


def test_a_bad_request_among_chunked_ones_is_refused_and_the_others_go_on(whole):
    llm = make(True, 8, kv_capacity_tokens=160)
    too_long = [7] * 200  # more than the whole pool
    outs = llm.generate([PROMPTS[0], too_long, PROMPTS[1]], GREEDY, use_tqdm=False)
    assert outs[1].outputs[0].finish_reason == "abort"
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == [whole[0][0], whole[1][0]]
    llm.engine.check_invariants(idle=True)


@pytest.mark.slow
def test_smollm2_answers_the_same_with_its_prompts_in_chunks():
    """The real model: a long chat prompt computed in chunks of at most 32 tokens, beside short ones,
    gives the per-request engine's greedy answers."""
    document = " ".join(f"Rule {i}: a borrowed book is due {i + 7} days after checkout." for i in range(20))
    chats = [[{"role": "user", "content": f"{document}\nWhen is a book under rule 12 due?"}],
             [{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "user", "content": "Name a primary colour."}]]
    params = SamplingParams(temperature=0, max_tokens=24)
    per_request = LLM("smollm2-135m", kv_policy="per_request", progress=False)
    ref = tokens(per_request.chat(chats, params, use_tqdm=False))
    llm = LLM("smollm2-135m", kv_policy="on_demand", enable_chunked_prefill=True, max_num_batched_tokens=32,
              max_num_seqs=4, attention_backend="torch_batched", progress=False)
    with llm.engine.metrics.steps.recording() as rec:
        outs = llm.chat(chats, params, use_tqdm=False)
    assert len(outs[0].prompt_token_ids) > 300
    assert tokens(outs) == ref
    assert max(rec.series("num_tokens")) <= 32
    llm.engine.check_invariants(idle=True)
