"""The K/V tensors behind every pooled KV policy (chapters 01-10), and the `attend` that uses them.

The bookkeeping policies (contiguous.py ... prefix_cache.py) only hand out slot numbers. This module
holds the memory those numbers point into, one pair of tensors per layer:

    k_cache[layer], v_cache[layer]   [num_blocks, block_size, num_kv_heads, head_dim]

A slot s is row s of the cache seen flat ([num_blocks * block_size, KVH, Dh]): block s // block_size,
offset s % block_size. The contiguous arena is the same memory with block_size 1.

Each forward pass gets a `PagedBatch` describing the step: where each new token's K and V go (the
slot mapping) and, per sequence, its block table, how many tokens it has cached after this step and
how many of those are new. `attend` writes the new K/V into their slots, then runs paged attention
through the block tables with the backend the configuration chose (EngineArgs.attention_backend:
"torch" is the reference, "cpu" and "numba" the kernels).

Swapping (chapter 06) adds a second set of the same tensors in host memory, ``SwapKVCache``, and
``copy_blocks(src_cache, dst_cache, pairs)`` to move whole blocks between the two.

Not handled: quantized KV, overlapping the swap copies with compute.
"""

from __future__ import annotations

import torch

from minipaged.attention import attention_for_step
from minipaged.model import kernels
from minipaged.model.config import ModelConfig


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, KVH, Dh] go to flat rows `slots` [T] of this layer's cache."""
        if kernels.use(k):  # the two lines below in one compiled call (model/kernels.py)
            return kernels.ops().write_kv(k, v, self.k[layer], self.v[layer], slots)
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v)


class PagedBatch:
    """One forward pass over several sequences whose K/V live in a PagedKVCache."""

    def __init__(self, cache: PagedKVCache, slot_mapping: list[int], block_tables: list[list[int]],
                 context_lens: list[int], query_lens: list[int], backend: str):
        device = cache.k[0].device
        width = max(len(t) for t in block_tables)
        padded = [t + [0] * (width - len(t)) for t in block_tables]  # padding is never read
        self.cache = cache
        self.slots = torch.tensor(slot_mapping, dtype=torch.long, device=device)  # [T]
        self.block_tables = torch.tensor(padded, dtype=torch.int32, device=device)  # [S, max_blocks]
        self.context_lens = torch.tensor(context_lens, dtype=torch.int32, device=device)  # [S]
        self.query_lens = torch.tensor(query_lens, dtype=torch.int32, device=device)  # [S]
        self.backend = backend
        # what attention needs besides q and the caches is the same in every layer: built once here
        self.attention = attention_for_step(backend, self.block_tables, self.context_lens, self.query_lens,
                                            cache.block_size)

    def attend(self, layer: int, q, k, v):  # q [T, H, Dh]; k, v [T, KVH, Dh]
        self.cache.write(layer, self.slots, k, v)
        return self.attention(q, self.cache.k[layer], self.cache.v[layer])


class SwapKVCache(PagedKVCache):
    """The CPU side of swapping: the same layout, in host memory (pinned when there is a GPU, so the
    copies can use DMA). Block numbers are those of kv/swap.py's SwapSpace."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32):
        super().__init__(cfg, num_blocks, block_size, dtype, "cpu")
        if torch.cuda.is_available():
            self.k = [t.pin_memory() for t in self.k]
            self.v = [t.pin_memory() for t in self.v]


def copy_blocks(src: PagedKVCache, dst: PagedKVCache, pairs: list[tuple[int, int]]) -> None:
    """Copy whole blocks, every layer's K and V: block s of ``src`` to block d of ``dst`` for each
    (s, d) in pairs. ``src`` and ``dst`` may be the same cache (copy-on-write) or two (swapping)."""
    if not pairs:
        return
    from_blocks = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=src.k[0].device)
    to_blocks = torch.tensor([d for _, d in pairs], dtype=torch.long, device=dst.k[0].device)
    for layer in range(len(src.k)):
        dst.k[layer][to_blocks] = src.k[layer][from_blocks].to(dst.k[layer].device)  # [pairs, bs, KVH, Dh]
        dst.v[layer][to_blocks] = src.v[layer][from_blocks].to(dst.v[layer].device)
