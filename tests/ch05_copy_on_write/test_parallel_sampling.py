"""Parallel sampling on the model with the "shared" policy: prefill once, fork n - 1 times.

The oracle: n separate requests, one per sample, each seeded with the seed the engine derives for
that sample (``sample_seed(seed, index)``), run by chapter 00's per-request engine.
"""

import pytest

from minipaged import LLM, SamplingParams
from minipaged.metrics_reader import find
from minipaged.sampling import sample_seed

PROMPTS = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [42] * 20, list(range(30, 70))]


def outputs(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def per_request():
    return LLM("tiny", kv_policy="per_request", max_model_len=256, progress=False)


def shared_llm(**kw):
    options = dict(kv_policy="shared", kv_capacity_tokens=4096, max_model_len=256, block_size=8, progress=False)
    return LLM("tiny", **{**options, **kw})


def test_n_samples_equal_separate_requests_with_the_derived_seeds(per_request):
    params = SamplingParams(n=4, temperature=0.9, seed=11, max_tokens=24, ignore_eos=True)
    llm = shared_llm()
    got = outputs(llm.generate(PROMPTS, params, use_tqdm=False))
    separate = [[per_request.generate([prompt], SamplingParams(temperature=0.9, seed=sample_seed(11, i), max_tokens=24,
                                                               ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids
                 for i in range(4)] for prompt in PROMPTS]
    assert got == separate
    assert len({tuple(t) for t in got[0]}) == 4  # the samples really differ
    assert outputs(shared_llm().generate(PROMPTS, params, use_tqdm=False)) == got  # reproducible
    llm.engine.check_invariants(idle=True)


def test_the_prompt_is_prefilled_once_and_its_blocks_are_shared(per_request):
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    shared, unshared = shared_llm(), LLM("tiny", kv_policy="on_demand", kv_capacity_tokens=4096,
                                         max_model_len=256, block_size=8, progress=False)
    with shared.engine.metrics.steps.recording() as rec:
        a = shared.generate(PROMPTS, params, use_tqdm=False)
    b = unshared.generate(PROMPTS, params, use_tqdm=False)
    assert outputs(a) == outputs(b)
    prompt_tokens = sum(len(p) for p in PROMPTS)
    decode_tokens = len(PROMPTS) * 3 * (12 - 1)  # the first token comes from the prefill's logits
    assert find(shared.get_metrics(), "tokens_computed").value == prompt_tokens + decode_tokens
    assert find(unshared.get_metrics(), "tokens_computed").value == 3 * prompt_tokens + decode_tokens
    assert shared.engine.stats["forks"] == 2 * len(PROMPTS)
    # a prompt that ends in a partly filled block: each fork copies that block on its first write
    partial = sum(len(p) % 8 != 0 for p in PROMPTS)
    assert find(shared.get_metrics(), "block_copies").value == 2 * partial
    physical, logical = rec.series("blocks_physical"), rec.series("blocks_logical")
    assert len(physical) == len(logical) > 0
    assert all(p <= q for p, q in zip(physical, logical))
    assert sum(physical) < sum(logical)
    shared.engine.check_invariants(idle=True)


@pytest.mark.parametrize("case", ["stop_string", "stop_token", "max_tokens_1", "eos"])
def test_nothing_leaks_when_samples_end_early(per_request, case):
    base = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=30, ignore_eos=True)
    probe = per_request.generate(PROMPTS[1], base, use_tqdm=False)[0].outputs
    if case == "stop_string":
        params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=30, ignore_eos=True, stop=probe[1].text[3])
    elif case == "stop_token":
        params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=30, ignore_eos=True,
                                stop_token_ids=[probe[2].token_ids[4]])
    elif case == "max_tokens_1":  # the parent finishes on the token sampled right after the fork
        params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=1)
    else:  # EOS: make it the token sample 0 picks fifth
        params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=30)
    llm = shared_llm()
    if case == "eos":
        eos, original = probe[0].token_ids[4], per_request.tokenizer.eos_token_id
        llm.tokenizer.eos_token_id = per_request.tokenizer.eos_token_id = eos
        try:
            got = llm.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs
            ref = per_request.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs
        finally:
            llm.tokenizer.eos_token_id = per_request.tokenizer.eos_token_id = original
    else:
        got = llm.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs
        ref = per_request.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs
    def summary(outs):
        return [(c.token_ids, c.text, c.finish_reason) for c in outs]

    assert summary(got) == summary(ref)
    if case != "max_tokens_1":
        assert any(c.finish_reason == "stop" and len(c.token_ids) < 30 for c in got), "nothing ended early"
    llm.engine.check_invariants(idle=True)


def test_a_refused_request_with_n_samples_leaks_nothing_and_the_rest_are_served(per_request):
    llm = shared_llm(kv_capacity_tokens=128, max_model_len=512)
    huge = SamplingParams(n=4, temperature=0, max_tokens=300, ignore_eos=True)
    fine = SamplingParams(n=2, temperature=0.7, seed=1, max_tokens=10, ignore_eos=True)
    outs = llm.generate([PROMPTS[0], PROMPTS[1]], [huge, fine], use_tqdm=False)
    assert [c.finish_reason for c in outs[0].outputs] == ["abort"] * 4
    assert all("refused" in c.stop_reason and c.token_ids == [] for c in outs[0].outputs)
    assert outputs(outs[1:]) == outputs(per_request.generate([PROMPTS[1]], fine, use_tqdm=False))
    assert llm.engine.stats["refused"] == 1  # one request (of four samples)
    llm.engine.check_invariants(idle=True)


def test_a_small_pool_preempts_samples_and_still_agrees(per_request):
    params = SamplingParams(n=3, temperature=0.8, seed=9, max_tokens=24, ignore_eos=True)
    llm = shared_llm(kv_capacity_tokens=96, block_size=4, max_model_len=96)
    got = outputs(llm.generate(PROMPTS[:3], params, use_tqdm=False))
    assert llm.engine.stats["preemptions"] > 0, "the pool was meant to run dry; the test proves nothing"
    assert got == outputs(per_request.generate(PROMPTS[:3], params, use_tqdm=False))
    llm.engine.check_invariants(idle=True)


def test_without_a_sharing_policy_the_samples_run_as_independent_sequences():
    """A policy that cannot share blocks (on_demand) cannot fork: the n samples of a request are n
    sequences, each prefilled on its own, and they give the same seeded outputs as the forks do."""
    params = SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=10, ignore_eos=True)
    prompt = PROMPTS[1]
    unshared = LLM("tiny", kv_policy="on_demand", kv_capacity_tokens=4096, max_model_len=256, block_size=8,
                   progress=False)
    got = outputs(unshared.generate([prompt], params, use_tqdm=False))
    assert unshared.engine.stats.get("forks", 0) == 0
    # the prompt is computed once per sample; each sample's first token comes from its own prefill
    assert find(unshared.get_metrics(), "tokens_computed").value == 3 * len(prompt) + 3 * (10 - 1)
    assert len({tuple(t) for t in got[0]}) == 3  # three samples, really drawn apart
    shared = shared_llm()
    assert outputs(shared.generate([prompt], params, use_tqdm=False)) == got
    assert shared.engine.stats["forks"] == 2  # the same request forks under a sharing policy
    unshared.engine.check_invariants(idle=True)


@pytest.mark.slow
def test_real_model_n_samples_equal_separate_requests(real_llm):
    tok = real_llm.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Give me a name for a cat."}])
    params = SamplingParams(n=3, temperature=0.8, seed=4, max_tokens=16)
    llm = LLM("smollm2-135m", kv_policy="shared", kv_capacity_tokens=2048, max_model_len=512, progress=False)
    per_request = LLM("smollm2-135m", kv_policy="per_request", max_model_len=512, progress=False)
    got = [c.token_ids for c in llm.generate(prompt, params, use_tqdm=False)[0].outputs]
    separate = [per_request.generate(prompt, SamplingParams(temperature=0.8, seed=sample_seed(4, i), max_tokens=16),
                                  use_tqdm=False)[0].outputs[0].token_ids for i in range(3)]
    assert got == separate
    assert llm.engine.stats["forks"] == 2
    llm.engine.check_invariants(idle=True)
