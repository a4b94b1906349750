"""v3: the cache read as 8-byte words, each score summed across a few lanes, nothing staged in shared memory.

v1 and v2 copy K and V into shared memory two bytes at a time and compute from there, with four
barriers per tile. v3 keeps the whole inner loop in registers (decode, head_dim 64, fp16, GQA 3):

    grid = (num_seqs, num_kv_heads, row_tiles * P)       block = 128 threads = 16 lane groups of 8

    lane group g, lane j (8 lanes share one key; lane j owns words j and j+8 of a 16-word row:
                          16 of the key's 128 bytes, in two 8-byte loads):
      q:   its 8 values of each of the 3 query rows, scaled, in registers (loaded once, as words)
      per step (32 keys for the block, 2 for the group; the group's 2 keys lie in one KV block):
         1. 8 loads in flight: 2 keys x 2 words of K, and as many of V (one block-table read)
         2. unpack K (4 fp16 per word) and multiply: 3 rows x 2 keys partial dot products
         3. sum each across the 8 lanes: 3 butterfly shuffles, no barrier (group_sum)
         4. online softmax per row over the 2 scores (base 2: log2(e) is folded into q)
         5. unpack V, acc[row][8 values] = acc * alpha + sum_k p_k v_k
      end: the 16 lane groups' (m, l, acc) merge through shared memory, once per block

With P > 1 partitions (the context split to fill the GPU: v3_config.v3_partitions) every block
writes its partial (m, l, o) like v2, and the **last block of a row tile to finish** merges the P
partials itself (an atomic counter per row tile, reset by that block), so one launch does both.

Rows past a sequence's query rows, keys past the context or the causal limit, and keys past the
partition are masked with selects, never with early exits: every lane group runs the same number of
steps, which the simulator's shared-memory sum needs (its barriers must be reached by all threads),
and the shuffles need too (every lane of a warp takes part in each).

Sizes for other head dims and dtypes: v3_config.V3Config.for_shape. Device functions: v3_ops.py.

Not handled yet: 16-byte loads, prefetching the next step's words while computing this one, fp16
arithmetic (hfma2), tensor cores.
"""

from __future__ import annotations

from functools import cache

from numba import cuda, float32, int32, int64

from minipaged.attention.kernels.v3_config import V3Config
from minipaged.attention.kernels.v3_ops import make_v3_ops

NEG_INF = float32(-float("inf"))
LOG2E = float32(1.4426950408889634)  # exp(x) = 2 ** (x * LOG2E): scores are kept in base 2


@cache
def make_v3_kernel(cfg: V3Config, simulator: bool | None = None):
    unpack_word, group_sum, exp2, load_l2 = make_v3_ops(cfg, simulator)
    D, BLOCK, NT, R, L, U = cfg.head_dim, cfg.block_size, cfg.num_threads, cfg.rows, cfg.lanes, cfg.unroll
    WPL, EPW, EPL, G = cfg.words_per_lane, cfg.elems_per_word, cfg.elems_per_lane, cfg.lane_groups
    STEP = cfg.step_keys
    WPR = cfg.words_per_row
    SAME_BLOCK = BLOCK % U == 0  # then a group's U keys of a step lie in one KV block
    RED_THREADS = NT if cfg.reduce == "shared" else 1
    N = R * U          # scores of a step
    QN = R * EPL       # query (and output) values a lane holds
    WN = U * WPL       # K (and V) words a lane loads per step
    OUT_ITEMS = R * D

    @cuda.jit
    def paged_attention_v3(out, part_out, part_max, part_sum, counters, q, k_words, v_words, block_tables,
                           context_lens, query_start, query_lens, scale, num_partitions, partition_tokens):
        # out [num_tokens, num_heads, D] (fp16 or fp32); part_out [num_tokens, num_heads, P, D] fp32,
        # part_max, part_sum [num_tokens, num_heads, P] fp32 (base-2 max); counters [num_seqs *
        # num_kv_heads * row_tiles] int32, zero between launches.
        # q [num_tokens, num_heads, D / EPW] int64 words; k_words, v_words: the caches [num_blocks, BLOCK,
        # num_kv_heads, D] as one flat run of int64 words each (an index is then one multiply-add)
        seq = cuda.blockIdx.x
        kv_head = cuda.blockIdx.y
        row_tile = cuda.blockIdx.z // num_partitions
        part = cuda.blockIdx.z - row_tile * num_partitions
        row0 = row_tile * R
        group = q.shape[1] // cuda.gridDim.y  # grid y = KV heads
        ctx = context_lens[seq]
        q_len = query_lens[seq]
        q_start = query_start[seq]
        rows = min(R, q_len * group - row0)
        if rows <= 0:
            return  # the whole block leaves together
        tid = cuda.threadIdx.x
        lane = tid % L
        grp = tid // L
        first_limit = ctx - q_len + 1  # keys the first query token sees
        key_begin = part * partition_tokens
        key_end = min(key_begin + partition_tokens, first_limit + (row0 + rows - 1) // group)

        m_sh = cuda.shared.array((G, R), float32)
        l_sh = cuda.shared.array((G, R), float32)
        acc_sh = cuda.shared.array((G, R, D), float32)
        red_s = cuda.shared.array((RED_THREADS, N), float32)
        last_s = cuda.shared.array(1, int32)

        qv = cuda.local.array(QN, float32)     # this lane's slice of each query row
        acc = cuda.local.array(QN, float32)    # ... and of each output row
        m = cuda.local.array(R, float32)       # running max (base 2), the same in all lanes of a group
        den = cuda.local.array(R, float32)     # running sum of 2**(score - m)
        limit = cuda.local.array(R, int32)     # keys row r may see (causal)
        sc = cuda.local.array(N, float32)      # scores, then probabilities: [R, U]
        kw = cuda.local.array(WN, int64)       # the step's raw K words
        vw = cuda.local.array(WN, int64)       # ... and V words
        vals = cuda.local.array(EPL, float32)  # one key's unpacked slice

        qscale = scale * LOG2E  # both fp32: a Python float here would make the product fp64
        for r in range(R):
            rr = min(r, rows - 1)  # rows past `rows` repeat the last one: finite, never written
            qi = (row0 + rr) // group
            head = kv_head * group + (row0 + rr) - qi * group
            for w in range(WPL):
                unpack_word(qv, r * EPL + w * EPW, q[q_start + qi, head, lane + w * L])
            for e in range(EPL):
                qv[r * EPL + e] *= qscale
                acc[r * EPL + e] = float32(0.0)
            m[r] = NEG_INF
            den[r] = float32(0.0)
            limit[r] = first_limit + (row0 + rr) // group

        last_key = key_end - 1
        key_stride = cuda.gridDim.y * WPR  # words from one slot of a KV block to the next
        head_word = kv_head * WPR + lane
        for step_start in range(key_begin, key_end, STEP):  # the same trip count in every thread
            base = step_start + grp * U
            t0 = min(base, last_key)
            blk = block_tables[seq, t0 // BLOCK]
            row = (int64(blk) * BLOCK + (t0 - (t0 // BLOCK) * BLOCK)) * key_stride + head_word
            for u in range(U):  # 1. all loads first: 2 * U * WPL independent 8-byte loads in flight
                t = min(base + u, last_key)  # past the end: reload the last key, masked below
                if SAME_BLOCK:
                    at = row + (t - t0) * key_stride  # the group's keys sit in one KV block
                else:
                    b = block_tables[seq, t // BLOCK]
                    at = (int64(b) * BLOCK + (t - (t // BLOCK) * BLOCK)) * key_stride + head_word
                for w in range(WPL):
                    kw[u * WPL + w] = k_words[at + w * L]
                    vw[u * WPL + w] = v_words[at + w * L]
            for u in range(U):  # 2. partial dot products of this lane's slice
                for w in range(WPL):
                    unpack_word(vals, w * EPW, kw[u * WPL + w])
                for r in range(R):
                    dot = float32(0.0)
                    for e in range(EPL):
                        dot += qv[r * EPL + e] * vals[e]
                    sc[r * U + u] = dot
            group_sum(sc, red_s)  # 3. every lane of the group now holds the whole q . k
            for r in range(R):  # 4. online softmax over the step's U keys
                m_new = m[r]
                for u in range(U):
                    t = base + u
                    x = sc[r * U + u] if (t < limit[r] and t < key_end) else NEG_INF
                    sc[r * U + u] = x
                    m_new = max(m_new, x)
                m_ref = m_new if m_new != NEG_INF else float32(0.0)  # no key yet: p = 0, alpha = 0
                alpha = exp2(m[r] - m_ref)
                total = float32(0.0)
                for u in range(U):
                    p = exp2(sc[r * U + u] - m_ref)
                    sc[r * U + u] = p
                    total += p
                m[r] = m_new
                den[r] = den[r] * alpha + total
                for e in range(EPL):
                    acc[r * EPL + e] *= alpha
            for u in range(U):  # 5. p . V
                for w in range(WPL):
                    unpack_word(vals, w * EPW, vw[u * WPL + w])
                for r in range(R):
                    p = sc[r * U + u]
                    for e in range(EPL):
                        acc[r * EPL + e] += p * vals[e]

        # the block's G lane groups each hold a softmax over their own keys: merge them
        for r in range(R):
            if lane == 0:
                m_sh[grp, r] = m[r]
                l_sh[grp, r] = den[r]
            for w in range(WPL):
                for i in range(EPW):
                    acc_sh[grp, r, (lane + w * L) * EPW + i] = acc[r * EPL + w * EPW + i]
        cuda.syncthreads()
        for item in range(tid, OUT_ITEMS, NT):
            r = item // D
            d = item - r * D
            m_all = NEG_INF
            for g in range(G):
                m_all = max(m_all, m_sh[g, r])
            m_ref = m_all if m_all != NEG_INF else float32(0.0)
            total = float32(0.0)
            o = float32(0.0)
            for g in range(G):
                wgt = exp2(m_sh[g, r] - m_ref)
                total += l_sh[g, r] * wgt
                o += acc_sh[g, r, d] * wgt
            if r < rows:
                qi = (row0 + r) // group
                head = kv_head * group + (row0 + r) - qi * group
                if num_partitions == 1:
                    out[q_start + qi, head, d] = o / total  # total > 0: every row sees key 0
                else:
                    part_out[q_start + qi, head, part, d] = o / total if total > 0 else float32(0.0)
                    if d == 0:
                        part_max[q_start + qi, head, part] = m_all
                        part_sum[q_start + qi, head, part] = total
        if num_partitions == 1:
            return

        # P partitions: the last block of this row tile to get here merges all P partials
        cuda.threadfence()  # our partials are visible to every block before we take a ticket
        cuda.syncthreads()
        counter = (seq * cuda.gridDim.y + kv_head) * (cuda.gridDim.z // num_partitions) + row_tile
        if tid == 0:
            ticket = cuda.atomic.add(counters, counter, 1)
            last_s[0] = 1 if ticket == num_partitions - 1 else 0
        cuda.syncthreads()
        if last_s[0] == 0:
            return
        for item in range(tid, OUT_ITEMS, NT):
            r = item // D
            d = item - r * D
            if r < rows:
                qi = (row0 + r) // group
                head = kv_head * group + (row0 + r) - qi * group
                tok = q_start + qi
                m_all = NEG_INF
                for pp in range(num_partitions):
                    if load_l2(part_sum, (tok, head, int64(pp))) > 0:
                        m_all = max(m_all, load_l2(part_max, (tok, head, int64(pp))))
                total = float32(0.0)
                o = float32(0.0)
                for pp in range(num_partitions):
                    lp = load_l2(part_sum, (tok, head, int64(pp)))
                    if lp > 0:
                        wgt = lp * exp2(load_l2(part_max, (tok, head, int64(pp))) - m_all)
                        total += wgt
                        o += wgt * load_l2(part_out, (tok, head, int64(pp), d))
                out[tok, head, d] = o / total
        if tid == 0:
            counters[counter] = 0  # ready for the next launch

    return paged_attention_v3
