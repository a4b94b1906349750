"""The ceiling kernels gpu_check measures beside the attention kernels: they read what they should (in
the simulator, against torch) and compile for sm_90 with the load widths they are named for."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the simulator where there is no GPU


@pytest.mark.parametrize("word_bytes", [2, 4, 8])
def test_a_flat_read_sums_the_fp16_values_whatever_the_word_width(numba_cuda, word_bytes):
    from minipaged.lab.kernels.ceilings import flat_read_sum

    values = (torch.randn(1000, generator=torch.Generator().manual_seed(word_bytes)) * 4).half().to(DEVICE)
    partial, call = flat_read_sum(values, word_bytes, blocks=3, threads=32)
    call()
    assert float(partial.double().sum()) == pytest.approx(float(values.double().sum()), rel=1e-4, abs=1e-2)
    # every thread wrote its own slot: the partials are not all one value
    assert len(set(partial.cpu().tolist())) > 1


def _paged(seed=0, lens=(5, 17, 33, 0), block_size=4, kv_heads=2, head_dim=8, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-max(lens) // block_size)
    num_blocks = len(lens) * per_seq + 3
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k = torch.randn(*shape, generator=gen).to(dtype)
    v = torch.randn(*shape, generator=gen).to(dtype)
    table = torch.randperm(num_blocks, generator=gen)[: len(lens) * per_seq].to(torch.int32).view(len(lens), per_seq)
    return k.to(DEVICE), v.to(DEVICE), table.to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("partitions, threads", [(1, 32), (3, 32), (8, 16)])
def test_a_paged_read_reads_every_visible_row_once_through_the_table(numba_cuda, partitions, threads):
    from minipaged.lab.kernels.ceilings import paged_read_call, paged_reference_checksum, xor_all

    k, v, table, lens = _paged()
    out, call = paged_read_call(k, v, table, lens, partitions, threads)
    call()
    want = paged_reference_checksum(k, v, table, lens)
    assert want != 0 and xor_all(out) == want
    # one token fewer, or the table read in order, gives another checksum: the test can fail
    assert paged_reference_checksum(k, v, table, lens - (lens > 0).int()) != want
    assert paged_reference_checksum(k, v, torch.sort(table, dim=1).values, lens) != want


def test_a_paged_read_refuses_rows_that_are_not_whole_words(numba_cuda):
    from minipaged.lab.kernels.ceilings import paged_read_call

    k, v, table, lens = _paged(head_dim=6)
    with pytest.raises(ValueError, match="8-byte words"):
        paged_read_call(k, v, table, lens, 1, 32)


def test_the_ceiling_kernels_compile_for_sm90_with_the_widths_they_are_named_for():
    pytest.importorskip("numba", reason="numba is not installed: pip install -e \".[test]\"")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "minipaged.lab.kernels.ceilings", "--ptx", "--cc", "9.0"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode == 3:  # ptx.NO_TOOLCHAIN: NVRTC or NVVM missing, and the message says what to install
        pytest.skip(proc.stderr.strip()[-300:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    for width in (2, 4, 8):
        assert set(got[f"flat_read_{width}B"]["loads_by_width"]) == {str(width)}
    assert "8" in got["paged_read"]["loads_by_width"] and "2" not in got["paged_read"]["loads_by_width"]
    assert all(r["f64_mentions"] == 0 and r["local_mentions"] == 0 for r in got.values())


def test_the_paged_ceiling_keeps_the_fastest_checked_configuration(numba_cuda):
    """What gpu_check's ceilings step does at each shape, on a tiny one, timed by the wall clock."""
    from minipaged.lab.bench.kernels import WallTimer
    from minipaged.lab.kernels.ceilings import measure_paged
    from minipaged.model.config import TINY

    row = measure_paged(TINY, "tiny", 2, 40, WallTimer(DEVICE), peak_gbps=1.0, iters=1, threads_tried=(32,),
                        partitions_tried=(1, 2))
    assert row["checked"] and set(row["us_tried"]) == {"P1_T32"}  # 40 tokens: no partition of 64
    assert row["best"] == "P1_T32" and row["bytes"] == 2 * 2 * 40 * 2 * 16 * 2
    assert row["gbps"] == pytest.approx(row["bytes"] / (row["us"] * 1e3))


def test_the_profiler_runs_the_kernels_the_benchmark_timed():
    from minipaged.lab.kernels.profile_target import kernels_from_bench

    row = {"shape": "smollm2", "batch": 64, "context": 2048, "v2_partitions": 6,
           "us": {"numba": 1.0, "numba_v1": 1.0, "numba_v2": 1.0, "numba_v3": 1.0, "sdpa": 1.0, "reference": 1.0}}
    assert kernels_from_bench({"rows": [row]}) == [("auto", None), ("v1", None), ("v2", 6), ("v3", None)]
    assert kernels_from_bench(None) == [("auto", None), ("v1", None), ("v2", None)]
