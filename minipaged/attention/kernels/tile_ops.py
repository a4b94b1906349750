"""The device functions both kernels are made of: one block walks the context one tile at a time.

A block owns up to ``max_rows`` query rows that share one KV head: the heads of a GQA group, for one
or more query tokens of one sequence. Row r of the block is query token ``qi = (row0 + r) // group``
of its sequence and head ``kv_head * group + (row0 + r) % group``. Per tile of keys:

    load_kv_tile     all threads copy K[tile] and V[tile] (fp16 or fp32) into shared memory as fp32;
                     consecutive threads read consecutive dims, so each warp reads whole cache lines
    score_tile       one thread per (row, key): scores[r, t] = q_r . k_t, or -inf if masked
    softmax_step     one thread per row: the online-softmax update (new max, rescale, probabilities)
    accumulate_tile  one thread per (row, dim) slot: acc = acc * rescale + sum_t p[r, t] * v[t, dim]

``attend`` is the whole walk over a range of keys, shared memory included: v1 walks all the keys its
rows see, v2 one partition of them.

Everything goes through shared memory with __syncthreads between steps, never warp shuffles: that is
a little slower, but the same code then runs in numba's CUDA simulator, which has no shuffles.

Not handled yet: keeping tiles in fp16 in shared memory, vector (16-byte) loads, prefetching the next
tile while computing this one, spreading the softmax step over more threads. Those are the exercises
of chapter 10.
"""

from __future__ import annotations

import math
from collections import namedtuple
from functools import cache

from numba import cuda, float32, int32

from minipaged.attention.kernels.config import KernelConfig

NEG_INF = -math.inf

TileOps = namedtuple("TileOps", "load_query_rows init_rows load_kv_tile score_tile softmax_step "
                                "accumulate_tile zero_acc attend")


@cache
def make_tile_ops(cfg: KernelConfig) -> TileOps:
    """Device functions specialised to cfg's sizes (closure constants are compile-time constants)."""
    D, TILE, NT, SLOTS, BLOCK = cfg.head_dim, cfg.tile_tokens, cfg.num_threads, cfg.acc_slots, cfg.block_size
    MAX_ROWS = cfg.max_rows
    D_PAD = D + 1  # shared rows padded by one float: row t starts in bank (t * (D+1)) % 32, not all in bank 0
    CHUNK = cfg.chunk_tokens  # tokens of a tile that lie in one KV block
    CHUNKS = TILE // CHUNK
    CHUNK_ELEMENTS = CHUNK * D
    LOADS_PER_CHUNK = -(-CHUNK_ELEMENTS // NT)  # K (and V) elements each thread copies per chunk
    EVEN_SPLIT = CHUNK_ELEMENTS % NT == 0

    @cuda.jit(device=True)
    def load_query_rows(q_s, q, q_start, kv_head, group, row0, rows, scale):
        # q_s [max_rows, D+1] fp32  <-  q [num_tokens, num_heads, D], pre-multiplied by scale
        for i in range(cuda.threadIdx.x, rows * D, NT):
            r = i // D
            d = i - r * D
            qi = (row0 + r) // group
            head = kv_head * group + (row0 + r) - qi * group
            q_s[r, d] = float32(q[q_start + qi, head, d]) * scale

    @cuda.jit(device=True)
    def init_rows(m_s, l_s, limit_s, rows, row0, group, first_limit):
        # running max starts at -inf, running sum of exp at 0; limit_s[r] = how many keys row r sees
        # (its causal limit: first_limit = ctx - query_len + 1 for the sequence's first query token)
        r = cuda.threadIdx.x
        if r < rows:
            m_s[r] = NEG_INF
            l_s[r] = 0.0
            limit_s[r] = first_limit + (row0 + r) // group

    @cuda.jit(device=True)
    def zero_acc(acc):
        for j in range(SLOTS):
            acc[j] = 0.0

    @cuda.jit(device=True)
    def load_kv_tile(k_s, v_s, k_cache, v_cache, block_tables, seq, kv_head, tile_start, n):
        # k_s, v_s [TILE, D+1] fp32  <-  keys tile_start .. tile_start+n-1 of seq (n <= TILE); rows
        # n.. of a sequence's short last tile are zeroed, so the later steps can always loop over TILE.
        #
        # A tile is CHUNKS chunks of CHUNK tokens, each inside one KV block, so the block table is read
        # once per chunk. Thread tid copies elements tid, tid + NT, ... of each chunk's [CHUNK, D]
        # slice: consecutive threads read consecutive dims (whole cache lines per warp). The inner loop
        # has a constant trip count and no branch: the compiler unrolls it into one straight run of
        # loads that are all in flight at once, which is what it takes to approach peak bandwidth.
        # Past the end of the sequence a thread still loads, from a slot that exists (the last block's),
        # and stores 0 instead: a select, not a branch.
        last_block = (tile_start + n - 1) // BLOCK  # logical index of the sequence's last block here
        for c in range(CHUNKS):
            chunk_start = tile_start + c * CHUNK
            logical = min(chunk_start // BLOCK, last_block)  # BLOCK, CHUNK, D constant: shifts
            block = block_tables[seq, logical]  # physical block: anywhere in the pool, maybe shared
            first_slot = chunk_start - (chunk_start // BLOCK) * BLOCK
            for j in range(LOADS_PER_CHUNK):
                i = cuda.threadIdx.x + j * NT
                if not EVEN_SPLIT:  # a compile-time constant: the test costs nothing when the split is even
                    i = min(i, CHUNK_ELEMENTS - 1)  # spare threads repeat the chunk's last element
                s = i // D
                d = i - s * D
                t = c * CHUNK + s
                k = float32(k_cache[block, first_slot + s, kv_head, d])
                v = float32(v_cache[block, first_slot + s, kv_head, d])
                k_s[t, d] = k if t < n else float32(0.0)
                v_s[t, d] = v if t < n else float32(0.0)

    @cuda.jit(device=True)
    def score_tile(p_s, q_s, k_s, limit_s, rows, n, tile_start):
        # p_s [max_rows, TILE]: scaled q.k, or -inf where the key is past the row's causal limit
        for i in range(cuda.threadIdx.x, rows * TILE, NT):
            r = i // TILE
            t = i - r * TILE
            if t < n and tile_start + t < limit_s[r]:
                s = float32(0.0)
                for d in range(D):
                    s += q_s[r, d] * k_s[t, d]
                p_s[r, t] = s
            else:
                p_s[r, t] = NEG_INF

    @cuda.jit(device=True)
    def softmax_step(p_s, m_s, l_s, alpha_s, rows):
        # One thread per row. Turns scores into exp(score - new max) in place and keeps
        # m (running max), l (running sum of exp) and alpha = exp(old max - new max), the factor
        # by which everything accumulated so far must shrink. Masked keys hold -inf and become 0.
        # exercise 10.1: begin
        r = cuda.threadIdx.x
        if r < rows:
            m_old = m_s[r]
            m_new = m_old
            for t in range(TILE):
                m_new = max(m_new, p_s[r, t])
            if m_new == NEG_INF:  # no visible key yet: nothing to add, nothing to rescale
                alpha = float32(1.0)
                for t in range(TILE):
                    p_s[r, t] = 0.0
                total = float32(0.0)
            else:
                alpha = math.exp(m_old - m_new)  # exp(-inf) = 0 on the first visible tile
                total = float32(0.0)
                for t in range(TILE):
                    p = math.exp(p_s[r, t] - m_new)
                    p_s[r, t] = p
                    total += p
            m_s[r] = m_new
            l_s[r] = l_s[r] * alpha + total
            alpha_s[r] = alpha
        # exercise 10.1: end

    @cuda.jit(device=True)
    def accumulate_tile(acc, p_s, v_s, alpha_s, rows):
        # acc [SLOTS] fp32 in registers: slot j of this thread is element i = tid + j*NT of the
        # [max_rows, D] output, so consecutive threads own consecutive dims (conflict-free v_s reads).
        for j in range(SLOTS):
            i = cuda.threadIdx.x + j * NT
            r = i // D
            d = i - r * D
            if r < rows:
                a = acc[j] * alpha_s[r]
                for t in range(TILE):  # keys past the tile's end have p = 0 and v = 0
                    a += p_s[r, t] * v_s[t, d]
                acc[j] = a

    @cuda.jit(device=True)
    def attend(acc, q, q_start, k_cache, v_cache, block_tables, seq, kv_head, group, row0, rows, scale, first_limit,
               key_begin, key_end):
        # The block's rows over keys [key_begin, key_end) of the sequence, a tile at a time. Returns the
        # shared (m_s, l_s): for row r, m_s[r] is its largest score and l_s[r] its sum of exp(score - m_s[r]);
        # acc ends as each row's sum of exp(score - m_s[r]) v.
        # Shared memory, one array a line (numba's simulator tells shared arrays apart by their line):
        q_s = cuda.shared.array((MAX_ROWS, D_PAD), float32)  # the rows' queries, times scale
        k_s = cuda.shared.array((TILE, D_PAD), float32)  # one tile of keys ...
        v_s = cuda.shared.array((TILE, D_PAD), float32)  # ... and values
        p_s = cuda.shared.array((MAX_ROWS, TILE), float32)  # the tile's scores, then probabilities
        m_s = cuda.shared.array(MAX_ROWS, float32)  # per row: running max,
        l_s = cuda.shared.array(MAX_ROWS, float32)  # running sum,
        alpha_s = cuda.shared.array(MAX_ROWS, float32)  # this tile's rescale factor,
        limit_s = cuda.shared.array(MAX_ROWS, int32)  # and how many keys it sees
        load_query_rows(q_s, q, q_start, kv_head, group, row0, rows, scale)
        init_rows(m_s, l_s, limit_s, rows, row0, group, first_limit)
        zero_acc(acc)
        cuda.syncthreads()
        for tile_start in range(key_begin, key_end, TILE):
            n = min(TILE, key_end - tile_start)
            load_kv_tile(k_s, v_s, k_cache, v_cache, block_tables, seq, kv_head, tile_start, n)
            cuda.syncthreads()
            score_tile(p_s, q_s, k_s, limit_s, rows, n, tile_start)
            cuda.syncthreads()
            softmax_step(p_s, m_s, l_s, alpha_s, rows)
            cuda.syncthreads()
            accumulate_tile(acc, p_s, v_s, alpha_s, rows)
            cuda.syncthreads()  # the next tile overwrites k_s, v_s and p_s
        return m_s, l_s

    return TileOps(load_query_rows, init_rows, load_kv_tile, score_tile, softmax_step, accumulate_tile,
                   zero_acc, attend)
