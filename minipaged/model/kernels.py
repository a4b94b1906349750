"""Compiled CPU kernels for the model's small operations (minipaged/csrc/cpu_ops.cpp), and the switch
that lets a forward pass use them.

Why they exist: at one sequence, a decode step spends more of its time dispatching PyTorch calls than
computing (an RMSNorm is seven calls, RoPE nine, each a few microseconds, 30 layers deep). Each kernel
is the same math as a few lines of model/llama.py in one call; those lines stay, and are the oracle
the kernels are tested against (tests/ch00_the_kv_cache/test_cpu_kernels.py).

    with kernels.enabled():        # the engine's model runner wraps each forward pass in this
        logits = model(...)
    if kernels.use(x): ...         # inside the model: run x's operation compiled?
    kernels.ops()                  # torch.ops.minipaged, or None when the kernels could not be built

The first ``ops()`` builds the library, once per machine (model/kernels_build.py; about 20 s);
without a compiler it warns once and every operation takes the PyTorch path, with the same results.
A model called outside ``enabled()`` (a test, a notebook, HF comparisons) always runs plain PyTorch.

Not handled: dtypes other than float32 and tensors off the CPU (``use`` says no; the PyTorch path runs).
"""

from __future__ import annotations

import contextlib
import functools

import torch

_enabled = False


@contextlib.contextmanager
def enabled(on: bool = True):
    """Within this block the model runs its small operations through the compiled kernels (when they built)."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def use(x: torch.Tensor) -> bool:
    """Whether the operation on ``x`` should run compiled: kernels switched on, built, and x float32 on the CPU."""
    return _enabled and x.dtype == torch.float32 and x.device.type == "cpu" and ops() is not None


@functools.cache
def ops():
    """torch.ops.minipaged with the kernels registered, built on first use (model/kernels_build.py);
    None when they cannot be built."""
    from minipaged.model.kernels_build import load

    return load()
