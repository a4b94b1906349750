"""Chapter 06's benchmark on the tiny model: it runs every system on the same trace and reports what
it measured (the real-model figures come from ``python -m minipaged bench serving``)."""

import json

import pytest

from minipaged.lab.bench import serving


@pytest.fixture(scope="module")
def result():
    return serving.run("tiny", requests=12, scale=0.5, kv_capacity=1024, max_model_len=128, max_num_seqs=4,
                       pressure_capacity=160, skip_hf=True)


def test_every_system_served_the_same_trace_with_the_same_tokens(result):
    assert result["identical_outputs"]
    useful = result["systems"][0]["output_tokens"]
    served = result["systems"] + result["orca"] + result["pressure"]
    assert all(s["output_tokens"] == useful and s["requests"] == 12 for s in served)


def test_orca_schedules_every_step_over_slabs(result):
    """Orca's three reservations sit between static batching and paging: the same contiguous slabs as
    static, but a request joins as soon as a slab is free; the tighter the reservation, the more fit."""
    static, continuous = result["systems"]
    by_rule = {o["system"]: o for o in result["orca"]}
    assert list(by_rule) == [f"Orca ({rule}): continuous + contiguous" for rule in ("max", "pow2", "oracle")]
    orca_max, pow2, oracle = by_rule.values()
    assert orca_max["mean_batch"] >= static["mean_batch"]  # same slabs, refilled at once
    assert orca_max["peak_kv_utilization"] <= oracle["peak_kv_utilization"]  # max reserves the most
    assert continuous["mean_kv_utilization"] >= oracle["mean_kv_utilization"]
    ratios = result["ratios"]
    for rule in ("max", "pow2", "oracle"):
        assert ratios[f"orca_{rule}_vs_static_requests_per_s"] > 0
        assert ratios[f"continuous_vs_orca_{rule}_requests_per_s"] > 0
    assert "Orca (pow2) / static: scheduling alone" in serving.format_result(result)


def test_the_report_measures_batches_memory_and_preemptions(result):
    static, continuous = result["systems"]
    assert static["system"] == "static + contiguous" and continuous["system"] == "continuous + paged"
    assert static["mean_batch"] <= continuous["mean_batch"] <= 4
    assert continuous["peak_kv_utilization"] > static["peak_kv_utilization"]  # slabs of 128 hold few tokens
    recompute, swap = result["pressure"]
    assert recompute["preemptions"] > 0 and swap["preemptions"] > 0, "the small pool was meant to force preemptions"
    assert swap["blocks_swapped_out"] > 0 and recompute["tokens_computed"] > continuous["tokens_computed"]
    book = continuous["bookkeeping"]
    assert book is not None and book["batch"] == 4 and 0 <= book["fraction"] < 1
    for s in result["systems"]:
        assert s["ttft_p50"] <= s["ttft_p99"] <= s["latency_p99"]
        assert len(s["timeline"]["time"]) == len(s["timeline"]["batch"]) == s["forward_passes"]
    assert set(result["ratios"]) >= {"continuous_vs_static_requests_per_s", "swap_vs_recompute_requests_per_s"}


def test_the_table_and_json_print(result, capsys):
    text = serving.format_result(result)
    assert "static + contiguous" in text and "ratios, measured in this run" in text and "bookkeeping" in text
    json.dumps({k: v for k, v in result.items() if k not in ("systems", "pressure")})


def test_the_timeline_plot(result, tmp_path):
    from minipaged.lab.plots import plot_serving_timeline

    path = tmp_path / "timeline.png"
    plot_serving_timeline({s["system"]: s["timeline"] for s in result["systems"]}, 1024, path=str(path))
    assert path.stat().st_size > 10_000


def test_hf_padded_batches_count_the_padding_they_decode():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minipaged.lab.bench.hf_baseline import run_padded

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompts, lens = [[5, 6, 7], [8, 9], [10], [11, 12, 13, 14]], [4, 1, 2, 3]
    result = run_padded(model, prompts, lens, batch_size=2)
    assert result.output_tokens == 10 and result.requests == 4
    assert result.decoded_tokens == 2 * 4 + 2 * 3  # each batch runs to its longest request


def test_simulate_serving_separates_scheduling_from_paging(capsys):
    """`simulate --serving`: at one capacity, iteration-level scheduling alone (Orca) needs fewer forward
    passes than static batching, tighter reservations fewer again, and paging the fewest."""
    from minipaged.lab.simulator import cli

    assert cli.main(["--serving", "--num-requests", "40", "--capacity", "4096", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["systems"]
    steps = [rows[key]["steps"] for key in ("static", "orca_max", "orca_pow2", "orca_oracle", "paged")]
    assert steps[0] > steps[1] >= steps[2] >= steps[3] > steps[4], steps
    assert all(rows[key]["preemptions"] == 0 for key, (*_, policy, _) in cli.SERVING_SYSTEMS.items()
               if policy == "contiguous")
    assert rows["static"]["static_steps_over_steps"] == 1.0 and rows["paged"]["label"] == "continuous + paged"


def test_the_capacity_sweep_runs_every_system_at_each_capacity(tmp_path, capsys, monkeypatch):
    """`bench serving --capacities` reruns the engine's systems at each KV capacity, records to its own
    name, and draws capacity_sweep.png; a capacity below max_model_len is refused before any work."""
    from minipaged.cli import main
    from minipaged.lab import capture

    monkeypatch.setattr(capture, "chapter_dir", lambda number: tmp_path / number)
    base = ["bench", "serving", "--model", "tiny", "--requests", "8", "--scale", "0.5", "--max-model-len", "128",
            "--max-num-seqs", "4", "--orca", "oracle"]
    assert main(base + ["--capacities", "256,1024", "--plot-dir", str(tmp_path), "--record"]) == 0
    printed = capsys.readouterr().out
    r = json.loads((tmp_path / "06" / "results" / "bench_serving_capacities.json").read_text())["results"]
    assert [row["kv_capacity_tokens"] for row in r["rows"]] == [256, 1024] and r["identical_outputs"]
    names = [s["system"].split(":")[0] for s in r["rows"][0]["systems"]]
    assert names == ["static + contiguous", "Orca (oracle)", "continuous + paged"]
    small, large = r["rows"]
    assert small["systems"][0]["mean_batch"] <= large["systems"][0]["mean_batch"]  # 2 slabs, then 8
    assert "paged/static" in printed and (tmp_path / "capacity_sweep.png").stat().st_size > 10_000
    assert main(base + ["--capacities", "64"]) == 2
    assert "--capacities='64' must list KV capacities" in capsys.readouterr().err
