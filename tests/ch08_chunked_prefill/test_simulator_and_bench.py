"""Chapter 08's measurements on small inputs: the model-free simulation (``simulate --chunked``) and the
benchmark (``bench chunked``) on the tiny model. The real-model figures come from the commands."""

import json
import math

import pytest

from minipaged.cli import main
from minipaged.kv import make_policy
from minipaged.lab.bench import chunked as bench
from minipaged.lab.simulator.chunked import costs, make_chunked_workload, simulate_chunked
from minipaged.lab.simulator.serving import simulate_serving
from minipaged.lab.simulator.workloads import Request

TRACE = make_chunked_workload(24, long_every=4, long_len=(300, 400), short_len=(4, 24), output_len=(8, 24), seed=3)
OVERHEAD = 10


@pytest.fixture(scope="module")
def rows():
    return simulate_chunked(TRACE, [128, 32], step_overhead=OVERHEAD, max_num_seqs=8, capacity=8192,
                            max_model_len=512, long_from=300)


def test_the_trace_is_seeded_and_mixes_documents_with_chat():
    assert make_chunked_workload(24, long_every=4, long_len=(300, 400), short_len=(4, 24), output_len=(8, 24),
                                 seed=3) == TRACE
    docs = [r for r in TRACE if r.prompt_len >= 300]
    assert [r.request_id for r in docs] == [3, 7, 11, 15, 19, 23]
    assert all(4 <= r.prompt_len <= 24 for r in TRACE if r not in docs)
    with pytest.raises(ValueError, match="long_every"):
        make_chunked_workload(8, long_every=0)


def test_no_chunked_step_goes_over_its_budget_and_the_waits_shrink(rows):
    whole, big, small = rows
    assert whole["max_step_tokens"] > 300 and big["max_step_tokens"] == 128 and small["max_step_tokens"] == 32
    # a decode waits for one step: at most the budget and the overhead, with chunks
    assert big["itl_max"] <= 128 + OVERHEAD and small["itl_max"] <= 32 + OVERHEAD
    assert whole["itl_max"] > 300 and whole["itl_p99"] > big["itl_p99"] > small["itl_p99"]
    # the price: more steps, each paying the overhead again, and later first tokens for the documents
    assert whole["steps"] < big["steps"] < small["steps"]
    assert whole["total"] < big["total"] < small["total"]
    assert small["ttft_long_p50"] > whole["ttft_long_p50"]


def test_every_system_computes_the_same_tokens(rows):
    assert len({sum(r["step_tokens"]) for r in rows}) == 1
    assert sum(rows[0]["step_tokens"]) == sum(r.prompt_len + r.output_len - 1 for r in TRACE)


def test_the_cost_model_by_hand():
    """Two requests, budget 4, overhead 1: request 0 (prompt 6) takes steps 1-2, request 1 (prompt 2)
    joins in step 2. Steps: [4 prompt] [2 prompt + 2 prompt] [2 decodes] ... each costs 1 + its tokens."""
    reqs = [Request(0, 0, 6, 3, 3), Request(1, 0, 2, 2, 2)]
    policy = make_policy("on_demand", num_slots=64, block_size=2, max_model_len=16)
    run = simulate_serving("continuous", policy, reqs, max_num_seqs=4, max_num_batched_tokens=4,
                           enable_chunked_prefill=True)
    assert run.step_tokens == [4, 4, 2, 1] and run.decodes == [0, 0, 2, 1]
    c = costs(run, reqs, step_overhead=1)
    assert c["total"] == 5 + 5 + 3 + 2
    assert c["itl_max"] == 3 and c["itl_p50"] == 3  # the decode gaps: steps 3, 3 and 4 cost 3, 3, 2
    assert run.first_token_step == {0: 2, 1: 2}


def test_simulate_chunked_prints_a_table_json_and_plots(capsys, tmp_path):
    assert main(["simulate", "--chunked", "--num-requests", "24", "--budgets", "256", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["budget"] for r in out["rows"]] == [None, 256, 64] and out["config"]["step_overhead"] == 55
    assert out["config"]["capacity"] == 65536  # chunked's own default, not the policies' 32768
    assert main(["simulate", "--chunked", "--num-requests", "24", "--budgets", "64", "--capacity", "4096",
                 "--json"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["config"]["capacity"] == 4096
    assert max(r["steps"] for r in small["rows"]) > max(r["steps"] for r in out["rows"][::2])  # memory binds now
    with pytest.raises(SystemExit, match="cannot hold the trace's longest request"):
        main(["simulate", "--chunked", "--num-requests", "24", "--budgets", "64", "--capacity", "64"])
    assert main(["simulate", "--chunked", "--num-requests", "24", "--budgets", "64", "--step-overhead", "0",
                 "--plot-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "p99 vs whole" in text and "overhead of 0" in text
    assert (tmp_path / "chunked_steps.png").stat().st_size > 10_000
    assert (tmp_path / "chunked_budget_sweep.png").stat().st_size > 10_000


def test_simulate_chunked_refuses_a_budget_below_max_num_seqs():
    with pytest.raises(SystemExit, match="max_num_seqs"):
        main(["simulate", "--chunked", "--budgets", "8"])


def test_the_step_cost_fit_by_hand():
    a, b = bench.fit_line([(0, 1.0), (10, 2.0), (20, 3.0)])
    assert a == pytest.approx(1.0) and b == pytest.approx(0.1)


def test_bench_chunked_on_the_tiny_model(tmp_path):
    shape = dict(long_every=3, long_len=(200, 260), short_len=(4, 20), output_len=(6, 12))
    r = bench.run("tiny", requests=9, budgets=(16,), max_num_seqs=4, repeats=2, progress=False,
                  plot_dir=str(tmp_path), shape=shape)
    whole, chunked = r["systems"]["whole prefills"], r["systems"]["chunked 16"]
    assert r["identical_outputs"] and r["documents"] == 3
    assert chunked["max_step_tokens"] == 16 < whole["max_step_tokens"] and chunked["steps"] > whole["steps"]
    cost = r["step_cost"]  # a fit to timings: its sign is the machine's business, not this test's
    assert all(isinstance(cost[k], float) and math.isfinite(cost[k]) for k in ("overhead_s", "per_token_s"))
    text = bench.format_result(r)
    assert "chunked 16: ITL p99" in text and "identical outputs, token for token, in every run: yes" in text
    assert all((tmp_path / name).stat().st_size > 10_000 for name in ("chunked_itl.png", "chunked_step_cost.png"))


def test_bench_chunked_refuses_a_budget_below_max_num_seqs():
    with pytest.raises(ValueError, match="max_num_seqs"):
        bench.run("tiny", budgets=(2,), max_num_seqs=4)
