"""Focused checks for chapter 10's graded exercises, small enough for numba's CUDA simulator: the
online-softmax step (tile_ops.softmax_step) and v2's merge of partitions (v2_split.merge_partitions),
each run alone on hand-made inputs and compared with softmax computed in float64 by NumPy; and v3's
unpacking of an 8-byte word (v3_ops.unpack_word), compared with NumPy's view of the same bytes."""

import math

import numpy as np
import pytest

from minipaged.attention.kernels.config import KernelConfig

# numba after this directory's conftest has chosen the simulator (or not); the kernel below must see
# `cuda` as a module global, which the simulator swaps for its own while a kernel runs
pytest.importorskip("numba", reason="numba is not installed: pip install -e \".[test]\"")
from numba import cuda, float32  # noqa: E402

CFG = KernelConfig.for_simulator(head_dim=16)  # 8-key tiles, 8 rows, 32 threads
TILE, ROWS, NT = CFG.tile_tokens, CFG.max_rows, CFG.num_threads
INF = math.inf


def scores_for_the_softmax_step(rng):
    """[num_tiles, max_rows, TILE] scores, -inf where a key is masked, one row per situation."""
    tiles = 4
    s = rng.normal(size=(tiles, ROWS, TILE))
    s[:, 0] += np.arange(tiles)[:, None] * 2.0  # the max grows tile after tile: earlier tiles shrink
    s[0, 1] = -INF  # nothing visible in the first tile, then keys appear
    s[3, 2, 3:] = -INF  # the causal limit ends inside the last tile
    s[:, 3] = s[:, 3] * 5 + 90.0  # large scores: exp(score) alone would overflow fp32
    s[:, 4] -= np.arange(tiles)[:, None] * 3.0  # the max is in the first tile and stays
    s[:, 5] = -INF  # no visible key at all (a row of a v2 partition that lies past its causal limit)
    s[1:, 6] = -INF  # only the first tile is visible
    return s.astype(np.float32)


def run_softmax_steps(numba_cuda, scores, rows):
    """Feed the tiles one after another through softmax_step in one block; returns, after each tile,
    the probabilities p, the running max m, the running sum l and the rescale factor alpha."""
    from minipaged.attention.kernels.tile_ops import make_tile_ops

    softmax_step = make_tile_ops(CFG).softmax_step

    @cuda.jit
    def steps(scores, p_out, m_out, l_out, alpha_out, rows):
        p_s = cuda.shared.array((ROWS, TILE), float32)
        m_s = cuda.shared.array(ROWS, float32)
        l_s = cuda.shared.array(ROWS, float32)
        alpha_s = cuda.shared.array(ROWS, float32)
        tid = cuda.threadIdx.x
        if tid < ROWS:
            m_s[tid] = -INF
            l_s[tid] = 0.0
            alpha_s[tid] = -1.0
        cuda.syncthreads()
        for tile in range(scores.shape[0]):
            for i in range(tid, ROWS * TILE, NT):
                p_s[i // TILE, i % TILE] = scores[tile, i // TILE, i % TILE]
            cuda.syncthreads()
            softmax_step(p_s, m_s, l_s, alpha_s, rows)
            cuda.syncthreads()
            for i in range(tid, ROWS * TILE, NT):
                p_out[tile, i // TILE, i % TILE] = p_s[i // TILE, i % TILE]
            if tid < ROWS:
                m_out[tile, tid] = m_s[tid]
                l_out[tile, tid] = l_s[tid]
                alpha_out[tile, tid] = alpha_s[tid]
            cuda.syncthreads()

    tiles = scores.shape[0]
    p = np.full((tiles, ROWS, TILE), np.nan, np.float32)
    m, l, alpha = (np.full((tiles, ROWS), np.nan, np.float32) for _ in range(3))
    steps[1, NT](scores, p, m, l, alpha, np.int32(rows))
    return p, m, l, alpha


def test_softmax_step_keeps_the_running_max_sum_and_rescale(numba_cuda):
    scores = scores_for_the_softmax_step(np.random.default_rng(0))
    rows = 7  # row 7 belongs to no query: the step leaves it alone
    p, m, l, alpha = run_softmax_steps(numba_cuda, scores, rows)
    s = scores.astype(np.float64)
    for r in range(rows):
        for tile in range(len(s)):
            seen = s[:tile + 1, r].ravel()
            m_now = seen.max()  # -inf while no key has been visible
            assert m[tile, r] == pytest.approx(m_now, rel=1e-6), f"running max, row {r} tile {tile}"
            if m_now == -INF:
                assert l[tile, r] == 0 and (p[tile, r] == 0).all(), f"row {r} tile {tile}: no visible key yet"
                assert alpha[tile, r] == 1, f"row {r} tile {tile}: nothing to rescale, alpha must be 1"
                continue
            m_before = s[:tile, r].max() if tile else -INF
            np.testing.assert_allclose(p[tile, r], np.exp(s[tile, r] - m_now), rtol=1e-5, atol=1e-30,
                                       err_msg=f"probabilities exp(score - running max), row {r} tile {tile}")
            assert l[tile, r] == pytest.approx(np.exp(seen - m_now).sum(), rel=1e-5), f"running sum, row {r}"
            assert alpha[tile, r] == pytest.approx(math.exp(m_before - m_now), rel=1e-5, abs=1e-30), \
                f"alpha = exp(old max - new max), row {r} tile {tile}"
    assert np.isfinite(p[:, :rows]).all() and np.isfinite(l[:, :rows]).all(), "a NaN or inf escaped"
    assert (m[:, rows] == -INF).all() and (l[:, rows] == 0).all(), "a row past `rows` was changed"


def test_softmax_steps_rescaled_give_the_softmax_of_the_whole_row(numba_cuda):
    """What the kernel does with them: p of tile j times the alphas of every later tile, over the final
    l, is the softmax of the row over all its keys."""
    scores = scores_for_the_softmax_step(np.random.default_rng(1))
    rows = ROWS
    p, m, l, alpha = run_softmax_steps(numba_cuda, scores, rows)
    tiles = len(scores)
    for r in range(rows):
        flat = scores[:, r].astype(np.float64).ravel()
        if np.isneginf(flat).all():
            assert l[-1, r] == 0
            continue
        want = np.exp(flat - flat.max()) / np.exp(flat - flat.max()).sum()
        later = [np.prod(alpha[j + 1:, r].astype(np.float64)) for j in range(tiles)]
        got = np.concatenate([p[j, r] * later[j] for j in range(tiles)]) / l[-1, r]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"row {r}")


def partials(scores, values, bounds):
    """What v2's partition blocks report for one row: per partition [a, z) of the keys, the max score m,
    l = sum exp(score - m) and o = sum exp(score - m) v / l; an empty partition has l = 0, m = -inf,
    and an output nobody wrote (NaN here: the merge must not read it)."""
    m, l, o = [], [], []
    for a, z in bounds:
        s, v = scores[a:z], values[a:z]
        if len(s) == 0 or np.isneginf(s).all():
            m.append(-INF), l.append(0.0), o.append(np.full(values.shape[1], np.nan))
            continue
        e = np.exp(s - s.max())
        m.append(s.max()), l.append(e.sum()), o.append(e @ v / e.sum())
    return np.array(m), np.array(l), np.array(o)


def test_merge_partitions_weighs_each_partition_by_its_share_of_the_softmax(numba_cuda):
    from minipaged.attention.kernels.v2_split import make_v2_kernels

    rng = np.random.default_rng(2)
    D, P = CFG.head_dim, 4
    cases = [  # (scores of one row's keys, partition bounds)
        (rng.normal(size=40), [(0, 16), (16, 32), (32, 40), (40, 48)]),  # the last partition is past the context
        (rng.normal(size=40) * 4 + 100.0, [(0, 10), (10, 20), (20, 30), (30, 40)]),  # exp(m_p) would overflow
        (np.r_[rng.normal(size=12) - 30.0, rng.normal(size=12) + 30.0], [(0, 12), (12, 24), (24, 24), (24, 24)]),
        (rng.normal(size=5), [(0, 5), (5, 5), (5, 5), (5, 5)]),  # one partition holds every key
        (rng.normal(size=9), [(0, 0), (0, 0), (0, 9), (9, 9)]),  # the only keys are in a later partition
    ]
    num_tokens, num_heads = len(cases), 2
    part_out = np.zeros((num_tokens, num_heads, P, D), np.float32)
    part_max = np.zeros((num_tokens, num_heads, P), np.float32)
    part_sum = np.zeros((num_tokens, num_heads, P), np.float32)
    want = np.zeros((num_tokens, num_heads, D))
    for token, (scores, bounds) in enumerate(cases):
        for head in range(num_heads):
            v = rng.normal(size=(len(scores), D))
            s = scores + head  # the heads differ a little
            m, l, o = partials(s, v, bounds)
            part_max[token, head], part_sum[token, head], part_out[token, head] = m, l, o
            want[token, head] = np.exp(s - s.max()) @ v / np.exp(s - s.max()).sum()  # the whole softmax
    out = np.full((num_tokens, num_heads, D), np.nan, np.float32)
    merge = make_v2_kernels(CFG)[1]
    merge[(num_tokens, num_heads), D](out, part_out, part_max, part_sum)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_merge_partitions_with_fewer_threads_than_dims(numba_cuda):
    """A block may have fewer threads than head_dim: each thread then covers several dims."""
    from minipaged.attention.kernels.v2_split import make_v2_kernels

    rng = np.random.default_rng(3)
    D = CFG.head_dim
    s, v = rng.normal(size=30), rng.normal(size=(30, D))
    m, l, o = partials(s, v, [(0, 8), (8, 16), (16, 30)])
    out = np.full((1, 1, D), np.nan, np.float32)
    merge = make_v2_kernels(CFG)[1]
    merge[(1, 1), 3](out, o[None, None].astype(np.float32), m[None, None].astype(np.float32),
                     l[None, None].astype(np.float32))
    np.testing.assert_allclose(out[0, 0], np.exp(s - s.max()) @ v / np.exp(s - s.max()).sum(), rtol=1e-4, atol=1e-5)


def run_unpack_word(dtype, values):
    """values (a NumPy array of `dtype`, a multiple of one word long) -> what unpack_word makes of its
    int64 words, as float32, one kernel thread per word."""
    from minipaged.attention.kernels import using_simulator
    from minipaged.attention.kernels.v3_ops import make_unpack_word

    unpack_word = make_unpack_word(dtype, using_simulator())
    per_word = 8 // np.dtype(dtype).itemsize

    @cuda.jit
    def unpack_all(words, out):
        i = cuda.grid(1)
        if i < words.shape[0]:
            vals = cuda.local.array(4, float32)
            unpack_word(vals, 0, words[i])
            for j in range(per_word):
                out[i * per_word + j] = vals[j]

    words = np.ascontiguousarray(values).view(np.int64)
    out = np.full(len(values), np.nan, np.float32)
    unpack_all[1, 32](words, out)
    return out


def test_unpack_word_splits_fp16_words_in_memory_order(numba_cuda):
    """Four fp16 values per word, the first in the low 16 bits: signs, a subnormal, the largest fp16,
    zeros of both signs, and values whose top bit set makes the int64 word negative."""
    halves = np.array([1.0, -2.5, 6.1e-5, 65504.0, -0.0, 0.0, 3.0e-7, -1.0e-3,
                       -65504.0, 0.33325195, 7.0, -7.0], np.float16)
    got = run_unpack_word("float16", halves)
    np.testing.assert_array_equal(got, halves.astype(np.float32))
    assert np.signbit(got[4]) and not np.signbit(got[5]), "the sign of zero is lost"


def test_unpack_word_splits_fp32_words(numba_cuda):
    floats = np.array([1.5, -3.25e-20, 3.4e38, -0.0, 1e-45, -123.456], np.float32)
    np.testing.assert_array_equal(run_unpack_word("float32", floats), floats)
