"""The "cpu" attention backend: short queries (decodes) through one compiled kernel that reads the paged
cache where it lies, prompts through batched.py's SDPA. Checked against reference.py.

batched.py's decode attention is a handful of tensor operations per layer: gather every sequence's
blocks into a padded copy, fold the query heads, run SDPA, unfold. At 32 sequences the gather alone
copies every cached K/V row of the step, 30 times a step, before SDPA reads it all again. This backend
does the same math, for the queries of up to SHORT_QUERY tokens, in one C++ loop
(``paged_attention`` in minipaged/csrc/cpu_ops.cpp, built by model/kernels.py):

    for each (sequence, K/V head), spread over PyTorch's threads:
        for each key position t the sequence's queries can see:   # walks its block table
            row = K[table[t // block_size], t % block_size, kv_head]   # [Dh], read in place
            score[r, t] = (q_r · row) * scale       # r: the G query heads of kv_head, per query token
        p = softmax(score) along t, over the keys each row sees   # two passes: max, then exp / sum
        out_r = Σ_t p[r, t] · V[block(t), offset(t), kv_head]

It is chapter 10's v1 kernel written for a CPU: a (sequence, K/V head) per job where the GPU gives a
thread block to a (sequence, K/V head, row tile), loops where the GPU has warps. vLLM's CPU backend
makes the same split: its own kernel for decodes, SDPA for prompts. Longer queries (prompts, chapter
08's chunks) keep batched.py's path: for them the work is a real matrix product, which SDPA does far
better than a loop.

When the kernels could not be built (no C++ compiler), or q is not float32 on the CPU, every group
takes batched.py's path instead: the same results, more slowly.

Not handled: sliding windows, ALiBi, soft-capping.
"""

from __future__ import annotations

import torch

from minipaged.attention.batched import SHORT_QUERY, BatchedAttention, _Group
from minipaged.model import kernels


class _KernelGroup:
    """Sequences whose queries are all short, attended by the compiled kernel (same calls as
    batched.py's _Group)."""

    def __init__(self, tables, ctx, qlen, token_rows, block_size, device):
        self.args, self.fallback = (tables, ctx, qlen, token_rows, block_size, device), None
        self.token_rows = token_rows
        self.tables = tables.to(torch.int64).contiguous()  # [S, max_blocks]
        self.context_lens = ctx.to(torch.int64)  # [S]
        self.query_lens = qlen.to(torch.int64)  # [S]
        self.query_starts = torch.cumsum(self.query_lens, 0) - self.query_lens  # [S]: each one's first row

    def run(self, q, k_cache, v_cache, scale):  # q [T_group, H, Dh] -> [T_group, H, Dh]
        if q.dtype != torch.float32 or k_cache.dtype != torch.float32 or kernels.ops() is None:
            self.fallback = self.fallback or _Group(*self.args)  # batched.py's path
            return self.fallback.run(q, k_cache, v_cache, scale)
        return kernels.ops().paged_attention(q, k_cache, v_cache, self.tables, self.context_lens,
                                             self.query_starts, self.query_lens, scale)


class KernelAttention(BatchedAttention):
    """A step's attention for every layer (see attention_for_step): the groups of short queries go to
    the compiled kernel, each long prompt to SDPA."""

    def make_group(self, tables, ctx, qlen, token_rows, block_size, device):
        if device.type == "cpu" and int(qlen.max()) <= SHORT_QUERY:
            return _KernelGroup(tables, ctx, qlen, token_rows, block_size, device)
        return super().make_group(tables, ctx, qlen, token_rows, block_size, device)


def paged_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None):
    return KernelAttention(block_tables, context_lens, query_lens, k_cache.shape[1])(q, k_cache, v_cache, scale)
