"""v2: split long contexts into partitions walked in parallel, then merge the partial results.

v1 gives each (sequence, KV head, row tile) one block. With 4 sequences of 8,192 tokens and 3 KV
heads that is 12 blocks for a GPU with 132 SMs: most of the machine waits while 12 blocks each
stream 8,192 keys. v2 cuts every context into partitions of ``partition_tokens`` keys:

    grid = (num_seqs, num_kv_heads, row_tiles * num_partitions)

    block (s, h, z): row tile z // P, partition p = z % P, keys [p*T, (p+1)*T) of sequence s
        same tile loop as v1 over its own keys only  ->  for each of its rows:
        m_p   (max score seen),  l_p (sum of exp(score - m_p)),  o_p = (sum exp(score - m_p) v) / l_p

Then ``merge_partitions`` (grid = (num_tokens, num_heads), one thread per dim) combines them with the
same rescaling rule the online softmax uses inside a block:

    M = max_p m_p,   w_p = l_p * exp(m_p - M),   out = sum_p w_p o_p / sum_p w_p

A partition that holds no key a row may see (past the context, or past the row's causal limit)
reports l_p = 0 and is skipped. The partials cost an extra write and read of
[num_tokens, num_heads, P, D] fp32, small next to the K/V cache when contexts are long; the rule in
config.choose_num_partitions splits only when that pays.

Not handled yet: a single launch that does both phases (it needs a grid-wide barrier or atomics).
"""

from __future__ import annotations

import math
from functools import cache

from numba import cuda, float32

from minipaged.attention.kernels.config import KernelConfig
from minipaged.attention.kernels.tile_ops import NEG_INF, make_tile_ops


@cache
def make_v2_kernels(cfg: KernelConfig):
    """Returns (partition_kernel, merge_kernel) for cfg's sizes."""
    D, NT, MAX_ROWS, SLOTS = cfg.head_dim, cfg.num_threads, cfg.max_rows, cfg.acc_slots
    attend = make_tile_ops(cfg).attend

    @cuda.jit
    def paged_attention_v2_partition(part_out, part_max, part_sum, q, k_cache, v_cache, block_tables,
                                     context_lens, query_start, query_lens, scale, num_partitions,
                                     partition_tokens):
        # part_out [num_tokens, num_heads, P, D] fp32; part_max, part_sum [num_tokens, num_heads, P] fp32
        # other arguments as in v1
        seq = cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        row_tile = cuda.blockIdx.z // num_partitions
        part = cuda.blockIdx.z - row_tile * num_partitions
        row0 = row_tile * MAX_ROWS
        group = q.shape[1] // k_cache.shape[2]
        ctx = context_lens[seq]
        q_len = query_lens[seq]
        q_start = query_start[seq]
        rows = min(MAX_ROWS, q_len * group - row0)
        if rows <= 0:
            return
        first_limit = ctx - q_len + 1
        key_begin = part * partition_tokens
        key_end = min(key_begin + partition_tokens, first_limit + (row0 + rows - 1) // group)
        tid = cuda.threadIdx.x
        if key_begin >= key_end:  # nothing for any row here: say so, so the merge skips it
            if tid < rows:
                qi = (row0 + tid) // group
                head = kv_head * group + (row0 + tid) - qi * group
                part_max[q_start + qi, head, part] = NEG_INF
                part_sum[q_start + qi, head, part] = 0.0
            return

        acc = cuda.local.array(SLOTS, float32)
        m_s, l_s = attend(acc, q, q_start, k_cache, v_cache, block_tables, seq, kv_head, group, row0, rows, scale,
                          first_limit, key_begin, key_end)

        for j in range(SLOTS):
            i = tid + j * NT
            r = i // D
            d = i - r * D
            if r < rows:
                qi = (row0 + r) // group
                head = kv_head * group + (row0 + r) - qi * group
                l = l_s[r]
                part_out[q_start + qi, head, part, d] = acc[j] / l if l > 0 else float32(0.0)
        if tid < rows:
            qi = (row0 + tid) // group
            head = kv_head * group + (row0 + tid) - qi * group
            part_max[q_start + qi, head, part] = m_s[tid]
            part_sum[q_start + qi, head, part] = l_s[tid]

    @cuda.jit
    def merge_partitions(out, part_out, part_max, part_sum):
        # out [num_tokens, num_heads, D]  <-  the P partial results of each (token, head)
        # exercise 10.2: begin
        token = cuda.blockIdx.x
        head = cuda.blockIdx.y
        num_partitions = part_max.shape[2]
        m_all = float32(NEG_INF)  # a bare -inf is a Python float: float64, slow on a GPU
        for p in range(num_partitions):
            if part_sum[token, head, p] > 0:
                m_all = max(m_all, part_max[token, head, p])
        total = float32(0.0)
        for p in range(num_partitions):
            lp = part_sum[token, head, p]
            if lp > 0:
                total += lp * math.exp(part_max[token, head, p] - m_all)
        for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
            a = float32(0.0)
            for p in range(num_partitions):
                lp = part_sum[token, head, p]
                if lp > 0:
                    a += lp * math.exp(part_max[token, head, p] - m_all) * part_out[token, head, p, d]
            out[token, head, d] = a / total
        # exercise 10.2: end

    return paged_attention_v2_partition, merge_partitions
