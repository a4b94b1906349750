"""The "cpu" attention backend: short queries (decodes) through one compiled loop over the paged cache,
prompts through batched.py's SDPA. Opt-in (``attention_backend="cpu"``), checked against reference.py.

batched.py's decode attention is a handful of tensor operations per layer: gather every sequence's
blocks into a padded copy, fold the query heads, run SDPA, unfold. This backend does the same math,
for the queries of up to SHORT_QUERY tokens, in one loop that reads K and V where they lie:

    for each sequence:
        for each key position t it can see:                   # walks its block table
            row = K[table[t // block_size], t % block_size]    # [KVH, Dh]: one contiguous read
            score[h, t] = (q_h · row[h // G]) * scale          # every query head h (G share a K/V head)
        p = softmax(score) along t                             # two passes: max, then exp / sum
        out_h = Σ_t p[h, t] · V[block(t), offset(t)][h // G]

It is chapter 10's v1 kernel written for a CPU: one sequence per job instead of a thread block per
(sequence, K/V head, row tile), loops instead of warps. numba compiles it to machine code the first
time it runs (a few seconds; the machine code is cached on disk next to this file, so later processes
load it).
vLLM's CPU backend makes the same split: its own kernel for decodes, SDPA for prompts. Longer queries
(prompts, chapter 08's chunks) keep batched.py's path: for them the work is a real matrix product,
which SDPA does far better than a loop.

Why it is not the default (docs/pages/speed.md's ledger): run on one core, it is as fast as
batched.py's path within this machine's noise. Spread over both cores with numba's ``prange``, it was
faster alone, but numba's worker threads and PyTorch's OpenMP threads then compete for the cores
whenever another process runs, and the test suite took nearly three times the CPU time. So the loop runs on
the calling thread only.

Not handled: dtypes other than float32 (they take batched.py's path), tensors off the CPU, sliding
windows, ALiBi, soft-capping.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

import numpy as np
import torch

from minipaged.attention import register_backend
from minipaged.attention.batched import SHORT_QUERY, BatchedAttention, _Group


def _attend(q, k_cache, v_cache, tables, context_lens, query_starts, query_lens, scale, out):
    """q [T, H, Dh]; k_cache, v_cache [num_blocks, block_size, KVH, Dh]; tables [S, max_blocks];
    context_lens, query_starts, query_lens [S] int64; out [T, H, Dh] (written). Floats are float32.

    Sequence s's query rows are q[query_starts[s] : query_starts[s] + query_lens[s]]; its query j sits at
    position context_lens[s] - query_lens[s] + j and sees the keys at positions 0 .. that position.
    One job per sequence: it reads each of its K/V rows [KVH, Dh] once, whole (a block is one
    contiguous run of memory, which the CPU's prefetcher streams), for every query head."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads  # G query heads share each K/V head
    for s in range(context_lens.shape[0]):
        n, m, first = context_lens[s], query_lens[s], query_starts[s]
        past = n - m  # keys before the first query token; query j sees keys 0 .. past + j
        # row r = j * H + h: query token j, head h
        qs = np.empty((m * num_heads, head_dim), np.float32)
        for r in range(m * num_heads):
            for d in range(head_dim):
                qs[r, d] = q[first + r // num_heads, r % num_heads, d] * scale
        scores = np.full((m * num_heads, n), -np.inf, np.float32)  # a key a query cannot see stays -inf
        for t in range(n):  # pass 1: the scores of key t, for every query that sees it
            key = k_cache[tables[s, t // block_size], t % block_size]  # [KVH, Dh]
            for j in range(max(0, t - past), m):
                for h in range(num_heads):
                    kv_head, acc = h // group, np.float32(0.0)
                    for d in range(head_dim):
                        acc += qs[j * num_heads + h, d] * key[kv_head, d]
                    scores[j * num_heads + h, t] = acc
        for r in range(m * num_heads):  # softmax along each row: exp(score - max) / sum
            best = scores[r].max()
            total = np.float32(0.0)
            for t in range(n):
                e = np.exp(scores[r, t] - best)
                scores[r, t] = e
                total += e
            for t in range(n):
                scores[r, t] /= total
        acc_out = np.zeros((m * num_heads, head_dim), np.float32)
        for t in range(n):  # pass 2: the weights times V
            value = v_cache[tables[s, t // block_size], t % block_size]  # [KVH, Dh]
            for j in range(max(0, t - past), m):
                for h in range(num_heads):
                    kv_head, w = h // group, scores[j * num_heads + h, t]
                    for d in range(head_dim):
                        acc_out[j * num_heads + h, d] += w * value[kv_head, d]
        for r in range(m * num_heads):
            for d in range(head_dim):
                out[first + r // num_heads, r % num_heads, d] = acc_out[r, d]


@functools.cache
def compiled():
    """The kernel compiled by numba (imported here, on first use: chapter 10's package decides first
    whether numba.cuda is the simulator, which numba reads once, when it is imported)."""
    importlib.import_module("minipaged.attention.kernels")  # picks numba's CUDA target, before numba loads
    from numba import njit

    return njit(fastmath={"contract", "reassoc", "arcp"}, cache=True)(_attend)  # fast sums; -inf stays -inf


class _KernelGroup:
    """Sequences whose queries are all short, attended by the compiled kernel (same calls as
    batched.py's _Group)."""

    def __init__(self, tables, ctx, qlen, token_rows, block_size, device):
        self.args, self.fallback = (tables, ctx, qlen, token_rows, block_size, device), None
        self.token_rows = token_rows
        self.tables = tables.numpy()  # int32 [S, max_blocks]
        # lengths as int64: the kernel's index arithmetic then runs in one integer type (with int32 lengths
        # the compiled loops widen at every use and run at half the speed)
        self.context_lens = ctx.to(torch.int64).numpy()
        self.query_lens = qlen.to(torch.int64).numpy()
        self.query_starts = np.cumsum(self.query_lens) - self.query_lens
        self.num_rows = int(self.query_lens.sum())

    def run(self, q, k_cache, v_cache, scale):  # q [T_group, H, Dh] -> [T_group, H, Dh]
        if q.dtype != torch.float32:  # the kernel is compiled for float32 only: batched.py's path
            self.fallback = self.fallback or _Group(*self.args)
            return self.fallback.run(q, k_cache, v_cache, scale)
        out = torch.empty(self.num_rows, q.shape[1], q.shape[2], dtype=torch.float32)
        compiled()(q.contiguous().numpy(), k_cache.numpy(), v_cache.numpy(), self.tables, self.context_lens,
                   self.query_starts, self.query_lens, np.float32(scale), out.numpy())
        return out


class KernelAttention(BatchedAttention):
    """A step's attention for every layer (see attention_for_step): the groups of short queries go to
    the compiled kernel, each long prompt to SDPA."""

    def make_group(self, tables, ctx, qlen, token_rows, block_size, device):
        if device.type == "cpu" and int(qlen.max()) <= SHORT_QUERY:
            return _KernelGroup(tables, ctx, qlen, token_rows, block_size, device)
        return super().make_group(tables, ctx, qlen, token_rows, block_size, device)


def paged_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None):
    return KernelAttention(block_tables, context_lens, query_lens, k_cache.shape[1])(q, k_cache, v_cache, scale)


if importlib.util.find_spec("numba") is not None:  # requirements-dev.txt installs it
    register_backend("cpu", paged_attention_cpu, planner=KernelAttention)
