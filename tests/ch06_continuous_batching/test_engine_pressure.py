"""Chapter 06 on the model: outputs under memory pressure equal the unpressured run, token for token.

A KV pool so small that requests are preempted again and again, by recompute and by swap, under both
schedulers. Each test counts the preemptions, so it cannot pass by never preempting. The oracle is
the same engine with a pool large enough that nothing is ever preempted.
"""

import pytest

from minipaged import LLM, SamplingParams
from minipaged.metrics_reader import find

PROMPTS = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [42] * 20, [100, 200], list(range(30, 70)), [5] * 9, [9, 8, 7, 6]]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
SAMPLED = SamplingParams(n=3, temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def unpressured():
    llm = LLM("tiny", kv_policy="shared", kv_capacity_tokens=8192, block_size=4, max_model_len=128, progress=False)
    greedy = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert llm.engine.stats["preemptions"] == 0
    sampled = tokens(llm.generate(PROMPTS[:4], SAMPLED, use_tqdm=False))
    assert llm.engine.stats["preemptions"] == 0
    return greedy, sampled


@pytest.mark.parametrize("scheduler", ["continuous", "static"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("policy", ["on_demand", "shared"])
def test_greedy_outputs_survive_preemption(unpressured, scheduler, mode, policy):
    llm = LLM("tiny", kv_policy=policy, kv_capacity_tokens=96, block_size=4, max_model_len=96, scheduler=scheduler,
              preemption_mode=mode, progress=False)
    got = tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    stats = llm.engine.stats
    assert stats["preemptions"] >= 5, "the pool was meant to run dry many times; the test proves nothing"
    assert stats["preempted_" + mode] > 0
    if mode == "swap":
        assert stats["blocks_swapped_out"] > 0 and stats["blocks_swapped_in"] == stats["blocks_swapped_out"]
    assert got == unpressured[0]
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parallel_samples_survive_preemption(unpressured, mode):
    llm = LLM("tiny", kv_policy="shared", kv_capacity_tokens=112, block_size=4, max_model_len=112,
              preemption_mode=mode, progress=False)
    got = tokens(llm.generate(PROMPTS[:4], SAMPLED, use_tqdm=False))
    stats = llm.engine.stats
    assert stats["preemptions"] > 0 and stats["preempted_" + mode] > 0, "no preemption: the test proves nothing"
    assert stats["forks"] > 0
    assert got == unpressured[1]
    llm.engine.check_invariants(idle=True)


def test_swap_moves_a_shared_block_once():
    llm = LLM("tiny", kv_policy="shared", kv_capacity_tokens=112, block_size=4, max_model_len=112,
              preemption_mode="swap", progress=False)
    space, policy, calls = llm.engine.swap_space, llm.engine.policy, []
    swap_out = space.swap_out

    def recording(tables):
        listed = sum(len(t.blocks) for t in tables.values())
        distinct = len({b for t in tables.values() for b in t.blocks})
        copies = swap_out(tables)
        calls.append((len(tables), listed, distinct, len(copies)))
        return copies

    space.swap_out = recording
    llm.generate(PROMPTS[:4], SAMPLED, use_tqdm=False)
    assert calls, "nothing was swapped out; the test proves nothing"
    assert all(copies == distinct for _, _, distinct, copies in calls)
    assert any(n > 1 and copies < listed for n, listed, _, copies in calls), calls  # shared blocks moved once
    llm.engine.check_invariants(idle=True)
    assert policy.num_free_blocks == policy.num_blocks


def test_static_batches_run_smaller_than_continuous_ones():
    lengths = [40, 2, 2, 2, 30, 2, 2, 2]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    prompts = [[i + 1] * 5 for i in range(len(lengths))]
    runs = {}
    for name in ("static", "continuous"):
        llm = LLM("tiny", kv_policy="on_demand", kv_capacity_tokens=1024, block_size=4, max_model_len=128,
                  max_num_seqs=4, scheduler=name, progress=False)
        with llm.engine.metrics.steps.recording() as rec:
            outs = tokens(llm.generate(prompts, params, use_tqdm=False))
        runs[name] = (outs, find(llm.get_metrics(), "forward_passes").value, rec.series("batch_size"))
        llm.engine.check_invariants(idle=True)
    assert runs["static"][0] == runs["continuous"][0]
    (_, static_passes, static_sizes), (_, continuous_passes, continuous_sizes) = runs["static"], runs["continuous"]
    assert continuous_passes < static_passes
    assert len(static_sizes) == static_passes and len(continuous_sizes) == continuous_passes  # a record per step
    mean = {"s": sum(static_sizes) / len(static_sizes), "c": sum(continuous_sizes) / len(continuous_sizes)}
    assert mean["c"] > mean["s"]


def test_request_metrics_are_filled_in_order():
    llm = LLM("tiny", kv_policy="on_demand", kv_capacity_tokens=1024, block_size=4, max_model_len=128, progress=False)
    out = llm.generate(PROMPTS[:3], GREEDY, use_tqdm=False)
    for o in out:
        m = o.metrics
        assert m["arrival_time"] <= m["first_token_time"] <= m["finished_time"]


def test_bad_scheduling_options_name_the_field():
    for kwargs, field in [({"scheduler": "fifo"}, "scheduler="), ({"preemption_mode": "kill"}, "preemption_mode="),
                          ({"max_num_batched_tokens": 0}, "max_num_batched_tokens="),
                          ({"swap_space_tokens": -1}, "swap_space_tokens="),
                          ({"preemption_mode": "swap", "swap_space_tokens": 0}, "swap_space_tokens="),
                          ({"watermark": 1.5}, "watermark"),
                          ({"kv_policy": "contiguous", "preemption_mode": "swap"}, "block-table policy")]:
        with pytest.raises(ValueError, match=field):
            LLM("tiny", **{"kv_policy": "on_demand", "progress": False, **kwargs})


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_beam_search_survives_preemption(mode):
    from minipaged.beam_search import BeamSearchParams

    params = BeamSearchParams(beam_width=3, max_tokens=16, ignore_eos=True)
    roomy = LLM("tiny", kv_policy="shared", kv_capacity_tokens=8192, block_size=4, max_model_len=96, progress=False)
    want = [[s.tokens for s in o.sequences] for o in roomy.beam_search(PROMPTS[:4], params)]
    assert roomy.engine.stats["preemptions"] == 0
    small = LLM("tiny", kv_policy="shared", kv_capacity_tokens=96, block_size=4, max_model_len=96,
                preemption_mode=mode, progress=False)
    got = [[s.tokens for s in o.sequences] for o in small.beam_search(PROMPTS[:4], params)]
    stats = small.engine.stats
    assert stats["preemptions"] > 0, "the pool was meant to run dry; the test proves nothing"
    if mode == "swap":
        assert stats.get("preempted_swap", 0) > 0 and stats["blocks_swapped_in"] > 0
    assert got == want
    small.engine.check_invariants(idle=True)


@pytest.mark.slow
def test_real_model_outputs_survive_preemption(real_llm):
    prompts = [real_llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in
               ("What is a page table?", "Name three colors.", "Why is the sky blue?", "Count to five.")]
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in real_llm.generate(prompts, greedy, use_tqdm=False)]
    for mode in ("recompute", "swap"):
        llm = LLM("smollm2-135m", kv_policy="on_demand", kv_capacity_tokens=160, block_size=16, max_model_len=160,
                  preemption_mode=mode, progress=False)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        assert llm.engine.stats["preemptions"] >= 3, "the pool was meant to run dry; the test proves nothing"
        assert llm.engine.stats["preempted_" + mode] > 0
        assert got == want, mode
        llm.engine.check_invariants(idle=True)
