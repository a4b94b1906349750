"""Chapter 09 on the model: with speculation on, every request gets the tokens of plain decoding, in
fewer forward passes when the guesses are good, and no block is left behind. The oracles: the same
engine without speculation, and the per-request engine."""

import random

import pytest

from minipaged import LLM, SamplingParams
from minipaged.beam_search import BeamSearchParams
from minipaged.metrics_reader import find

rng = random.Random(9)
PHRASE = [rng.randrange(1, 250) for _ in range(10)]
# prompts that repeat themselves, so prompt lookup has something to copy; and two that do not
PROMPTS = [PHRASE * 3 + [rng.randrange(1, 250) for _ in range(rng.randrange(1, 6))] for _ in range(5)]
PROMPTS += [[rng.randrange(1, 250) for _ in range(rng.randrange(5, 30))] for _ in range(2)]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
SPEC = {"method": "ngram", "num_speculative_tokens": 4}


def make(spec=SPEC, **kw):
    options = dict(kv_policy="on_demand", kv_capacity_tokens=4096, block_size=4, max_model_len=256,
                   max_num_seqs=4, progress=False)
    return LLM("tiny", speculative_config=spec, **{**options, **kw})


def metric(llm, name):
    """A counter's value over the LLM's lifetime."""
    return find(llm.get_metrics(), name).value


def accepted(llm):
    """Guessed tokens the model agreed with, over the LLM's lifetime."""
    return metric(llm, "spec_decode_num_accepted_tokens")


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def plain():
    """The oracle: the per-request engine, one token per forward pass."""
    llm = LLM("tiny", kv_policy="per_request", progress=False, max_model_len=256)
    return tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_speculation_gives_the_tokens_of_plain_decoding_in_fewer_passes(plain, k):
    ref = make(spec=None)
    ref.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm = make(spec={"method": "ngram", "num_speculative_tokens": k})
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == plain
    assert 0 < accepted(llm) <= metric(llm, "spec_decode_num_draft_tokens")
    # every accepted guess is one forward pass less than plain batched decoding needed
    assert metric(llm, "forward_passes") < metric(ref, "forward_passes")
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("policy", ["block_table", "on_demand", "shared", "prefix_caching"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_speculation_under_memory_pressure_keeps_the_tokens(plain, policy, mode):
    # the prefix cache shares the repeated prompts' blocks, so it needs a smaller pool to be pressed
    llm = make(kv_policy=policy, kv_capacity_tokens=96 if policy == "prefix_caching" else 192, preemption_mode=mode,
               **({"reservation": "oracle"} if policy == "block_table" else {}))
    assert tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == plain
    if policy != "block_table":
        assert llm.engine.stats["preemptions"] > 0
    assert accepted(llm) > 0
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_max_tokens_is_never_overshot(max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ref = tokens(make(spec=None).generate(PROMPTS, params, use_tqdm=False))
    out = tokens(make(spec={"method": "ngram", "num_speculative_tokens": 8}).generate(PROMPTS, params, use_tqdm=False))
    assert out == ref and all(len(t[0]) == max_tokens for t in out)


def test_a_stop_token_inside_an_accepted_draft_ends_the_request_there(plain):
    stop = plain[0][0][10]  # a token the first request emits at position 10
    params = SamplingParams(temperature=0, max_tokens=32, stop_token_ids=[stop], ignore_eos=True)
    ref = make(spec=None).generate(PROMPTS, params, use_tqdm=False)
    llm = make()
    out = llm.generate(PROMPTS, params, use_tqdm=False)
    assert tokens(out) == tokens(ref)
    assert out[0].outputs[0].token_ids[-1] == stop and out[0].outputs[0].finish_reason == "stop"
    llm.engine.check_invariants(idle=True)


def test_logprobs_are_those_of_plain_decoding():
    params = SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True)
    ref = make(spec=None).generate(PROMPTS[:3], params, use_tqdm=False)
    llm = make()
    out = llm.generate(PROMPTS[:3], params, use_tqdm=False)
    assert accepted(llm) > 0
    for a, b in zip(ref, out):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].cumulative_logprob == pytest.approx(b.outputs[0].cumulative_logprob, abs=1e-4)
        assert [sorted(d) for d in a.outputs[0].logprobs] == [sorted(d) for d in b.outputs[0].logprobs]


def drafts_by_sequence(monkeypatch):
    """Record the length of every draft the scheduler plans, per sequence id."""
    from minipaged.scheduler.speculative import SpeculativeScheduler

    seen, plain = {}, SpeculativeScheduler._draft

    def spy(self, work):
        draft = plain(self, work)
        seen.setdefault(work.seq.seq_id, []).append(len(draft))
        return draft
    monkeypatch.setattr(SpeculativeScheduler, "_draft", spy)
    return seen


def test_seeded_sampled_requests_speculate_and_keep_their_tokens(monkeypatch):
    """Sample each row with the request's generator and compare with the guess: one draw per emitted
    token, as in plain decoding, so a seeded request gets the same tokens."""
    seen = drafts_by_sequence(monkeypatch)
    params = [SamplingParams(temperature=t, top_p=p, seed=s, max_tokens=24, ignore_eos=True)
              for t, p, s in ((0.05, 1.0, 3), (0.2, 0.9, 4), (1.0, 1.0, 5))]  # cold ones accept guesses
    ref = make(spec=None).generate(PROMPTS[:3], params, use_tqdm=False)
    llm = make()
    out = llm.generate(PROMPTS[:3], params, use_tqdm=False)
    assert tokens(out) == tokens(ref)
    assert accepted(llm) > 0 and all(sum(d) > 0 for d in seen.values())
    llm.engine.check_invariants(idle=True)


def test_samples_that_share_blocks_get_no_drafts(monkeypatch):
    seen = drafts_by_sequence(monkeypatch)
    params = [SamplingParams(n=3, temperature=0.8, seed=2, max_tokens=16, ignore_eos=True), GREEDY]
    ref = make(spec=None, kv_policy="shared").generate(PROMPTS[:2], params, use_tqdm=False)
    out = make(kv_policy="shared").generate(PROMPTS[:2], params, use_tqdm=False)
    assert tokens(out) == tokens(ref)
    forked = {c for o in out[:1] for c in range(len(o.outputs))}
    assert forked and sum(seen.get(min(seen), [])) == 0, "the first request's samples share blocks: no drafts"
    assert sum(seen[max(seen)]) > 0, "the greedy request alone does speculate"


def test_beam_search_is_unchanged():
    params = BeamSearchParams(beam_width=3, max_tokens=8)
    ref = make(spec=None, kv_policy="shared").beam_search([PROMPTS[0]], params)
    out = make(kv_policy="shared").beam_search([PROMPTS[0]], params)
    assert [s.tokens for s in out[0].sequences] == [s.tokens for s in ref[0].sequences]


def test_with_the_prefix_cache_only_right_guesses_are_cached(plain):
    llm = make(kv_policy="shared", enable_prefix_caching=True)
    first = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    assert tokens(first) == plain[:1]
    # the same prompt followed by the answer: a hit on every full block, answer included
    again = llm.generate([PROMPTS[0] + first[0].outputs[0].token_ids], SamplingParams(temperature=0, max_tokens=4,
                                                                                      ignore_eos=True), use_tqdm=False)
    assert again[0].num_cached_tokens == (len(PROMPTS[0]) + 32 - 1) // 4 * 4
    ref = make(spec=None).generate([PROMPTS[0] + first[0].outputs[0].token_ids],
                                   SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert tokens(again) == tokens(ref)
    llm.engine.check_invariants(idle=True)


def test_drafts_stay_within_the_token_budget(monkeypatch):
    from minipaged.scheduler.speculative import SpeculativeScheduler

    steps, plain = [], SpeculativeScheduler.schedule

    def spy(self):
        plan = plain(self)
        steps.append((plan.num_tokens, sum(len(w.draft) for w in plan.work)))
        return plan
    monkeypatch.setattr(SpeculativeScheduler, "schedule", spy)
    llm = make(spec={"method": "ngram", "num_speculative_tokens": 8}, max_num_batched_tokens=6)
    assert tokens(llm.generate(PROMPTS[:4], GREEDY, use_tqdm=False)) == tokens(
        make(spec=None).generate(PROMPTS[:4], GREEDY, use_tqdm=False))
    drafted = [(n, d) for n, d in steps if d]
    assert drafted and all(n <= 6 for n, _ in drafted) and any(n == 6 for n, _ in drafted)


@pytest.mark.parametrize("kwargs, field", [
    ({"kv_policy": "per_request"}, "kv_policy"),
    ({"scheduler": "static"}, "scheduler"),
    ({"enable_chunked_prefill": True}, "enable_chunked_prefill"),
    ({"spec": {"method": "medusa"}}, "method"),
    ({"spec": {"num_speculative_tokens": -1}}, "num_speculative_tokens"),
])
def test_bad_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make(**kwargs)


@pytest.mark.slow
def test_smollm2_answers_the_same_with_speculation():
    """The real model: a request to repeat a list, which prompt lookup guesses well, and a plain one."""
    chats = [[{"role": "user", "content": "Repeat this list exactly: apples, pears, plums, figs, dates, limes."}],
             [{"role": "user", "content": "What is the capital of France?"}]]
    params = SamplingParams(temperature=0, max_tokens=32)
    per_request = LLM("smollm2-135m", kv_policy="per_request", progress=False)
    ref = tokens(per_request.chat(chats, params, use_tqdm=False))
    llm = LLM("smollm2-135m", kv_policy="on_demand", speculative_config=SPEC, attention_backend="torch_batched",
              progress=False)
    assert tokens(llm.chat(chats, params, use_tqdm=False)) == ref
    assert accepted(llm) > 0
    llm.engine.check_invariants(idle=True)
