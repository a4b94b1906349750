"""Chapter 00: `bench decode`, the decode speed under the two roofs, on the tiny model (seconds)."""

import argparse
import json

import pytest
import torch

from minipaged.cli import main
from minipaged.lab.bench import decode
from minipaged.lab.bench.noise import WARNING, describe_probe
from minipaged.model.config import TINY
from minipaged.model.random import random_model


@pytest.fixture(scope="module")
def result():
    return decode.run("tiny", batches=(1, 3), context=8, steps=4, rounds=2, hf=False, progress=False)


def test_every_row_has_its_bounds_and_the_engine_made_every_token(result):
    for row in result["rows"]:
        assert len(row["engine_tries"]) == 2 and row["engine"]["tokens_per_s"] == max(row["engine_tries"])
        assert row["engine"]["tokens"] == row["batch"] * result["steps"]  # one token per sequence per step
        bounds = row["bounds"]
        assert row["roof"] == min(bounds.values()) and row["binding"] in bounds
        assert bounds["arithmetic"] == pytest.approx(row["batch"] / (row["matmul_ms"] / 1e3))
        assert row["matmul_ms"] == min(row["matmul_plain_ms"], row["matmul_model_ms"])
        # the bandwidth is sampled before and after each engine round; the bound uses the highest sample
        assert len(row["read_samples_gbytes_s"]) == 4 and row["read_gbytes_s"] == max(row["read_samples_gbytes_s"])
        read = row["read_gbytes_s"] * 1e9
        assert bounds["weight_streaming"] == pytest.approx(row["batch"] * read / (row["step_mbytes"] * 1e6))
    one, three = result["rows"]
    assert three["step_mbytes"] > one["step_mbytes"]  # more sequences, more K/V read


def test_targets_are_the_measured_ratios(result):
    (streaming,) = [t for t in result["targets"] if "weight-streaming" in t["target"]]
    one = result["rows"][0]
    assert streaming["measured"] == pytest.approx(one["engine"]["tokens_per_s"] / one["bounds"]["weight_streaming"])
    assert streaming["met"] == (streaming["measured"] >= 0.5)
    assert not any("batch 32" in t["target"] for t in result["targets"])  # not measured in this run


def test_matmuls_are_the_model_weights_in_forward_order():
    model = random_model(TINY)
    weights = decode.model_linears(model)
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    first = next(m.weight for m in model.layers[0].modules() if isinstance(m, torch.nn.Linear))
    assert weights[0] is first and weights[-1] is model.lm_head.weight and len(weights) == len(linears)
    assert decode.matmul_flops(model, 2) == sum(2 * 2 * w.numel() for w in weights)
    assert all(m.weight is w for m, w in zip(decode.model_linear_modules(model), weights, strict=True))


def test_a_tied_embedding_is_read_once():
    model = random_model(TINY)
    untied = decode.weight_bytes_read(model)
    model.lm_head.weight = model.embed_tokens.weight
    assert untied - decode.weight_bytes_read(model) == TINY.vocab_size * TINY.hidden_size * 4


def test_report_says_which_targets_hold_and_warns_on_noise(result):
    text = decode.report(result)
    assert "of roof" in text and "target batch 1" in text and "GEMM probe before" in text
    noisy = dict(result["probe"], reliable=False)
    assert WARNING in describe_probe(noisy)
    assert WARNING not in describe_probe(dict(result["probe"], reliable=True))


def test_cli_json_and_plot(tmp_path, capsys):
    assert main(["bench", "decode", "--model", "tiny", "--batches", "1,2", "--context", "4", "--steps", "2",
                 "--no-hf", "--json", "--plot-dir", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["batch"] for r in data["rows"]] == [1, 2]
    assert (tmp_path / "decode_roofline.png").stat().st_size > 10_000


def test_bad_batches_are_refused():
    with pytest.raises(ValueError, match="--batches"):
        decode.main(argparse.Namespace(batches="0,2", context=4, steps=2, rounds=1, model="tiny", no_hf=True,
                                       dtype="float32", plot_dir=None, json=True))


def test_read_bandwidth_is_plausible():
    assert 1e8 < decode.read_bandwidth(nbytes=64 * 2**20, repeats=2) < 1e13  # 0.1 GB/s .. 10 TB/s
    buf = torch.ones(2**20)
    assert 1e8 < decode.read_bandwidth(buf=buf, repeats=2) < 1e13  # a buffer of the caller's
    assert torch.get_num_threads() >= 1
