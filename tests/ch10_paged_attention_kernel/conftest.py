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
    pytest.importorskip("numba", reason="numba is not installed: pip install -e \".[test]\"")
    from numba import config

    if not HAS_GPU and not config.ENABLE_CUDASIM:
        pytest.skip("numba was imported before this chapter's conftest, without the CUDA simulator, and "
                    "there is no GPU: run `pytest tests/ch10_paged_attention_kernel` on its own")
    from numba import cuda

    return cuda


@pytest.fixture
def compare(numba_cuda):
    """compare(batch, **kernel_options): the numba backend against the reference on one batch (a dict
    from random_paged_batch); asserts agreement within check_kernels.TOLERANCES, returns the max error."""
    from minipaged.lab.kernels.check import check_against_reference

    return check_against_reference
