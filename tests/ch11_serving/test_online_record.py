"""Chapter 11's "Measured" section renders its numbers from chapters/11_serving/results/bench_online.json
(test_records.py checks each number). What the words around them claim is checked here, against
the same record: a retake that changed the outcome fails this test until the text is changed too."""

import json

import pytest

from minipaged.lab import records
from minipaged.lab.simulator.online import SYSTEMS

CHAPTER = records.CHAPTERS / "11_serving"


@pytest.fixture(scope="module")
def record():
    return json.loads((CHAPTER / "results" / "bench_online.json").read_text())


def test_the_record_is_the_chapters_command_at_its_defaults(record):
    r = record["results"]
    assert record["command"] == "python -m minipaged bench online --plot-dir chapters/11_serving"
    assert not record["dirty"] and r["model"] == "smollm2-135m"
    # the plain integers the text states
    assert (r["simulated"]["requests"], r["simulated"]["seeds"], len(r["simulated"]["rates"])) == (300, 3, 48)
    assert (r["real"]["requests"], r["real"]["seeds"], len(r["real"]["systems"])) == (48, 2, 5)
    assert (r["kv_capacity_tokens"], r["max_model_len"], r["max_num_seqs"]) == (1536, 256, 64)
    assert r["probe"]["reliable"]  # "the GEMM probe finding the cores quiet"
    assert r["seconds"] < 20 * 60  # the budget: about 20 minutes


def test_every_knee_is_inside_the_rates_in_the_papers_order(record):
    sim = record["results"]["simulated"]
    systems = [sim["systems"][k] for k in SYSTEMS]
    held = [s["held_rate"] for s in systems]
    assert None not in held and all(s["missed_rate"] for s in systems)
    assert all(a < b for a, b in zip(held, held[1:]))  # strictly: paging last
    assert held[0] > sim["rates"][0]  # the lowest rate is below every knee
    for s in systems:  # "the knee of all three is the most cautious": at or below every seed's own
        assert None not in s["seed_held_rates"] and s["held_rate"] <= min(s["seed_held_rates"]), s["key"]


def test_the_real_servers_agree_with_their_twins_and_served_everything(record):
    real = record["results"]["real"]
    a = real["agreement"]
    assert 1.0 <= a["min"] <= a["max"] <= 1.25  # "a little above the simulator"
    for s in real["systems"].values():
        assert s["server_returncode"] == 0
        for run in s["runs"]:
            assert not run["errors"]
            assert all(x["finished"] == x["requests"] == real["requests"] for x in run["seeds"])
    o = record["results"]["overhead"]
    assert o["same_text_as_offline"] == o["requests"] == real["requests"]


def test_static_batching_bends_well_before_its_capacity(record):
    static = record["results"]["simulated"]["systems"]["static"]
    assert static["missed_rate"] < 0.5 * static["runs"][-1]["requests_per_s"]
    # a continuous system bends near where it leaves the diagonal: its capacity is near its knee
    for key in ("orca_max", "orca_pow2", "orca_oracle", "paged"):
        s = record["results"]["simulated"]["systems"][key]
        assert s["held_rate"] <= s["runs"][-1]["requests_per_s"] <= 1.5 * s["missed_rate"], key


def test_the_figure_is_drawn_from_the_record(record, tmp_path):
    from minipaged.lab.plots.online import plot_online_latency

    assert (CHAPTER / "online_latency.png").exists()
    assert "online_latency.png" in (CHAPTER / "README.md").read_text()
    plot_online_latency(record["results"], path=str(tmp_path / "again.png"))
    assert (tmp_path / "again.png").stat().st_size > 20_000


def test_open_question_4s_answer_ttft_climbs_and_a_full_batch_caps_the_itl(record):
    sim = record["results"]["simulated"]["systems"]
    low, high = sim["static"]["runs"][0]["seeds"][0], sim["static"]["runs"][-1]["seeds"][0]
    assert high["ttft_p50_s"] > 100 * low["ttft_p50_s"] and high["itl_p50_s"] < 1.5 * low["itl_p50_s"]
    low, high = sim["paged"]["runs"][0]["seeds"][0], sim["paged"]["runs"][-1]["seeds"][0]
    assert high["itl_p50_s"] > 2 * low["itl_p50_s"]  # "its batch grows with the load"
