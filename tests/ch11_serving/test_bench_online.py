"""``python -m minipaged bench online``: the open-loop load generator against three real servers
(static + contiguous, Orca, paged), on the tiny model with a handful of requests."""

import json
import math

import pytest

from minipaged.bench import online

RATES = (20.0, 80.0)
REQUESTS = 6


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    plot_dir = tmp_path_factory.mktemp("online")
    return online.run(model="tiny", rates=RATES, requests=REQUESTS, scale=0.1, max_model_len=128, max_num_seqs=8,
                      kv_capacity=768, drain=30.0, progress=False, plot_dir=str(plot_dir))


def test_poisson_arrivals_are_seeded_and_stretch_with_the_rate():
    slow, fast = online.poisson_arrivals(50, 1.0, seed=3), online.poisson_arrivals(50, 4.0, seed=3)
    assert slow[0] == 0 and all(b > a for a, b in zip(slow, slow[1:]))
    assert fast == pytest.approx([t / 4 for t in slow])
    assert online.poisson_arrivals(50, 1.0, seed=4) != slow
    assert 20 < slow[-1] < 100  # 49 gaps of mean 1 s
    assert online.poisson_arrivals(3, math.inf) == [0.0, 0.0, 0.0]


def test_three_systems_every_request_gets_exactly_its_tokens(result):
    assert [s["key"] for s in result["systems"]] == ["static", "orca", "paged"]
    assert result["rates"] == list(RATES)
    for s in result["systems"]:
        assert s["server_returncode"] == 0  # a clean SIGTERM: every block back in the pool
        assert [run["rate"] for run in s["runs"]] == list(RATES)
        for run in s["runs"]:
            assert run["finished"] == run["requests"] == REQUESTS and run["unfinished"] == 0 and not run["errors"]
            for req in run["per_request"]:
                assert req["status"] == "ok"
                assert req["output_tokens"] == req["expected_tokens"] >= 1  # from the usage chunk
                assert req["chunks"] >= 1 and 0 < req["ttft_s"] <= req["e2e_s"]
            assert run["output_tokens"] == result["output_tokens"]


def test_latencies_are_positive_and_ordered_and_rates_finite(result):
    for s in result["systems"]:
        for run in s["runs"]:
            for name in ("ttft", "itl", "e2e"):
                p50, p99 = run[f"{name}_p50_s"], run[f"{name}_p99_s"]
                assert 0 < p50 <= p99, (s["system"], name)
            assert run["ttft_p50_s"] <= run["e2e_p50_s"] and run["ttft_p99_s"] <= run["e2e_p99_s"]
            assert 0 < run["normalized_latency_s"] <= run["e2e_p99_s"]
            for name in ("requests_per_s", "output_tokens_per_s", "goodput_requests_per_s", "duration_s"):
                assert math.isfinite(run[name]) and run[name] > 0, name
            assert run["goodput_requests_per_s"] <= run["requests_per_s"]
            assert run["slo_met"] <= run["finished"]
            assert run["cap_s"] > run["duration_s"]  # nothing was cut off
            assert isinstance(run["sustained"], bool)
        assert s["sustained_rate"] in (None, *RATES)
        assert s["threshold_s_per_token"] == pytest.approx(
            result["sustain_factor"] * s["runs"][0]["normalized_latency_s"])


def test_overhead_section_and_outputs(result, tmp_path):
    o = result["overhead"]
    assert o["server_output_tokens_per_s"] > 0 and o["offline_output_tokens_per_s"] > 0
    assert o["ratio"] == pytest.approx(o["server_output_tokens_per_s"] / o["offline_output_tokens_per_s"])
    assert o["server_finished"] == REQUESTS and o["target"] == 0.9 and isinstance(o["meets_target"], bool)
    assert o["same_text_as_offline"] == REQUESTS  # greedy: the server answers what generate does
    assert set(result["probe"]) == {"before", "after", "reliable"} and result["probe"]["before"]["gflops"] > 0
    assert set(result["ratios"]) >= {"paged_vs_static_sustained_rate", "paged_vs_orca_sustained_rate"}
    text = online.format_result(result)
    for label in ("static + contiguous", "Orca: continuous + contiguous", "vLLM: continuous + paged",
                  "server overhead", "SLO", "GEMM probe", "after its last arrival"):
        assert label in text
    json.dumps(result)  # --json prints it as is
    (path,) = result["plots"]
    assert path.endswith("online_latency.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_rate_is_sustained_until_the_systems_own_latency_doubles():
    def system(key, latencies, finished=None):
        finished = finished or [4] * len(latencies)
        return {"key": key, "runs": [{"rate": rate, "normalized_latency_s": x, "finished": f, "requests": 4,
                                      "goodput_requests_per_s": 1.0}
                                     for rate, x, f in zip((1.0, 2.0, 4.0, 8.0), latencies, finished)]}

    systems = [system("static", [0.3, 0.5, 0.9, 0.4]),  # climbs past 0.6 at 4; back below at 8 does not count
               system("orca", [0.1, 0.15, 0.2, 0.3], finished=[4, 4, 3, 4]),  # one request unfinished at 4
               system("paged", [0.1, 0.1, 0.12, 0.15])]
    ratios = online.judge(systems, factor=2.0)
    assert [s["sustained_rate"] for s in systems] == [2.0, 2.0, 8.0]
    assert [r["sustained"] for r in systems[0]["runs"]] == [True, True, False, False]
    assert systems[2]["sustained_all"] and not systems[0]["sustained_all"]
    assert ratios["paged_vs_static_sustained_rate"] == 4.0 and ratios["paged_vs_static_at_least"]
    assert ratios["paged_vs_orca_goodput_at_top_rate"] == 1.0


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="rates"):
        online.run(model="tiny", rates=(0, 1), progress=False)
    with pytest.raises(ValueError, match="systems"):
        online.run(model="tiny", rates=(1,), systems=["nope"], progress=False)
    with pytest.raises(ValueError, match="requests"):
        online.run(model="tiny", rates=(1,), requests=1, progress=False)
