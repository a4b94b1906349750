"""The trace simulator (introduced with chapter 01): workloads, the step loop, the measured targets."""

import json
import math

import pytest

from minipaged.kv import make_policy
from minipaged.lab.simulator import compare_policies, describe, make_workload, simulate
from minipaged.lab.simulator.cli import DEFAULTS, main


@pytest.fixture(scope="module")
def sharegpt():
    """The trace behind the chapter's figures: the simulate command's defaults."""
    return make_workload("sharegpt", DEFAULTS["num_requests"], arrival_rate=DEFAULTS["arrival_rate"],
                         max_model_len=DEFAULTS["max_model_len"], seed=DEFAULTS["seed"])


@pytest.mark.parametrize("name, mean_in, mean_out", [("sharegpt", 161.31, 337.99), ("alpaca", 19.31, 58.45)])
def test_workload_means_match_the_published_ones(name, mean_in, mean_out):
    stats = describe(make_workload(name, 2000, seed=3))
    assert stats["mean_input"] == pytest.approx(mean_in, rel=0.005)
    assert stats["mean_output"] == pytest.approx(mean_out, rel=0.005)
    assert stats["median_output"] < mean_out  # heavy right tail: the mean sits above the median


def test_workloads_are_seeded_and_respect_max_model_len():
    a = make_workload("sharegpt", 300, arrival_rate=0.5, seed=7, max_model_len=1024)
    assert a == make_workload("sharegpt", 300, arrival_rate=0.5, seed=7, max_model_len=1024)
    assert a != make_workload("sharegpt", 300, arrival_rate=0.5, seed=8, max_model_len=1024)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.final_len <= 1024 for r in a)
    assert all(r.max_tokens == r.output_len for r in a)


def test_poisson_arrivals_follow_the_rate():
    trace = make_workload("alpaca", 4000, arrival_rate=2.0, seed=1)
    assert describe(trace)["last_arrival_step"] == pytest.approx(2000, rel=0.1)
    assert [r.arrival_step for r in trace] == sorted(r.arrival_step for r in trace)
    assert all(r.arrival_step == 0 for r in make_workload("alpaca", 50, arrival_rate=math.inf))


@pytest.mark.parametrize("kwargs, field", [
    (dict(name="lmsys"), "workload"), (dict(num_requests=0), "num_requests"),
    (dict(arrival_rate=0), "arrival_rate"), (dict(max_model_len=1), "max_model_len"),
])
def test_workload_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=field):
        make_workload(**kwargs)


def test_contiguous_max_utilization_matches_the_paper_range(sharegpt):
    policy = make_policy("contiguous", num_slots=DEFAULTS["capacity"], max_model_len=2048, reservation="max")
    result = simulate(policy, sharegpt)
    assert 0.20 <= result.utilization <= 0.40  # the vLLM paper: 20.4-38.2% for reserving systems
    assert result.utilization_basis == "loaded" and result.loaded_steps > 0.9 * result.steps
    assert result.finished == len(sharegpt) and not result.refused
    assert result.max_concurrent == DEFAULTS["capacity"] // 2048
    assert policy.seq_ids() == [] and policy.usage().free == policy.num_slots  # all given back


def test_variable_slabs_are_refused_despite_enough_free_memory(sharegpt):
    oracle = simulate(make_policy("contiguous", num_slots=16384, reservation="oracle"), sharegpt[:300])
    assert oracle.fragmentation_blocked_steps > 0
    assert oracle.mean_usage["external"] > 0.02


def test_utilization_is_the_time_average_over_loaded_steps():
    trace = make_workload("sharegpt", 150, arrival_rate=0.05, seed=2)
    result = simulate(make_policy("contiguous", num_slots=8192, reservation="pow2"), trace, record_history=True)
    loaded = [record.usage.utilization for record in result.history if record.waiting]
    assert 0 < len(loaded) == result.loaded_steps < len(result.history)  # light load: some steps idle
    assert result.utilization == pytest.approx(sum(loaded) / len(loaded))
    assert result.peak_utilization == pytest.approx(max(r.usage.utilization for r in result.history))


def test_requests_that_can_never_fit_are_refused_with_a_reason():
    trace = make_workload("alpaca", 20, seed=0)
    result = simulate(make_policy("contiguous", num_slots=1000, max_model_len=2048, reservation="max"), trace)
    assert len(result.refused) == 20 and result.finished == 0
    assert "can never fit" in result.refused[0][1]


def test_compare_policies_runs_each_on_the_same_trace():
    trace = make_workload("alpaca", 200, seed=0)
    results = compare_policies(trace, [("contiguous", "max"), ("contiguous", "oracle")], capacity=4096,
                               max_model_len=512)
    assert [r.policy for r in results] == ["contiguous(max)", "contiguous(oracle)"]
    assert results[1].utilization > results[0].utilization


def test_cli_json_has_the_promised_fields(capsys):
    assert main(["--json", "--policy", "contiguous", "on_demand", "--reservation", "max",
                 "--num-requests", "200", "--capacity", "8192"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"contiguous(max)", "on_demand"}
    for summary in out["policies"].values():
        assert {"utilization", "max_concurrent", "refused"} <= set(summary)
    assert out["workload"]["num_requests"] == 200


def test_cli_table_and_bad_options(capsys):
    assert main(["--policy", "block_table", "--reservation", "oracle", "--num-requests", "100",
                 "--workload", "alpaca", "--capacity", "4096"]) == 0
    assert "block_table(oracle)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--capacity", "0"])
    with pytest.raises(SystemExit):
        main(["--policy", "nope"])
