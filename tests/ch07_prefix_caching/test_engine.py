"""Chapter 07 on the model: with the prefix cache on, the outputs are the cold run's, token for token,
while fewer prompt tokens are computed. The oracle is the same engine without the cache ("shared")."""

import random

import pytest

from minipaged import LLM, SamplingParams
from minipaged.beam_search import BeamSearchParams
from minipaged.metrics_reader import find

rng = random.Random(7)
SYSTEM = [rng.randrange(1, 250) for _ in range(37)]  # a "system prompt" every request starts with
PROMPTS = [SYSTEM + [rng.randrange(1, 250) for _ in range(rng.randrange(1, 14))] for _ in range(8)]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def make(cache: bool, **kw):
    # the reference attention unless a test asks for another (test_the_batched_backend_agrees)
    options = dict(kv_policy="shared", kv_capacity_tokens=4096, block_size=4, max_model_len=128,
                   attention_backend="torch", progress=False)
    return LLM("tiny", enable_prefix_caching=cache, **{**options, **kw})


def computed(llm):
    """Tokens run through the model over the LLM's lifetime (prompts, recomputed ones, decodes)."""
    return find(llm.get_metrics(), "tokens_computed").value


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def one_by_one(llm, prompts, params=GREEDY):
    return [o for p in prompts for o in llm.generate([p], params, use_tqdm=False)]


@pytest.fixture(scope="module")
def cold():
    llm = make(False)
    outs = one_by_one(llm, PROMPTS)
    return tokens(outs), computed(llm)


def test_requests_one_after_another_reuse_the_system_prompt(cold):
    llm = make(True)
    outs = one_by_one(llm, PROMPTS)
    assert tokens(outs) == cold[0]
    full_blocks = len(SYSTEM) // 4 * 4  # 36 of the 37 system-prompt tokens lie in full blocks
    assert outs[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= full_blocks for o in outs[1:])
    saved = cold[1] - computed(llm)
    assert saved == sum(o.num_cached_tokens for o in outs) >= 7 * full_blocks
    assert llm.engine.policy.hit_rate() > 0.5
    llm.engine.check_invariants(idle=True)


def test_a_cold_batch_computes_the_shared_system_prompt_once(cold):
    llm, plain = make(True), make(False)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)  # all admitted in the first step
    assert tokens(outs) == cold[0] == tokens(plain.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert outs[0].num_cached_tokens == 0, "the first prompt computes the system prompt ..."
    assert all(o.num_cached_tokens >= 36 for o in outs[1:]), "... the others find its blocks in the same step"
    saved = computed(plain) - computed(llm)
    assert saved == sum(o.num_cached_tokens for o in outs)
    llm.engine.check_invariants(idle=True)


def test_a_conversation_reuses_its_earlier_turns_including_the_answers():
    llm, plain = make(True), make(False)
    history, cached = list(SYSTEM), []
    for turn in range(4):
        history += [11, 12, 13 + turn]  # the user's next message
        (out,) = llm.generate([history], GREEDY, use_tqdm=False)
        (ref,) = plain.generate([history], GREEDY, use_tqdm=False)
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        cached.append(out.num_cached_tokens)
        history += out.outputs[0].token_ids
    assert cached[0] == 0 and all(c >= len(SYSTEM) + 20 - 4 for c in cached[1:]), cached
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_outputs_survive_preemption_and_eviction(cold, scheduler, mode):
    llm = make(True, kv_capacity_tokens=112, max_model_len=112, scheduler=scheduler, preemption_mode=mode)
    got = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    stats = llm.engine.stats
    assert stats["preemptions"] >= 3, "the pool was meant to run dry; the test proves nothing"
    assert llm.engine.policy.evictions > 0 and llm.engine.policy.stats["hit_tokens"] > 0
    assert got == cold[0]
    llm.engine.check_invariants(idle=True)


def test_recompute_after_preemption_finds_its_own_blocks_again():
    llm = make(True, kv_capacity_tokens=112, max_model_len=112)
    plain = make(False, kv_capacity_tokens=112, max_model_len=112)
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == tokens(plain.generate(PROMPTS, GREEDY,
                                                                                          use_tqdm=False))
    assert llm.engine.stats["preempted_recompute"] > 0
    assert computed(llm) < computed(plain)


def test_parallel_samples_and_beam_search_are_unchanged():
    sampled = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    beams = BeamSearchParams(beam_width=3, max_tokens=10, ignore_eos=True)
    llm, plain = make(True), make(False)
    for _ in range(2):  # the second round runs on a warm cache
        assert tokens(llm.generate(PROMPTS[:4], sampled, use_tqdm=False)) == tokens(
            plain.generate(PROMPTS[:4], sampled, use_tqdm=False))
        got = [[b.tokens for b in o.sequences] for o in llm.beam_search(PROMPTS[:2], beams)]
        want = [[b.tokens for b in o.sequences] for o in plain.beam_search(PROMPTS[:2], beams)]
        assert got == want
    assert llm.engine.policy.stats["hit_tokens"] > 0
    llm.engine.check_invariants(idle=True)


def test_reset_prefix_cache_makes_the_next_request_cold(cold):
    llm = make(True)
    one_by_one(llm, PROMPTS[:2])
    assert llm.reset_prefix_cache()
    (out,) = llm.generate([PROMPTS[2]], GREEDY, use_tqdm=False)
    assert out.num_cached_tokens == 0 and out.outputs[0].token_ids == cold[0][2][0]
    assert not make(False).reset_prefix_cache(), "no prefix cache, nothing to reset"
    llm.engine.check_invariants(idle=True)


def test_an_interrupted_generate_leaks_nothing_and_leaves_no_unwritten_block_findable(cold):
    llm = make(True)
    forward, calls = llm.engine.model.forward, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        raise KeyboardInterrupt  # as a Ctrl-C in the middle of the first forward pass

    llm.engine.model.forward = interrupted
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS[:3], GREEDY, use_tqdm=False)
    llm.engine.model.forward = forward
    assert calls and llm.engine.policy.num_cached_blocks() == 0, "the promised blocks were never written"
    llm.engine.check_invariants(idle=True)
    outs = llm.generate(PROMPTS[:3], GREEDY, use_tqdm=False)
    assert outs[0].num_cached_tokens == 0 and tokens(outs) == cold[0][:3]


def test_an_interrupted_beam_search_gives_its_blocks_back():
    llm = make(True)
    forward, calls = llm.engine.model.forward, []

    def fails_on_the_third_pass(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return forward(*args, **kwargs)

    llm.engine.model.forward = fails_on_the_third_pass
    with pytest.raises(KeyboardInterrupt):
        llm.beam_search(PROMPTS[:2], BeamSearchParams(beam_width=3, max_tokens=10, ignore_eos=True))
    llm.engine.model.forward = forward
    assert len(calls) == 3
    llm.engine.check_invariants(idle=True)


def test_the_token_budget_counts_only_what_a_request_computes():
    budget = len(SYSTEM) + 20  # room for one cold prompt a step, or several warm ones
    llm, plain = make(True, max_num_batched_tokens=budget), make(False, max_num_batched_tokens=budget)
    batch_sizes = {}
    for name, engine in (("llm", llm), ("plain", plain)):
        engine.generate([SYSTEM + [1]], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
        with engine.engine.metrics.steps.recording() as rec:
            engine.generate(PROMPTS, GREEDY, use_tqdm=False)
        batch_sizes[name] = rec.series("batch_size")
    assert batch_sizes["plain"][0] == 1, "cold, each prompt fills the step's budget alone"
    assert batch_sizes["llm"][0] >= 3, "warm, several prompts fit the budget in one step"


def test_the_batched_backend_agrees(cold):
    llm = make(True, attention_backend="torch_batched")
    assert tokens(one_by_one(llm, PROMPTS)) == cold[0]


def test_bad_configuration_says_what_is_allowed():
    with pytest.raises(ValueError, match="enable_prefix_caching=True needs kv_policy='shared'"):
        LLM("tiny", enable_prefix_caching=True, kv_policy="on_demand", progress=False)
    with pytest.raises(ValueError, match=r"enable_prefix_caching='yes' is not allowed: True or False"):
        LLM("tiny", enable_prefix_caching="yes", kv_policy="shared", progress=False)
    llm = LLM("tiny", kv_policy="prefix_caching", progress=False)  # the same policy by its own name
    assert llm.engine.policy.caches_prefixes


def test_a_bad_request_does_not_disturb_the_cache(cold):
    llm = make(True)
    one_by_one(llm, PROMPTS[:2])
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(PROMPTS, SamplingParams(temperature=-1))
    assert tokens(one_by_one(llm, PROMPTS[2:])) == cold[0][2:]
    llm.engine.check_invariants(idle=True)


@pytest.mark.slow
def test_smollm2_answers_the_same_with_a_cached_system_prompt():
    system = ("You are a patient teacher. Answer in one short sentence, in plain words, and never use "
              "lists. If you do not know, say so. ") * 3
    questions = ["What is a page table?", "Why is the sky blue?", "What does a cache do?"]
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in questions]
    params = SamplingParams(temperature=0, max_tokens=24)
    outs = {}
    for cache in (False, True):
        llm = LLM("smollm2-135m", kv_policy="shared", enable_prefix_caching=cache, kv_capacity_tokens=2048,
                  progress=False)
        outs[cache] = [llm.chat(c, params, use_tqdm=False)[0] for c in chats]
    assert [o.outputs[0].token_ids for o in outs[True]] == [o.outputs[0].token_ids for o in outs[False]]
    assert outs[True][0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= 64 for o in outs[True][1:]), [o.num_cached_tokens for o in outs[True]]


def test_a_fully_cached_block_aligned_prompt_still_gets_its_own_first_token():
    """Prompts of whole blocks, each seen before, come back in one batch beside each other: every one
    must recompute its last token and sample from its own logits, so the outputs are the cold ones.
    A lookup that served a whole prompt from the cache would leave nothing to compute for it, and its
    first token would be taken from some other row of the step's logits."""
    aligned = [SYSTEM[:36], SYSTEM[:32] + [3, 1, 4, 1], [9, 2, 6, 5] * 5]  # 9, 9 and 5 blocks of 4
    plain = make(False)
    want = tokens(plain.generate(aligned, GREEDY, use_tqdm=False))
    llm = make(True)
    one_by_one(llm, aligned)  # warm: every block of every prompt is now cached
    again = llm.generate(aligned[::-1], GREEDY, use_tqdm=False)  # together, in another order
    assert tokens(again) == want[::-1]
    assert [o.num_cached_tokens for o in again] == [len(p) - 4 for p in aligned[::-1]]
    llm.engine.check_invariants(idle=True)
