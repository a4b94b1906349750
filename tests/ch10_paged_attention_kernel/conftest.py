"""Chapter 10 fixtures. Without a GPU, numba runs the kernels in its CUDA simulator.

NUMBA_ENABLE_CUDASIM is read once, when numba is first imported, and then holds for the whole pytest
process. Nothing outside this chapter imports numba, so setting it here, while pytest collects this
directory, is early enough. With a real GPU the variable is left alone and the same tests run on it.
"""

import os
import sys

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU and "numba" not in sys.modules:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


@pytest.fixture(scope="session")
def numba_cuda():
    """numba.cuda, real or simulated; skips (with the reason) if neither can run kernels here."""
    pytest.importorskip("numba", reason="numba is not installed: pip install numba numba-cuda[cu13]")
    from numba import config

    if not HAS_GPU and not config.ENABLE_CUDASIM:
        pytest.skip("numba was imported before this chapter's conftest, without the CUDA simulator, and "
                    "there is no GPU: run `pytest tests/ch10_paged_attention_kernel` on its own")
    from numba import cuda

    return cuda


# Both sides compute in fp32; they differ only in summation order (fp32) and, for fp16, in the final
# rounding to fp16, at most about one fp16 ulp (2**-10 for outputs of magnitude below 2).
TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


@pytest.fixture
def compare(numba_cuda):
    """compare(batch, **kernel_options): run the numba backend and the reference on one batch (a dict
    from random_paged_batch), assert they agree within TOLERANCES, return the max abs difference."""
    from minipaged.attention.numba_backend import paged_attention_numba
    from minipaged.attention.reference import paged_attention_reference

    def run(batch, **options):
        args = (batch["q"], batch["k_cache"], batch["v_cache"], batch["block_tables"], batch["context_lens"])
        ref = paged_attention_reference(*args, query_lens=batch["query_lens"])
        out = paged_attention_numba(*args, query_lens=batch["query_lens"], **options)
        assert out.shape == ref.shape and out.dtype == ref.dtype and out.device == ref.device
        torch.testing.assert_close(out.float(), ref.float(), **TOLERANCES[batch["q"].dtype])
        return float((out.float() - ref.float()).abs().max())

    return run
