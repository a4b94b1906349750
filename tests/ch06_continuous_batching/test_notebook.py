"""The chapter's notebook: its hand-written step counts still match the package, and it runs top to bottom."""

import random
from heapq import heappop, heappush
from pathlib import Path

import pytest

from minipaged.kv import make_policy
from minipaged.lab.simulator.serving import simulate_serving
from minipaged.lab.simulator.workloads import Request

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "06_continuous-batching.ipynb"


@pytest.mark.parametrize("seed", range(6))
def test_notebook_step_counts_match_the_schedulers(rederive, seed):
    ns = rederive(NOTEBOOK, heappop=heappop, heappush=heappush)
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 30))]
    batch = rng.randint(1, 8)
    trace = [Request(i, 0, rng.randint(1, 20), n, n) for i, n in enumerate(lengths)]
    for name, by_hand in (("static", ns["steps_static"]), ("continuous", ns["steps_continuous"])):
        policy = make_policy("on_demand", num_slots=1 << 16, block_size=8, max_model_len=128)
        assert simulate_serving(name, policy, trace, max_num_seqs=batch).steps == by_hand(lengths, batch), name


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(run_notebook):
    text = run_notebook(NOTEBOOK)
    assert "same tokens False" not in text and text.count("same tokens True") == 4
    assert "identical greedy outputs across the engine's systems: True" in text
