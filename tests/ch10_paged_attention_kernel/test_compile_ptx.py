"""Every kernel compiles for Hopper (sm_90) with the real numba.cuda compiler, no GPU needed.

The simulator runs kernels as Python and checks no types; numba.cuda.compile_ptx runs the real
compiler (numba -> NVVM from numba-cuda[cu13]). It needs the real numba.cuda, which this pytest
process cannot have once the simulator is on, so it runs in a subprocess with NUMBA_ENABLE_CUDASIM=0.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"v1", "v1_strided_q", "v1_block_size_1", "v2_partition", "v2_merge", "v3", "v3_rows_max", "v3_shared_sum"}


@pytest.fixture(scope="module")
def ptx_summary():
    pytest.importorskip("numba", reason="numba is not installed: pip install -e \".[test]\"")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    proc = subprocess.run([sys.executable, "-m", "minipaged.lab.kernels.ptx", "--cc", "9.0", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode == 3:  # ptx.NO_TOOLCHAIN: NVRTC or NVVM missing, and the message says what to install
        pytest.skip(proc.stderr.strip()[-300:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_kernel_compiles_for_sm90_in_fp16_and_fp32(ptx_summary):
    got = {(r["kernel"], r["head_dim"], r["dtype"]) for r in ptx_summary}
    assert got == {(k, d, t) for k in KERNELS for d in (64, 128) for t in ("float16", "float32")}
    for r in ptx_summary:
        assert r["target"] and r["entry"] and r["ptx_chars"] > 1000, r


def test_the_gpu_entry_points_exist_in_real_numba_cuda():
    """What numba_backend calls on a GPU, checked where it can be: in the real numba.cuda module."""
    code = "import numba.cuda as c; print(all(hasattr(c, n) for n in ('as_cuda_array', 'external_stream', 'gpus')))"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"},
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "True", proc.stderr[-2000:]


def test_no_double_precision_math(ptx_summary):
    """A stray Python float (float64) in a kernel makes slow fp64 code; every kernel stays in fp32."""
    assert [r for r in ptx_summary if r["f64_mentions"]] == []


def test_accumulators_stay_in_registers(ptx_summary):
    """No local memory: every thread's output slots and loop state fit in registers."""
    assert [r for r in ptx_summary if r["local_mentions"]] == []
