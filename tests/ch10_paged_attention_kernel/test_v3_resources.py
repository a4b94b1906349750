"""v3 held to what the compile-time resource report shows (ptxas on the PTX for sm_90, no GPU needed).

The design claims (v3_config.BLOCKS_PER_SM_CLAIMED, quoted by chapter 10): v3 reads K and V in
8-byte words, never spills, and fits 4 blocks of 128 threads per SM at the chapter's two decode shapes.
The report needs the real numba.cuda, which this pytest process cannot have once the simulator is on,
so it runs in a subprocess, as test_compile_ptx.py does.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipaged.attention.kernels.v3_config import BLOCKS_PER_SM_CLAIMED, OCCUPANCY_CLAIMED

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("numba", reason="numba is not installed: pip install -e \".[test]\"")
if importlib.util.find_spec("minipaged.lab.kernels.resources") is None:
    pytest.skip("minipaged.lab.kernels.resources (the compile-time report) is not in this tree",
                allow_module_level=True)

V3_KERNELS = ("v3", "v3_rows_max", "v3_shared_sum")
REPORT = """
import dataclasses, json
from minipaged.lab.kernels.resources import kernel_resources
rows = kernel_resources(cc=(9, 0), head_dims=(64, 128), dtypes=("float16", "float32"), kernels={kernels!r})
print(json.dumps([dataclasses.asdict(r) for r in rows]))
"""


@pytest.fixture(scope="module")
def report():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", REPORT.format(kernels=V3_KERNELS)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip(f"ptxas is not installed (pip install -e \".[kernels]\"): {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in rows:
        r["global_loads"] = {int(width): n for width, n in r["global_loads"].items()}
    assert {(r["kernel"], r["head_dim"], r["dtype"]) for r in rows} == \
        {(k, d, t) for k in V3_KERNELS for d in (64, 128) for t in ("float16", "float32")}
    return rows


def test_v3_loads_the_cache_in_whole_words(report):
    """No 1- or 2-byte global load at all (q is read as words too); at least one step's K and V words
    (2 x unroll x words_per_lane) as 8-byte loads."""
    from minipaged.attention.kernels.v3_config import V3Config

    for r in report:
        assert min(r["global_loads"]) >= 4, r
        cfg = V3Config.for_shape(r["head_dim"], r["dtype"], group=3 if r["head_dim"] == 64 else 4)
        assert r["global_loads"].get(8, 0) >= 2 * cfg.unroll * cfg.words_per_lane, r


def test_v3_never_spills(report):
    for r in report:
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r


def test_v3_allows_the_occupancy_its_design_claims(report):
    """At the chapter's decode shapes, in fp16 and fp32: at least 4 blocks of 128 threads per SM."""
    for r in report:
        if r["kernel"] == "v3":
            assert r["threads_per_block"] == 128, r
            assert r["blocks_per_sm"] >= BLOCKS_PER_SM_CLAIMED and r["occupancy"] >= OCCUPANCY_CLAIMED, r
