"""Paged attention for a whole batch at once: the CPU's fast paths, "torch_batched" and "cpu", checked
against reference.py.

The reference loops over sequences: 32 sequences in 30 layers make 960 small calls a step, and on a
CPU the loop, not the arithmetic, dominates. ``BatchedAttention`` does the same math in a few tensor
operations:

    1. gather each sequence's blocks through its table, padded: [S * max_blocks, bs, KVH, Dh] -> [S, C, KVH, Dh]
    2. place query j of a sequence at position context_len - query_len + j of a padded [S, max_q, H, Dh],
       and fold the G = H / KVH query heads of a K/V head into its rows: [S, KVH, G * max_q, Dh]
    3. one masked softmax(q Kᵀ · scale) V (torch's SDPA): a key is visible to the queries not before it
    4. unfold and read the real query rows back: [T, H, Dh]

What depends only on the tables and lengths (gather indices, positions, mask) is built once per step
and used in every layer. Decodes and other short queries (up to SHORT_QUERY tokens, chapter 09's
drafts) go in one call; each longer prompt gets its own, so no decode is padded to a prompt's length.
The sums are grouped differently from the reference: equal to rounding, not bit for bit.

The "cpu" backend (``KernelAttention``) sends the short queries to one compiled loop instead
(``paged_attention`` in csrc/cpu_ops.cpp), which reads each key row where it lies in the pool, with
no gathered copy: per (sequence, K/V head), scores over the keys it sees, a two-pass softmax, the
weighted sum of V. It is chapter 10's v1 kernel written for a CPU; vLLM's CPU backend splits the same
way (its own kernel for decodes, SDPA for prompts). Without the compiled kernels, or for q other
than float32 on the CPU, every group takes the batched path: the same results, more slowly.

Not handled: sliding windows, ALiBi, soft-capping.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minipaged.model import kernels

SHORT_QUERY = 12  # query tokens a sequence may have and still be batched with the decodes


class _Group:
    """Some sequences attended in one SDPA call: their gather indices, query rows and mask."""

    def __init__(self, tables, ctx, qlen, token_rows, block_size, device):
        num_seqs = len(ctx)
        self.token_rows = token_rows  # [T_group] rows of q that belong here (None: all of them, in order)
        self.num_seqs, self.max_q = num_seqs, int(qlen.max())
        max_blocks = int(((ctx + block_size - 1) // block_size).max())
        self.width = max_blocks * block_size  # C: keys per sequence after padding
        self.blocks = tables[:, :max_blocks].to(torch.long).clamp(min=0).flatten()  # [S * max_blocks]
        if self.max_q == 1:
            self.seq_of_row = self.j_of_row = None  # the queries are [S, 1, H, Dh] already
        else:
            self.seq_of_row = torch.repeat_interleave(torch.arange(num_seqs, device=device), qlen)  # [T]
            first_row = torch.cumsum(qlen, 0) - qlen  # [S]
            self.j_of_row = torch.arange(int(qlen.sum()), device=device) - first_row[self.seq_of_row]  # [T]
        query_pos = (ctx - qlen)[:, None] + torch.arange(self.max_q, device=device)[None, :]  # [S, max_q]
        key_pos = torch.arange(self.width, device=device)  # [C]
        self.visible = key_pos[None, None, :] <= query_pos[:, :, None]  # [S, max_q, C]

    def mask(self, group_size: int):
        """[S, 1, G * max_q, C]: the mask of each folded query row (the G heads share it)."""
        s, q, c = self.visible.shape
        return self.visible[:, None, None].expand(s, 1, group_size, q, c).reshape(s, 1, group_size * q, c)

    def run(self, q, k_cache, v_cache, scale):  # q [T_group, H, Dh]
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = k_cache.shape[2]
        g = num_heads // num_kv_heads
        s, m = self.num_seqs, self.max_q
        k = torch.index_select(k_cache, 0, self.blocks).view(s, self.width, num_kv_heads, head_dim)
        v = torch.index_select(v_cache, 0, self.blocks).view(s, self.width, num_kv_heads, head_dim)
        if m == 1:
            padded = q.float().reshape(s, 1, num_heads, head_dim)
        else:
            padded = q.new_zeros(s, m, num_heads, head_dim, dtype=torch.float32)
            padded[self.seq_of_row, self.j_of_row] = q.float()  # [S, max_q, H, Dh]
        # fold the G query heads of each K/V head into its rows: [S, KVH, G * max_q, Dh]
        folded = padded.view(s, m, num_kv_heads, g, head_dim).permute(0, 2, 3, 1, 4).reshape(
            s, num_kv_heads, g * m, head_dim)
        out = F.scaled_dot_product_attention(folded, k.float().transpose(1, 2), v.float().transpose(1, 2),
                                             attn_mask=self.mask(g), scale=scale)  # [S, KVH, G * max_q, Dh]
        out = out.view(s, num_kv_heads, g, m, head_dim).permute(0, 3, 1, 2, 4).reshape(s, m, num_heads, head_dim)
        if m == 1:
            return out.view(s, num_heads, head_dim)
        return out[self.seq_of_row, self.j_of_row]  # [T_group, H, Dh]


class BatchedAttention:
    """A step's attention for every layer: built once from the block tables and lengths, then called
    with each layer's q and caches."""

    def __init__(self, block_tables, context_lens, query_lens, block_size: int):
        device = block_tables.device
        ctx = context_lens.to(device=device, dtype=torch.long)  # [S]
        qlen = (torch.ones_like(ctx) if query_lens is None else query_lens.to(device=device, dtype=torch.long))
        if int(qlen.max()) <= SHORT_QUERY or len(qlen) == 1:
            self.groups = [self.make_group(block_tables, ctx, qlen, None, block_size, device)]
            return
        # prompts beside decodes or other prompts (chapter 08 mixes them at every step): the decodes and
        # other short queries in one call, each longer prompt on its own, so nothing is padded to a prompt
        rows = torch.repeat_interleave(torch.arange(len(qlen), device=device), qlen)  # [T]: whose query row
        short = qlen <= SHORT_QUERY
        parts = ([short] if bool(short.any()) else []) + [torch.arange(len(qlen), device=device) == i
                                                           for i in torch.nonzero(~short).flatten().tolist()]
        self.groups = [self.make_group(block_tables[part], ctx[part], qlen[part], torch.nonzero(part[rows]).flatten(),
                                       block_size, device) for part in parts]

    def make_group(self, tables, ctx, qlen, token_rows, block_size, device):
        """How one group of sequences is attended (KernelAttention, below, sends the short queries elsewhere)."""
        return _Group(tables, ctx, qlen, token_rows, block_size, device)

    def __call__(self, q, k_cache, v_cache, scale=None):  # q [T, H, Dh] -> [T, H, Dh]
        if scale is None:
            scale = q.shape[-1] ** -0.5
        if len(self.groups) == 1 and self.groups[0].token_rows is None:
            return self.groups[0].run(q, k_cache, v_cache, scale).to(q.dtype)
        out = torch.empty_like(q)
        for group in self.groups:
            out[group.token_rows] = group.run(q[group.token_rows], k_cache, v_cache, scale).to(q.dtype)
        return out


def paged_attention_batched(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None):
    return BatchedAttention(block_tables, context_lens, query_lens, k_cache.shape[1])(q, k_cache, v_cache, scale)


# ---- the "cpu" backend: decodes through the compiled kernel (chapter 10's v1, on a CPU) ----------


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
            self.fallback = self.fallback or _Group(*self.args)  # the batched path above
            return self.fallback.run(q, k_cache, v_cache, scale)
        return kernels.ops().paged_attention(q, k_cache, v_cache, self.tables, self.context_lens,
                                             self.query_starts, self.query_lens, scale)


class KernelAttention(BatchedAttention):
    """A step's attention for every layer (see attention/__init__.py's step_attention): the groups of
    short queries go to the compiled kernel, each long prompt to SDPA."""

    def make_group(self, tables, ctx, qlen, token_rows, block_size, device):
        if device.type == "cpu" and int(qlen.max()) <= SHORT_QUERY:
            return _KernelGroup(tables, ctx, qlen, token_rows, block_size, device)
        return super().make_group(tables, ctx, qlen, token_rows, block_size, device)


def paged_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None):
    return KernelAttention(block_tables, context_lens, query_lens, k_cache.shape[1])(q, k_cache, v_cache, scale)
