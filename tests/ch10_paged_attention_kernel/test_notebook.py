"""The chapter's notebook: its hand-written pieces still match the package, and it runs top to bottom."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from minipaged.attention.reference import gather_kv, paged_attention_reference
from minipaged.lab.kernels.check import random_paged_batch

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "10_paged-attention-kernel.ipynb"


def cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def test_first_code_cell_picks_the_simulator_before_numba_is_imported():
    first = "".join(next(c for c in cells() if c["cell_type"] == "code")["source"])
    assert "NUMBA_ENABLE_CUDASIM" in first
    assert first.index("NUMBA_ENABLE_CUDASIM") < first.index("import minipaged")
    assert "numba" not in first.split("NUMBA_ENABLE_CUDASIM")[0].replace("# numba", "")


@pytest.mark.parametrize("tile", [1, 8, 50])
def test_notebook_online_softmax_and_merge_match_the_reference(rederive, tile):
    ns = rederive(NOTEBOOK, np=np)  # the cells use NumPy only
    b = random_paged_batch([45], num_heads=2, num_kv_heads=1, head_dim=16, seed=3)
    ref = paged_attention_reference(b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    k = gather_kv(b["k_cache"], b["block_tables"][0], 45)[:, 0].double().numpy()
    v = gather_kv(b["v_cache"], b["block_tables"][0], 45)[:, 0].double().numpy()
    for head in range(2):
        q = b["q"][0, head].double().numpy() * 16 ** -0.5
        out, m, l = ns["online_softmax_attention"](q, k, v, tile)
        np.testing.assert_allclose(out, ref[0, head].double().numpy(), atol=1e-6)
        pieces = [ns["online_softmax_attention"](q, k[a:z], v[a:z], tile) for a, z in [(0, 7), (7, 30), (30, 45)]]
        np.testing.assert_allclose(ns["merge_partials"](*zip(*pieces)), out, atol=1e-9)
        assert m == pytest.approx(float((k @ q).max())) and l > 1


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(numba_cuda, run_notebook):
    text = run_notebook(NOTEBOOK)
    assert "same tokens: True" in text and "sm_90: NO" not in text
    # section 6 compiles for sm_90 where the CUDA compilers are installed (the "kernels" extra); without
    # them its cell says what to install, and the rest of the notebook runs on
    code = "from minipaged.lab.kernels.ptx import toolchain_missing; print(toolchain_missing() is None)"
    here = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"},
                          capture_output=True, text=True, timeout=300).stdout.strip() == "True"
    assert ("sm_90: yes" in text) if here else ('pip install -e ".[kernels]"' in text), text[-2000:]
    assert torch.tensor(0) == 0  # torch imported here too: nothing in the notebook broke this process
