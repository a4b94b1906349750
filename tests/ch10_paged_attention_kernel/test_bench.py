"""The benchmark's arithmetic and the check's inputs (no GPU): the chapter's numbers come from these."""

import json

import pytest
import torch

from minipaged.lab.bench import kernels as bk
from minipaged.lab.kernels import check as ck
from minipaged.model.config import SMOLLM2_135M


def test_smollm2_bytes_per_token():
    r = bk.roofline()
    assert r["kv_bytes_per_token"]["smollm2"]["fp32_all_layers"] == 2 * 30 * 3 * 64 * 4 == 46_080
    assert r["kv_bytes_per_token"]["smollm2"]["fp16_one_layer"] == 768


def test_decode_attention_is_far_below_the_ridge_point():
    r = bk.roofline(peak_gbps=4800, peak_tflops=67.0)
    assert all(row["flop_per_byte"] < 5 < r["ridge_flop_per_byte"] for row in r["rows"])
    nbytes = bk.decode_attention_bytes(SMOLLM2_135M, 64, 2048)
    assert nbytes == 2 * 64 * 2048 * 3 * 64 * 2 + 2 * 64 * 9 * 64 * 2


def test_device_table():
    assert bk.device_peaks("NVIDIA H200")[0] == 4800
    assert bk.device_peaks("NVIDIA H100 PCIe")[0] == 2000  # the longer key wins over "H100"
    assert bk.device_peaks("NVIDIA H100 80GB HBM3")[0] == 3350
    assert bk.device_peaks("Some Future GPU") is None


def test_random_paged_batch_layout():
    b = ck.random_paged_batch([1, 16, 17], [1, 4, 17], num_heads=4, num_kv_heads=2, head_dim=8,
                              block_size=16, share_first_block=True)
    assert b["q"].shape == (22, 4, 8) and b["k_cache"].shape[1:] == (16, 2, 8)
    table = b["block_tables"]
    assert table.dtype == torch.int32 and table.shape == (3, 2)
    assert table[0, 0] == table[1, 0] == table[2, 0]  # shared first block
    assert table[2, 1] != table[0, 0] and int(table[0, 1]) == b["k_cache"].shape[0]  # padding: out of range


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message printed where there is no GPU")
def test_without_a_gpu_it_says_so(capsys):
    import argparse

    p = argparse.ArgumentParser()
    bk.add_arguments(p)
    assert bk.main(p.parse_args([])) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert bk.main(p.parse_args(["--roofline"])) == 0
    assert "46,080 B" in capsys.readouterr().out
    assert ck.main([]) == 2 and "no CUDA GPU" in capsys.readouterr().err


def test_device_check_cases_cover_the_matrix():
    names = [name for name, _, _ in ck.device_check_cases()]
    assert len(names) == len(set(names)) == 6 * 3 * 2 * 2 + 8
    assert {"decode-v27-gqa4-d128-float16", "decode-auto-gqa1-d64-float32", "multi-v23-float16",
            "decode-v35-gqa3-d64-float16", "multi-v3-float32"} <= set(names)


def test_device_check_runs_here_on_small_shapes(numba_cuda, monkeypatch):
    """The GPU check's own code path, shrunk to simulator size and run on the CPU."""
    monkeypatch.setattr(ck, "DEVICE_CONTEXTS", [1, 17])
    monkeypatch.setattr(ck, "DEVICE_GQA", {3: (3, 1)})
    monkeypatch.setattr(ck, "DEVICE_KERNELS", [("v2", 2)])
    monkeypatch.setattr(ck, "DEVICE_HEAD_DIMS", (64,))
    monkeypatch.setattr(ck, "DEVICE_MULTI", dict(context_lens=[9, 4], query_lens=[3, 1], num_heads=2,
                                                 num_kv_heads=1, head_dim=64))
    results = ck.device_check("cpu")
    assert len(results) == 2 + 8 and all(r["ok"] for r in results), results


@pytest.mark.slow
def test_the_benchmark_itself_runs_here_on_a_tiny_shape(numba_cuda, tmp_path, monkeypatch):
    """Every line of the GPU benchmark but the CUDA timer, on the CPU under the simulator, so that the
    GPU session does not find its bugs. The times it prints mean nothing. As scripts/gpu_check.sh does,
    it lets "auto" pick v3, which has not run on a GPU yet."""
    from minipaged.attention.kernels.config import ALLOW_UNTESTED_ENV
    from minipaged.model.config import ModelConfig

    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")

    small = ModelConfig(name="small", vocab_size=16, hidden_size=192, intermediate_size=16, num_layers=1,
                        num_heads=3, num_kv_heads=1, head_dim=64)
    out = tmp_path / "bench.json"
    r = bk.run(peak_gbps=100.0, iters=1, progress=False, out=str(out), device="cpu", shapes={"small": small},
               grid=[("small", 2, 40), ("small", 1, 520)], sweeps=[("small", 2, 40)], target=("small", 2, 40))
    assert [row["context"] for row in r["rows"]] == [40, 520]
    assert r["rows"][1]["auto_kernel"] == "v3" and "numba_v2" in r["rows"][1]["us"]  # v3 allowed, as on the GPU
    assert set(r["rows"][0]["us"]) == {"numba", "numba_v1", "numba_v3", "sdpa", "reference"}
    assert set(r["partition_sweeps"][0]["us_by_partitions"]) == {1}  # 40 keys: too short to split
    assert r["target"]["shape"] == ["small", 2, 40] and json.loads(out.read_text())["partial"]
    json.dumps(r)  # the --json output
    bk.print_row(r["rows"][1])
