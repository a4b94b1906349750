"""``python -m minipaged bench online``: calibration, the simulated sweep, five real servers and the
server's price, end to end on the tiny model with a handful of requests."""

import json
import math

import pytest

from minipaged.lab.bench import online
from minipaged.lab.plots import online as plot_online
from minipaged.lab.simulator.online import SYSTEMS

REQUESTS, SEEDS, RATES_COUNT = 40, 2, 6
REAL_REQUESTS = 6


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    plot_dir = tmp_path_factory.mktemp("online")
    return online.run(model="tiny", requests=REQUESTS, seeds=SEEDS, rates_count=RATES_COUNT,
                      real_requests=REAL_REQUESTS, real_seeds=2, scale=0.1, max_model_len=128, max_num_seqs=8,
                      kv_capacity=768, real_drain=30.0, progress=False, plot_dir=str(plot_dir))


def test_poisson_arrivals_are_seeded_and_stretch_with_the_rate():
    slow, fast = online.poisson_arrivals(50, 1.0, seed=3), online.poisson_arrivals(50, 4.0, seed=3)
    assert slow[0] == 0 and all(b > a for a, b in zip(slow, slow[1:]))
    assert fast == pytest.approx([t / 4 for t in slow])
    assert online.poisson_arrivals(50, 1.0, seed=4) != slow
    assert 20 < slow[-1] < 100  # 49 gaps of mean 1 s
    assert online.poisson_arrivals(3, math.inf) == [0.0, 0.0, 0.0]


def test_the_step_time_is_fitted_on_the_real_engines_steps(result):
    c = result["calibration"]
    m = c["step_model"]
    assert c["steps"] == m["steps"] > 50
    assert m["fixed_s"] >= 0 and m["per_token_s"] >= 0 and m["per_seq_s"] >= 0
    assert 0 < m["fixed_s"] + m["per_token_s"] + m["per_seq_s"] < 1.0  # a one-token step of the tiny model
    assert 0 <= m["median_error"] < 1
    assert set(c["drift"]) == {"decode_1", "decode_16", "prompt_128"} and all(x > 0 for x in c["drift"].values())
    assert c["step_model_after"]["steps"] > 50  # the same calibration, taken again at the end


def test_the_sweep_covers_every_system_seed_and_rate(result):
    sim = result["simulated"]
    assert list(sim["systems"]) == list(SYSTEMS)
    assert len(sim["rates"]) >= 3 and sim["rates"] == sorted(sim["rates"])
    for s in sim["systems"].values():
        assert [r["rate"] for r in s["runs"]] == sim["rates"]
        for run in s["runs"]:
            assert len(run["seeds"]) == SEEDS and all(x["requests"] == REQUESTS for x in run["seeds"])
            lows = [x["normalized_latency_s"] for x in run["seeds"]]
            assert run["normalized_min_s"] == min(lows) and run["normalized_max_s"] == max(lows)
        assert s["held_rate"] is None or s["held_rate"] in sim["rates"]
        assert len(s["seed_held_rates"]) == SEEDS
    assert sim["systems"]["static"]["runs"][0]["normalized_latency_s"] > \
        sim["systems"]["paged"]["runs"][0]["normalized_latency_s"]  # one arriving during a static batch waits for it
    assert len({s["threshold_s_per_token"] for s in sim["systems"].values()}) == 1  # one bar for all


def test_every_real_server_served_every_request_exactly(result):
    real = result["real"]
    assert list(real["systems"]) == list(SYSTEMS)
    for s in real["systems"].values():
        assert s["server_returncode"] == 0  # a clean SIGTERM: every block back in the pool
        assert [r["times_knee"] for r in s["runs"]] == list(online.REAL_AT)
        for run in s["runs"]:
            assert not run["errors"] and len(run["seeds"]) == len(run["simulated"]) == 2
            for x in run["seeds"]:
                assert x["finished"] == x["requests"] == REAL_REQUESTS and x["unfinished"] == 0
                assert 0 < x["ttft_p50_s"] <= x["ttft_p99_s"] and 0 < x["normalized_latency_s"] <= x["e2e_p99_s"]
                assert x["goodput_requests_per_s"] <= x["requests_per_s"]
            assert run["real_over_simulated"] == pytest.approx(
                run["normalized_latency_s"] / run["simulated_normalized_latency_s"])
    a = real["agreement"]
    assert 0 < a["min"] <= a["mean"] <= a["max"]


def test_overhead_text_record_and_plot(result, tmp_path):
    o = result["overhead"]
    assert o["server_output_tokens_per_s"] > 0 and o["offline_output_tokens_per_s"] > 0
    assert o["ratio"] == pytest.approx(o["server_output_tokens_per_s"] / o["offline_output_tokens_per_s"])
    assert o["same_text_as_offline"] == REAL_REQUESTS  # greedy: the server answers what generate does
    assert len(o["offline_tries"]) == len(o["server_tries"]) == online.OVERHEAD_PAIRS
    assert set(result["probe"]) == {"before", "after", "reliable"} and result["probe"]["before"]["gflops"] > 0
    text = online.format_result(result)
    for label in ("== calibration ==", "== simulated ==", "== real ==", "== overhead ==", "== noise ==",
                  "last held -> first missed", "real / simulated", "GEMM probe", *(s[0] for s in SYSTEMS.values())):
        assert label in text
    (path,) = result["plots"]
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    record = tmp_path / "r.json"
    record.write_text(json.dumps({"results": result}))  # --json prints it as is; a record wraps it
    assert plot_online.main([str(record), str(tmp_path / "again.png")]) == 0
    assert (tmp_path / "again.png").stat().st_size > 10_000


def test_each_systems_fields_become_the_servers_flags():
    flags = online._server_flags({"kv_policy": "contiguous", "enable_prefix_caching": False}, 256, 64, 1536)
    assert flags == ["--max-model-len", "256", "--max-num-seqs", "64", "--kv-capacity-tokens", "1536",
                     "--kv-policy", "contiguous", "--no-enable-prefix-caching"]
    assert online._server_flags({"enable_prefix_caching": True}, 1, 2, 3)[-1] == "--enable-prefix-caching"


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="rates"):
        online.run(model="tiny", rates=(0, 1), progress=False)
    with pytest.raises(ValueError, match="systems"):
        online.run(model="tiny", systems=["nope"], progress=False)
    with pytest.raises(ValueError, match="requests"):
        online.run(model="tiny", requests=1, progress=False)
    with pytest.raises(ValueError, match="real_seeds"):
        online.run(model="tiny", real_seeds=0, progress=False)
