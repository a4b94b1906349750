"""The oracle for every attention backend: naive paged attention in plain PyTorch.

For each sequence it gathers K and V through the block table into one dense tensor, then computes
softmax(q Kᵀ · scale) V. It is slow on purpose and easy to check by eye; every faster backend
(the numba kernels, later chapters' fast paths) is tested against it.

Shapes (the signature every backend shares):

    q            [num_tokens, num_heads, head_dim]      one row per query token
    k_cache      [num_blocks, block_size, num_kv_heads, head_dim]   (v_cache likewise)
    block_tables [num_seqs, max_blocks_per_seq] int32   logical block -> physical block
    context_lens [num_seqs] int32                       tokens of each sequence already in the cache
    query_lens   [num_seqs] int32 or None               None: one query per sequence (decode)
    -> out       [num_tokens, num_heads, head_dim]

With ``query_lens`` given, sequence i owns ``query_lens[i]`` consecutive rows of q; they are the last
tokens of its context, so query j of that run sits at position ``context_lens[i] - query_lens[i] + j``
and sees positions up to and including its own (a causal mask). This covers prefill over the paged
cache, chunked prefill and speculative verification.

Not handled: sliding windows, ALiBi, soft-capping; the math runs in fp32 whatever the input dtype.
"""

from __future__ import annotations

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """Read one sequence's K (or V) out of the paged cache, in logical order.

    cache [num_blocks, block_size, num_kv_heads, head_dim] -> [context_len, num_kv_heads, head_dim]
    """
    block_size = cache.shape[1]
    num_blocks_used = (context_len + block_size - 1) // block_size
    physical = block_table[:num_blocks_used].long()
    dense = cache[physical]  # [num_blocks_used, block_size, num_kv_heads, head_dim]
    return dense.reshape(-1, *cache.shape[2:])[:context_len]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal_offset: int):
    """Attention of q over a dense K/V of one sequence, with grouped-query heads.

    q [num_q, num_heads, head_dim]; k, v [ctx, num_kv_heads, head_dim] -> [num_q, num_heads, head_dim]
    Query row j sits at position causal_offset + j and sees keys 0 .. causal_offset + j.
    """
    num_q, num_heads, _ = q.shape
    ctx, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.float().repeat_interleave(group, dim=1)  # [ctx, num_heads, head_dim]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale  # [num_heads, num_q, ctx]
    query_pos = causal_offset + torch.arange(num_q, device=q.device)[:, None]
    key_pos = torch.arange(ctx, device=q.device)[None, :]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)  # computed in fp32, returned in q's dtype


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
    query_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs = block_tables.shape[0]
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if query_lens is None:
        query_lens = torch.ones(num_seqs, dtype=torch.int32)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    start = 0
    for i in range(num_seqs):
        ctx, nq = int(context_lens[i]), int(query_lens[i])
        k = gather_kv(k_cache, block_tables[i], ctx)
        v = gather_kv(v_cache, block_tables[i], ctx)
        rows = slice(start, start + nq)
        out[rows] = dense_attention(q[rows], k, v, scale, causal_offset=ctx - nq).to(q.dtype)
        start += nq
    return out
