"""v1: one thread block per (sequence, KV head, row tile), walking the whole context with online softmax.

Grid and data (decode, GQA group of 3 heads, one query token per sequence):

    grid = (num_seqs, num_kv_heads, row_tiles)        block = 128 threads

    block (s, h, 0):   rows = the 3 query heads that read KV head h  (q_s in shared memory)
                       for each tile of up to TILE keys of sequence s:
                           K[tile], V[tile] -> shared  (read from HBM once for all 3 heads)
                           scores [3, TILE] -> probabilities -> acc [3, D] += p @ V[tile]
                       out[s, 3h:3h+3, :] = acc / running sum

Serving the whole group from one block is the point: the classic PagedAttention kernel gives each
query head its own block, so with GQA every K and V element is fetched once per query head of its
group (3x for SmolLM2, 4x for Llama-3-8B). Here it is fetched once.

With several query tokens per sequence (prefill over the cache, chunked prefill, speculative
verification) the rows are (query token, head) pairs; more than ``max_rows`` of them spill onto more
blocks along grid z, each of which reads the context again. Row r only sees keys up to its own
position (the causal mask), and a block stops at the furthest key any of its rows can see.

Not handled yet: a block walks its context alone, so a few long sequences leave most of the GPU
idle; v2 (v2_split.py) splits the walk.
"""

from __future__ import annotations

from functools import cache

from numba import cuda, float32

from minipaged.attention.kernels.config import KernelConfig
from minipaged.attention.kernels.tile_ops import make_tile_ops


@cache
def make_v1_kernel(cfg: KernelConfig):
    D, NT, MAX_ROWS, SLOTS = cfg.head_dim, cfg.num_threads, cfg.max_rows, cfg.acc_slots
    attend = make_tile_ops(cfg).attend

    @cuda.jit
    def paged_attention_v1(out, q, k_cache, v_cache, block_tables, context_lens, query_start, query_lens,
                           scale):
        # out, q [num_tokens, num_heads, D]; k_cache, v_cache [num_blocks, block_size, num_kv_heads, D]
        # block_tables [num_seqs, max_blocks] int32; context_lens, query_start, query_lens [num_seqs] int32
        seq = cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        row0 = cuda.blockIdx.z * MAX_ROWS
        group = q.shape[1] // k_cache.shape[2]
        ctx = context_lens[seq]
        q_len = query_lens[seq]
        rows = min(MAX_ROWS, q_len * group - row0)
        if rows <= 0:
            return  # the whole block leaves together: no thread is left waiting at a barrier

        first_limit = ctx - q_len + 1  # keys visible to the sequence's first query token
        key_end = first_limit + (row0 + rows - 1) // group  # ... and to this block's last row
        q_start = query_start[seq]
        acc = cuda.local.array(SLOTS, float32)  # this thread's output slots, in registers
        _, l_s = attend(acc, q, q_start, k_cache, v_cache, block_tables, seq, kv_head, group, row0, rows, scale,
                        first_limit, 0, key_end)

        for j in range(SLOTS):
            i = cuda.threadIdx.x + j * NT
            r = i // D
            d = i - r * D
            if r < rows:
                qi = (row0 + r) // group
                head = kv_head * group + (row0 + r) - qi * group
                out[q_start + qi, head, d] = acc[j] / l_s[r]  # l > 0: every row sees key 0

    return paged_attention_v1
