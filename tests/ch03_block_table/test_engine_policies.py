"""Chapters 01-04 on the model: every KV policy serves the same tokens, and none leaks a block.

The per-request engine of chapter 00 is the oracle. Pooled policies batch several sequences per
forward pass; with the same batch, the math per sequence is identical whatever the physical layout,
so greedy outputs must be equal token for token.
"""

import pytest

from minipaged import LLM, SamplingParams
from minipaged.kv.factory import POLICIES

PROMPTS = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [42] * 20, [100, 200], list(range(30, 70))]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
CONFIGS = [(p, r) for p in POLICIES for r in (["max", "pow2", "oracle"] if p != "on_demand" else ["max"])]


@pytest.fixture(scope="module")
def oracle_outputs():
    llm = LLM("tiny", kv_policy="per_request", max_model_len=256, progress=False)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("policy,reservation", CONFIGS)
def test_same_greedy_tokens_as_per_request(oracle_outputs, policy, reservation):
    llm = LLM("tiny", kv_policy=policy, reservation=reservation, kv_capacity_tokens=4096, max_model_len=256,
              progress=False)
    with llm.engine.metrics.steps.recording() as rec:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == oracle_outputs
    assert max(rec.series("batch_size")) == len(PROMPTS)  # they really ran batched
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("policy,reservation", CONFIGS)
def test_small_pool_queues_requests_and_still_agrees(oracle_outputs, policy, reservation):
    # room for about two max-length reservations: requests must wait for each other
    blocks = {} if policy == "contiguous" else {"block_size": 8}  # the arena's unit is one slot
    llm = LLM("tiny", kv_policy=policy, reservation=reservation, kv_capacity_tokens=512, max_model_len=256,
              progress=False, **blocks)
    with llm.engine.metrics.steps.recording() as rec:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == oracle_outputs
    if policy != "on_demand" and reservation == "max":
        assert max(rec.series("batch_size")) == 2  # two 256-token slabs in 512 slots
    llm.engine.check_invariants(idle=True)


def test_on_demand_preempts_when_the_pool_runs_dry(oracle_outputs):
    llm = LLM("tiny", kv_policy="on_demand", kv_capacity_tokens=96, block_size=4, max_model_len=96,
              progress=False)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.engine.stats["preemptions"] > 0, "the pool was meant to run dry; the test proves nothing"
    assert [o.outputs[0].token_ids for o in outs] == oracle_outputs
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("policy", POLICIES)
def test_request_larger_than_the_pool_is_refused_and_the_rest_served(oracle_outputs, policy):
    options = {} if policy == "contiguous" else {"block_size": 8}
    if policy != "on_demand":  # a reserving policy sets aside prompt + max_tokens; on_demand reserves nothing
        options["reservation"] = "oracle"
    llm = LLM("tiny", kv_policy=policy, kv_capacity_tokens=128, max_model_len=512, progress=False, **options)
    huge = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
    outs = llm.generate([PROMPTS[0], PROMPTS[1]], [huge, GREEDY], use_tqdm=False)
    refused, served = outs[0].outputs[0], outs[1].outputs[0]
    assert refused.finish_reason == "abort" and "pool" in refused.stop_reason and refused.token_ids == []
    assert served.token_ids == oracle_outputs[1] and served.finish_reason == "length"
    assert llm.engine.stats["refused"] == 1
    llm.engine.check_invariants(idle=True)


def test_bad_pool_options_are_value_errors():
    with pytest.raises(ValueError, match="reservation="):
        LLM("tiny", kv_policy="contiguous", reservation="sometimes", progress=False)
    with pytest.raises(ValueError, match="block_size"):
        LLM("tiny", kv_policy="on_demand", block_size=0, progress=False)
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLM("tiny", kv_policy="on_demand", max_num_seqs=0, progress=False)


def test_n_samples_and_seeds_match_per_request():
    params = SamplingParams(n=3, temperature=0.9, seed=11, max_tokens=16, ignore_eos=True)
    ref = LLM("tiny", kv_policy="per_request", progress=False).generate(PROMPTS[:2], params, use_tqdm=False)
    got = LLM("tiny", kv_policy="on_demand", progress=False).generate(PROMPTS[:2], params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in ref]


@pytest.mark.slow
def test_real_model_same_tokens_under_every_policy(real_llm):
    """SmolLM2 on chat prompts, greedy: the pooled engine equals the per-request engine for a sequence
    alone, and every pooled policy gives the same tokens for the same batch."""
    tok = real_llm.tokenizer
    questions = ["What is the capital of France?", "Name three colors.", "Write one line about the sea."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in questions]
    params = SamplingParams(temperature=0, max_tokens=24)
    reference = LLM("smollm2-135m", kv_policy="per_request", progress=False)
    per_request = [reference.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    batched = {}
    for policy in POLICIES:
        llm = LLM("smollm2-135m", kv_policy=policy, kv_capacity_tokens=2048, max_model_len=512, progress=False)
        if policy == "on_demand":
            alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
            assert alone == per_request
        with llm.engine.metrics.steps.recording() as rec:
            batched[policy] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert max(rec.series("batch_size")) == len(prompts)
        llm.engine.check_invariants(idle=True)
    assert all(tokens == batched["on_demand"] for tokens in batched.values()), batched
    assert "Paris" in tok.decode(batched["on_demand"][0])
