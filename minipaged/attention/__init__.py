"""Attention backends behind one signature (see reference.py for the shapes).

    paged_attention(q, k_cache, v_cache, block_tables, context_lens, *, scale=None,
                    query_lens=None, backend="torch")

Backends:
    "torch"          the naive PyTorch reference: gather through the block table, dense softmax (the oracle)
    "torch_batched"  the same math in a few batched tensor operations (batched.py): the fast CPU path
    "numba"          chapter 10's numba.cuda kernels (numba_backend.py, kernels/), loaded on first use; on a
                     machine without a GPU they run in numba's CUDA simulator
"""

from __future__ import annotations

from minipaged.attention.batched import paged_attention_batched
from minipaged.attention.reference import paged_attention_reference

_BACKENDS = {"torch": paged_attention_reference, "torch_batched": paged_attention_batched}


def register_backend(name: str, fn) -> None:
    """Make a backend selectable by name (the numba kernels register themselves this way)."""
    _BACKENDS[name] = fn


def available_backends() -> list[str]:
    _load_optional_backends()
    return sorted(_BACKENDS)


def _load_optional_backends() -> None:
    """Import optional backends on first use, so numba is only imported when asked for."""
    if "numba" not in _BACKENDS:
        try:
            import minipaged.attention.numba_backend  # noqa: F401  (registers "numba")
        except ImportError:
            pass


def paged_attention(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None,
                    backend="torch"):
    if backend not in _BACKENDS:
        _load_optional_backends()
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} is not known; choose one of {available_backends()}")
    return _BACKENDS[backend](q, k_cache, v_cache, block_tables, context_lens, scale=scale,
                              query_lens=query_lens)
