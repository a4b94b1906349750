"""Attention backends behind one signature (see reference.py for the shapes).

    paged_attention(q, k_cache, v_cache, block_tables, context_lens, *, scale=None,
                    query_lens=None, backend="torch")

Backends:
    "torch"          the naive PyTorch reference: gather through the block table, dense softmax (the oracle)
    "torch_batched"  the same math in a few batched tensor operations (batched.py): the fast CPU path
    "cpu"            decodes through one compiled C++ loop over the paged cache, prompts as
                     torch_batched (batched.py's KernelAttention): chapter 10's kernel on a CPU
    "numba"          chapter 10's numba.cuda kernels (numba_backend.py, kernels/), loaded on first use; on a
                     machine without a GPU they run in numba's CUDA simulator

A forward pass calls attention once per layer with the same block tables and lengths.
``step_attention(backend)``, looked up once by the runner, is what builds a step's attention from
them: ``step_attention(backend)(block_tables, context_lens, query_lens, block_size)`` is the
``attend(q, k_cache, v_cache)`` every layer of the step calls. A backend that registers a planner
(the batched ones do) builds what depends only on the tables and lengths once, there; the others
get a plain call of their function.
"""

from __future__ import annotations

import functools
import importlib

from minipaged.attention.batched import BatchedAttention, KernelAttention, paged_attention_batched, paged_attention_cpu
from minipaged.attention.reference import paged_attention_reference

_BACKENDS = {"torch": paged_attention_reference, "torch_batched": paged_attention_batched, "cpu": paged_attention_cpu}
NEEDS_NUMBA = ("numba",)  # backends that register themselves when numba can be imported
# backend -> class(block_tables, context_lens, query_lens, block_size)
_PLANNERS = {"torch_batched": BatchedAttention, "cpu": KernelAttention}


def register_backend(name: str, fn, planner=None) -> None:
    """Make a backend selectable by name (the numba kernels register themselves this way); ``planner``
    optionally builds a step's per-layer attention once (see step_attention)."""
    _BACKENDS[name] = fn
    if planner is not None:
        _PLANNERS[name] = planner


def available_backends() -> list[str]:
    _load_optional_backends()
    return sorted(_BACKENDS)


def _load_optional_backends() -> None:
    """Import the backends built on numba on first use, so numba is imported only when one is asked for."""
    for name, module in zip(NEEDS_NUMBA, ("numba_backend",)):
        if name not in _BACKENDS:
            try:
                importlib.import_module(f"minipaged.attention.{module}")  # registers itself if numba is there
            except ImportError:  # numba is not installed (the "test" extra has it)
                pass


def _backend(name: str):
    if name not in _BACKENDS:
        _load_optional_backends()
    if name in NEEDS_NUMBA and name not in _BACKENDS:
        raise ValueError(f"backend={name!r} needs numba, which is not installed: pip install -e \".[test]\", "
                         f"or choose one of {available_backends()}")
    if name not in _BACKENDS:
        raise ValueError(f"backend={name!r} is not known; choose one of {available_backends()}")
    return _BACKENDS[name]


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None,
                    backend="torch"):
    return _backend(backend)(q, k_cache, v_cache, block_tables, context_lens, scale=scale, query_lens=query_lens)


class _Unplanned:
    """A step's attention for a backend with no planner: its function, called with the step's tables."""

    def __init__(self, fn, block_tables, context_lens, query_lens, block_size: int):
        self.fn, self.args = fn, (block_tables, context_lens)
        self.query_lens = query_lens

    def __call__(self, q, k_cache, v_cache):
        return self.fn(q, k_cache, v_cache, *self.args, query_lens=self.query_lens)


def step_attention(backend: str):
    """What builds one step's attention for ``backend`` (ValueError naming the choices if it is not
    known): called as ``(block_tables, context_lens, query_lens, block_size)``, it returns the
    ``attend(q, k_cache, v_cache) -> out`` that every layer of the step calls."""
    fn = _backend(backend)
    if backend in _PLANNERS:
        return _PLANNERS[backend]
    return functools.partial(_Unplanned, fn)
