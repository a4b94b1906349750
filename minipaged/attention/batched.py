"""Paged attention in PyTorch for a whole batch at once: the fast CPU path, checked against reference.py.

The reference loops over sequences, and a decode step of 32 sequences in a 30-layer model makes
960 small attention calls; on a CPU that loop, not the arithmetic, dominates the step. This backend
does the same math with a handful of batched tensor operations:

    1. gather every sequence's blocks through its block table, padded to the longest (one
       index_select over the flattened tables): [S * max_blocks, block_size, KVH, Dh] -> [S, C, KVH, Dh]
    2. place each sequence's query rows in a padded [S, max_q, H, Dh] (query j of a sequence sits at
       position context_len - query_len + j);
    3. one masked softmax(q Kᵀ · scale) V, by torch's scaled_dot_product_attention with grouped
       query heads: a key is visible to a query if its position is not after the query's, which also
       hides the padding past the context;
    4. read the real query rows back out: [T, H, Dh].

Same signature as the reference (see reference.py), selected with ``backend="torch_batched"``. The
padding costs work and memory (S x H x max_q x C scores), so a batch with prompts in it runs the
decodes and the other short queries (up to SHORT_QUERY tokens: chapter 09's drafts) in one such call
and each longer prompt in a call of its own: otherwise every decode would be padded to the longest
prompt, the common case once chapter 08 chunks prompts into every step, and every prompt to the
longest one. The math runs in fp32, like the reference;
the sums are grouped differently, so results agree to rounding, not bit for bit.

Not handled: sliding windows, ALiBi, soft-capping.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SHORT_QUERY = 12  # query tokens a sequence may have and still be batched with the decodes


def paged_attention_batched(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None):
    if query_lens is not None and int(query_lens.max()) > SHORT_QUERY and len(query_lens) > 1:
        # prompts beside decodes or other prompts (chapter 08 mixes them at every step): the decodes
        # and other short queries (chapter 09's drafts) in one batched call, each longer prompt on its
        # own, so that nothing is padded to a prompt's length
        qlen = query_lens.to(torch.long).cpu()
        rows = torch.repeat_interleave(torch.arange(len(qlen)), qlen).to(q.device)  # [T]: whose query row
        short = qlen <= SHORT_QUERY
        parts = ([short] if bool(short.any()) else []) + [torch.arange(len(qlen)) == i
                                                           for i in torch.nonzero(~short).flatten().tolist()]
        out = torch.empty_like(q)
        for part in parts:
            part_rows = part.to(q.device)[rows]
            out[part_rows] = _batched(q[part_rows], k_cache, v_cache, block_tables[part.to(block_tables.device)],
                                      context_lens[part.to(context_lens.device)], scale, qlen[part])
        return out
    return _batched(q, k_cache, v_cache, block_tables, context_lens, scale, query_lens)


def _batched(q, k_cache, v_cache, block_tables, context_lens, scale, query_lens):
    num_seqs = block_tables.shape[0]
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if scale is None:
        scale = head_dim ** -0.5
    device = q.device
    ctx = context_lens.to(device=device, dtype=torch.long)  # [S]
    qlen = (torch.ones(num_seqs, dtype=torch.long, device=device) if query_lens is None
            else query_lens.to(device=device, dtype=torch.long))  # [S]
    max_q = int(qlen.max())
    max_blocks = int(((ctx + block_size - 1) // block_size).max())
    width = max_blocks * block_size
    tables = block_tables[:, :max_blocks].to(device=device, dtype=torch.long).clamp(min=0)  # padding: any block
    k = torch.index_select(k_cache, 0, tables.flatten()).view(num_seqs, width, num_kv_heads, head_dim)
    v = torch.index_select(v_cache, 0, tables.flatten()).view(num_seqs, width, num_kv_heads, head_dim)

    seq_of_row = torch.repeat_interleave(torch.arange(num_seqs, device=device), qlen)  # [T]
    first_row = torch.cumsum(qlen, 0) - qlen  # [S]
    j_of_row = torch.arange(num_tokens, device=device) - first_row[seq_of_row]  # [T]
    padded = q.new_zeros(num_seqs, max_q, num_heads, head_dim, dtype=torch.float32)
    padded[seq_of_row, j_of_row] = q.float()  # [S, max_q, H, Dh]

    query_pos = (ctx - qlen)[:, None] + torch.arange(max_q, device=device)[None, :]  # [S, max_q]
    key_pos = torch.arange(width, device=device)  # [C]
    visible = key_pos[None, None, :] <= query_pos[:, :, None]  # [S, max_q, C]: not later, not past the context
    out = F.scaled_dot_product_attention(  # heads first: [S, H, max_q, Dh] over [S, KVH, C, Dh]
        padded.transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2),
        attn_mask=visible[:, None], scale=scale, enable_gqa=num_heads != num_kv_heads)
    return out.transpose(1, 2)[seq_of_row, j_of_row].to(q.dtype)  # [T, H, Dh]
