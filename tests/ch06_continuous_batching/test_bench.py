"""Chapter 06's benchmark on the tiny model: it runs every system on the same trace and reports what
it measured (the real-model figures come from ``python -m minipaged bench serving``)."""

import json

import pytest

from minipaged.bench import serving


@pytest.fixture(scope="module")
def result():
    return serving.run("tiny", requests=12, scale=0.5, kv_capacity=1024, max_model_len=128, max_num_seqs=4,
                       pressure_capacity=160, skip_hf=True)


def test_every_system_served_the_same_trace_with_the_same_tokens(result):
    assert result["identical_outputs"]
    useful = result["systems"][0]["output_tokens"]
    assert all(s["output_tokens"] == useful and s["requests"] == 12 for s in result["systems"] + result["pressure"])


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
    from minipaged.plots import plot_serving_timeline

    path = tmp_path / "timeline.png"
    plot_serving_timeline({s["system"]: s["timeline"] for s in result["systems"]}, 1024, path=str(path))
    assert path.stat().st_size > 10_000


def test_hf_padded_batches_count_the_padding_they_decode():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minipaged.bench.hf_baseline import run_padded

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompts, lens = [[5, 6, 7], [8, 9], [10], [11, 12, 13, 14]], [4, 1, 2, 3]
    result = run_padded(model, prompts, lens, batch_size=2)
    assert result.output_tokens == 10 and result.requests == 4
    assert result.decoded_tokens == 2 * 4 + 2 * 3  # each batch runs to its longest request
