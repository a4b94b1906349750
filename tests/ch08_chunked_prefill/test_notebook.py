"""The chapter's notebook: its hand-written step planner still matches the scheduler, and it runs top to bottom."""

import random
from pathlib import Path

import pytest

from minipaged.lab.simulator.workloads import Request

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "08_chunked-prefill.ipynb"


@pytest.mark.parametrize("seed", range(8))
def test_notebook_planner_matches_the_scheduler(rederive, seed):
    cells = rederive(NOTEBOOK)
    plan_by_hand = cells["plan_by_hand"]
    rng = random.Random(seed)
    requests = [Request(i, 0, rng.randint(1, 60), rng.randint(1, 10), 10) for i in range(rng.randint(1, 12))]
    max_num_seqs = rng.randint(1, 5)
    budget = max_num_seqs + rng.randint(0, 20)
    # the notebook's own driver would also work, but here the scheduler is driven independently
    from minipaged.kv import make_policy
    from minipaged.lab.simulator.runner import SyntheticRunner
    from minipaged.request import Sequence
    from minipaged.sampling_params import SamplingParams
    from minipaged.scheduler import Request as EngineRequest
    from minipaged.scheduler import make_scheduler

    policy = make_policy("on_demand", num_slots=4096, block_size=4, max_model_len=128)
    sched = make_scheduler("continuous", policy, enable_chunked_prefill=True, max_num_batched_tokens=budget,
                           max_num_seqs=max_num_seqs)
    for r in requests:
        sched.add(EngineRequest.of(Sequence(r.request_id, [1] * r.prompt_len,
                                      SamplingParams(max_tokens=r.output_len, ignore_eos=True),
                                      eos_token_id=-1, max_model_len=128)))
    steps = 0
    while sched.has_work():
        running = [(s.seq_id, s.num_tokens - policy.num_tokens(s.seq_id)) for g in sched.running for s in g.seqs]
        waiting = [(g.seqs[0].seq_id, g.seqs[0].num_tokens) for g in sched.waiting]
        expected = plan_by_hand(running, waiting, budget, max_num_seqs)
        plan = sched.schedule()
        assert {w.seq.seq_id: w.num_new for w in plan.work} == expected
        sched.update_from_output(plan, SyntheticRunner().execute(plan), 0.0)  # token 7 for each completed one
        steps += 1
    assert steps >= len(requests)


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(run_notebook):
    text = run_notebook(NOTEBOOK)
    assert "the planner by hand agrees at every step: True" in text
    assert "same tokens: True" in text
    assert "most tokens in one step: 62 whole, 8 chunked" in text
    assert "16 tokens have slots -> 4 blocks findable" in text
    assert "p99 vs whole" in text
