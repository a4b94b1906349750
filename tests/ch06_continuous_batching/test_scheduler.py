"""Chapter 06 without a model: the schedulers over real KV policies, driven step by step.

``simulate_serving`` is the engine's loop with "one token per scheduled sequence" in place of the
forward pass; every assertion here is about what the scheduler decided.
"""

import pytest

from minipaged.kv import make_policy
from minipaged.kv.swap import SwapSpace
from minipaged.lab.simulator.serving import simulate_serving
from minipaged.lab.simulator.workloads import Request, make_workload
from minipaged.request import Sequence
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import ContinuousScheduler, StaticScheduler, make_scheduler
from minipaged.scheduler import Request as EngineRequest


def seq(seq_id, prompt_len, max_tokens, max_model_len=256):
    return Sequence(seq_id, [1] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    eos_token_id=-1, max_model_len=max_model_len)


def requests(*shapes):
    return [Request(i, 0, p, o, o) for i, (p, o) in enumerate(shapes)]


def test_static_admits_nothing_until_the_whole_batch_is_done():
    # one long and three short requests fit at once; the fifth waits for the batch, not for a slot
    reqs = requests((4, 40), (4, 2), (4, 2), (4, 2), (4, 2))
    policy = make_policy("on_demand", num_slots=4 * 16 * 4, block_size=4, max_model_len=64)
    static = simulate_serving("static", policy, reqs, max_num_seqs=4)
    assert static.first_token_step[4] == static.finish_step[0] + 1  # after the long one, not before
    policy = make_policy("on_demand", num_slots=4 * 16 * 4, block_size=4, max_model_len=64)
    continuous = simulate_serving("continuous", policy, reqs, max_num_seqs=4)
    assert continuous.first_token_step[4] == continuous.finish_step[1] + 1  # the first free place
    assert continuous.steps < static.steps


def test_continuous_keeps_the_batch_full_and_finishes_in_fewer_steps():
    reqs = make_workload("sharegpt", 120, max_model_len=1024, seed=1)
    runs = {}
    for name in ("static", "continuous"):
        policy = make_policy("on_demand", num_slots=16384, block_size=16, max_model_len=1024)
        runs[name] = simulate_serving(name, policy, reqs, max_num_seqs=32)
    assert runs["continuous"].mean_batch > 1.5 * runs["static"].mean_batch
    assert runs["continuous"].steps * 1.5 < runs["static"].steps
    assert sorted(runs["static"].finish_step) == sorted(runs["continuous"].finish_step) == list(range(120))


def test_first_come_first_served_and_max_num_seqs():
    reqs = requests(*[(8, 10)] * 6)
    policy = make_policy("on_demand", num_slots=4096, block_size=4, max_model_len=64)
    run = simulate_serving("continuous", policy, reqs, max_num_seqs=2)
    assert max(run.batch_sizes) == 2
    firsts = [run.first_token_step[i] for i in range(6)]
    assert firsts == sorted(firsts) and firsts[2] > firsts[1]


def test_token_budget_limits_prefill_tokens_per_step():
    reqs = requests(*[(30, 4)] * 5)
    policy = make_policy("on_demand", num_slots=4096, block_size=4, max_model_len=64)
    run = simulate_serving("continuous", policy, reqs, max_num_batched_tokens=64)
    assert max(run.prefill_tokens) <= 64 and run.prefill_tokens[0] == 60  # two prompts, not three
    policy = make_policy("on_demand", num_slots=4096, block_size=4, max_model_len=64)
    alone = simulate_serving("continuous", policy, requests((50, 4)), max_num_batched_tokens=16)
    assert alone.prefill_tokens[0] == 50  # a step with nothing else in it takes the head whole


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("name", ["static", "continuous"])
def test_pressure_preempts_the_newest_and_everything_finishes(name, mode):
    reqs = make_workload("alpaca", 80, max_model_len=256, seed=2)
    policy = make_policy("on_demand", num_slots=512, block_size=8, max_model_len=256)
    run = simulate_serving(name, policy, reqs, preemption_mode=mode, swap_blocks=256 if mode == "swap" else 0)
    assert run.preemptions > 0, "the pool was meant to run dry; the test proves nothing"
    assert run.stats["preempted_" + mode] > 0
    assert sorted(run.finish_step) == list(range(80)) and not run.refused


def test_swap_falls_back_to_recompute_when_the_swap_space_is_full():
    reqs = make_workload("alpaca", 60, max_model_len=256, seed=3)
    policy = make_policy("on_demand", num_slots=512, block_size=8, max_model_len=256)
    run = simulate_serving("continuous", policy, reqs, preemption_mode="swap", swap_blocks=4)
    assert run.stats["swap_fallbacks"] > 0 and run.stats["preempted_recompute"] > 0
    assert sorted(run.finish_step) == list(range(60))


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parallel_samples_under_pressure(mode):
    reqs = make_workload("alpaca", 30, max_model_len=256, seed=4)
    policy = make_policy("shared", num_slots=768, block_size=8, max_model_len=256)
    run = simulate_serving("continuous", policy, reqs, n=3, preemption_mode=mode,
                           swap_blocks=512 if mode == "swap" else 0)
    assert run.preemptions > 0, "the pool was meant to run dry; the test proves nothing"
    assert run.stats["forks"] > 0
    assert sorted(set(run.finish_step) | set(run.refused)) == list(range(30))


def test_a_request_that_can_never_fit_is_refused_and_the_others_run():
    policy = make_policy("on_demand", num_slots=64, block_size=8, max_model_len=256)
    run = simulate_serving("continuous", policy, requests((10, 5), (60, 100), (10, 5)))
    assert run.refused == [1] and sorted(run.finish_step) == [0, 2]


def test_samples_that_could_outgrow_the_pool_together_are_admitted():
    """3 samples of 70 tokens could grow to 3 x 18 blocks, more than the pool's 32, but each fits
    alone: the request is admitted, and a preemption by recompute will split it if it must."""
    policy = make_policy("shared", num_slots=128, block_size=4, max_model_len=128)
    sched = ContinuousScheduler(policy)
    parent = Sequence(0, [1] * 40, SamplingParams(n=3, max_tokens=30), eos_token_id=-1, max_model_len=128)
    children = [Sequence(i, [1] * 40, parent.params, eos_token_id=-1, max_model_len=128, index=i) for i in (1, 2)]
    sched.add(EngineRequest.of(parent, children))
    plan = sched.schedule()
    assert not plan.refused and [w.seq.seq_id for w in plan.work] == [0]


def test_samples_that_do_not_fit_side_by_side_in_an_empty_pool_are_split():
    """Without sharing, 3 samples of a 40-token prompt need 3 x 10 blocks at once; the pool has 24. In
    an empty pool nothing would ever free room, so they become one request each."""
    policy = make_policy("on_demand", num_slots=96, block_size=4, max_model_len=128)
    sched = ContinuousScheduler(policy)
    params = SamplingParams(n=3, max_tokens=8)
    samples = [Sequence(i, [1] * 40, params, eos_token_id=-1, max_model_len=128, index=i) for i in range(3)]
    sched.add(EngineRequest("r", samples[0].prompt_ids, params, samples, seqs=list(samples)))  # side by side
    plan = sched.schedule()
    assert not plan.refused and [w.seq.seq_id for w in plan.work] == [0, 1]  # two fit now, the third waits
    assert [g.num_seqs for g in sched.waiting] == [1]


def test_swap_out_and_in_keep_the_sharing():
    policy = make_policy("shared", num_slots=64, block_size=4, max_model_len=64, watermark=0)
    policy.allocate("a", 10, 8)
    policy.append_slots("a", 10)
    policy.fork("a", "b")
    policy.fork("a", "c")
    policy.append_slots("b", 1)  # b copies the partly filled block on write
    policy.drain_copies()
    before = {s: (policy.num_tokens(s), policy.block_table(s)) for s in "abc"}
    swap = SwapSpace(16, 4)
    out = swap.swap_out({s: policy.detach(s) for s in ["a", "b", "c"]})
    assert len(out) == 4  # blocks 0, 1 (shared by all), a/c's block 2, b's copy: each moved once
    assert policy.num_free_blocks == policy.num_blocks and not policy.seq_ids()
    swap.check_invariants()
    policy.allocate("x", 20, 1)  # someone else takes device blocks meanwhile
    policy.append_slots("x", 20)
    back = dict(swap.swap_in(["a", "b", "c"], policy.attach_swapped(swap.tables_of(["a", "b", "c"]))))
    policy.check_invariants()
    swap.check_invariants()
    assert swap.pool.num_free == 16 and sorted(back) == sorted(cpu for _, cpu in out)
    for s in "abc":
        tokens, table = before[s]
        assert policy.num_tokens(s) == tokens
        moved = {dev: back[cpu] for dev, cpu in out}
        assert policy.block_table(s) == [moved[b] for b in table]  # same structure, new places
    assert policy.block_table("a")[:2] == policy.block_table("b")[:2] == policy.block_table("c")[:2]
    assert policy.ref_count(policy.block_table("a")[0]) == 3


def test_bad_scheduler_options_are_value_errors():
    policy = make_policy("on_demand", num_slots=64, block_size=8)
    with pytest.raises(ValueError, match="scheduler="):
        make_scheduler("round_robin", policy)
    with pytest.raises(ValueError, match="preemption_mode="):
        StaticScheduler(policy, preemption_mode="evict")
    with pytest.raises(ValueError, match="swap space"):
        ContinuousScheduler(policy, preemption_mode="swap")


def test_the_scheduler_plans_slots_the_policy_really_handed_out():
    policy = make_policy("on_demand", num_slots=256, block_size=4, max_model_len=64)
    sched = ContinuousScheduler(policy)
    a, b = seq(0, 6, 3, 64), seq(1, 3, 3, 64)
    sched.add(EngineRequest.of(a))
    sched.add(EngineRequest.of(b))
    plan = sched.schedule()
    assert [(w.seq.seq_id, w.cached, w.num_new) for w in plan.work] == [(0, 0, 6), (1, 0, 3)]
    assert plan.work[0].slots == policy.token_slots(0)
    a.append(5)
    b.append(5)
    plan = sched.schedule()
    assert [(w.seq.seq_id, w.cached, w.num_new) for w in plan.work] == [(0, 6, 1), (1, 3, 1)]
