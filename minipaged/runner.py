"""The runner: what executes one planned step, and the paged K/V memory it executes it on.

    execute(plan) -> RunnerOutput    the plan's block copies (swap-outs, swap-ins, copies on write, in
                                     that order), one forward pass over every planned token, and the
                                     tokens sampled (sampling.py), as plain data (step.py)
    make_generator(seed)             the random generator a sample draws from
    reset()                          forget everything (after an abort of every request)

The runner reads the plan and the block tables and changes neither, and appends no token: the
scheduler does all of that. ``ModelRunner`` runs the model over the paged pool (chapters 01-11);
chapter 00's runner, over growing per-sequence tensors, is per_request_runner.py.

The pool is one pair of tensors per layer, ``[num_blocks, block_size, num_kv_heads, head_dim]``; the
policies only hand out slot numbers into it (slot s = block s // block_size, offset s % block_size).
Each forward pass gets a ``PagedBatch`` (the slot mapping, and per sequence its block table, context
and query lengths), whose ``attend`` writes the new K/V into their slots and runs the chosen attention
backend through the tables. Swapping (chapter 06) adds the same tensors in host memory
(``SwapKVCache``); ``copy_blocks`` moves whole blocks.

Not handled: overlapping the block copies with compute, CUDA graphs, sampling on the device.
"""
from __future__ import annotations

import time

import torch

from minipaged.attention import step_attention
from minipaged.beam_search import candidate_logprobs
from minipaged.model import kernels
from minipaged.model.config import ModelConfig
from minipaged.sampling import make_generator, sample, step_outputs, step_rows
from minipaged.step import RunnerOutput

# ---- the K/V memory ------------------------------------------------------------------------------


class PagedKVCache:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32, device="cpu"):
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, KVH, Dh] go to flat rows `slots` [T] of this layer's cache."""
        if kernels.use(k):  # the two lines below in one compiled call (model/kernels.py)
            return kernels.ops().write_kv(k, v, self.k[layer], self.v[layer], slots)
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v)


class PagedBatch:
    """One forward pass over several sequences whose K/V live in a PagedKVCache."""

    def __init__(self, cache: PagedKVCache, slot_mapping: list[int], block_tables: list[list[int]],
                 context_lens: list[int], query_lens: list[int], attention):
        device = cache.k[0].device
        width = max(len(t) for t in block_tables)
        padded = [t + [0] * (width - len(t)) for t in block_tables]  # padding is never read
        self.cache = cache
        self.slots = torch.tensor(slot_mapping, dtype=torch.long, device=device)  # [T]
        self.block_tables = torch.tensor(padded, dtype=torch.int32, device=device)  # [S, max_blocks]
        self.context_lens = torch.tensor(context_lens, dtype=torch.int32, device=device)  # [S]
        self.query_lens = torch.tensor(query_lens, dtype=torch.int32, device=device)  # [S]
        # what attention needs besides q and the caches is the same in every layer: built once here, by
        # the backend's step_attention (attention/__init__.py)
        self.attention = attention(self.block_tables, self.context_lens, self.query_lens, cache.block_size)

    def attend(self, layer: int, q, k, v):  # q [T, H, Dh]; k, v [T, KVH, Dh]
        self.cache.write(layer, self.slots, k, v)
        return self.attention(q, self.cache.k[layer], self.cache.v[layer])


class SwapKVCache(PagedKVCache):
    """The CPU side of swapping: the same layout, in host memory (pinned when there is a GPU, so the
    copies can use DMA). Block numbers are those of kv/swap.py's SwapSpace."""

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype=torch.float32):
        super().__init__(cfg, num_blocks, block_size, dtype, "cpu")
        if torch.cuda.is_available():
            self.k = [t.pin_memory() for t in self.k]
            self.v = [t.pin_memory() for t in self.v]


def copy_blocks(src: PagedKVCache, dst: PagedKVCache, pairs: list[tuple[int, int]]) -> None:
    """Copy whole blocks, every layer's K and V: block s of ``src`` to block d of ``dst`` for each
    (s, d) in pairs. ``src`` and ``dst`` may be the same cache (copy-on-write) or two (swapping)."""
    if not pairs:
        return
    from_blocks = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=src.k[0].device)
    to_blocks = torch.tensor([d for _, d in pairs], dtype=torch.long, device=dst.k[0].device)
    for layer in range(len(src.k)):
        dst.k[layer][to_blocks] = src.k[layer][from_blocks].to(dst.k[layer].device)  # [pairs, bs, KVH, Dh]
        dst.v[layer][to_blocks] = src.v[layer][from_blocks].to(dst.v[layer].device)


# ---- the runners --------------------------------------------------------------------------------


def sampled_output(plan, logits: torch.Tensor, num_tokens: int, seconds: float) -> RunnerOutput:
    """The step's tokens from its logits [rows, V]: row by row, each planned sequence's rows in plan
    order (its last token's, then one per draft token, chapter 09)."""
    rows, first, at = step_rows(logits), [], 0
    for work in plan.work:  # where each planned sequence's rows start
        first.append(at)
        at += 1 + len(work.draft)

    def draw(i, j, seq, before):
        return sample(rows[first[i] + j], seq, before)

    def rank(i, work):  # a beam's 2 * beam_width best (token, logprob), chapter 05
        return candidate_logprobs(rows[first[i]].logits[None], work.beam_width,
                                  work.request.beam.params.temperature)[0]

    return RunnerOutput(step_outputs(plan.work, draw, rank), num_tokens, seconds)


class ModelRunner:
    """The model over a paged KV pool (see the module docstring)."""

    def __init__(self, model, policy, *, attention_backend: str, cpu_kernels: bool, swap_blocks: int = 0,
                 metrics=None):
        cfg = model.config
        self.model, self.policy = model, policy
        self.backend = attention_backend
        self.attention = step_attention(attention_backend)  # the backend's per-step planner, looked up once
        self.cpu_kernels = cpu_kernels  # the model's small operations compiled (model/kernels.py)
        self.cache = PagedKVCache(cfg, policy.num_blocks, policy.block_size, model.dtype, model.device)
        self.swap_cache = SwapKVCache(cfg, swap_blocks, policy.block_size, model.dtype) if swap_blocks else None
        self.block_copies = metrics.counter("minipaged:block_copies") if metrics is not None else None
        self.swap_seconds = 0.0  # time spent copying blocks to and from the swap space

    def make_generator(self, seed):
        return make_generator(seed)

    def reset(self) -> None:
        pass  # the K/V tensors stay; the policy's books say nothing in them is anyone's

    def execute(self, plan) -> RunnerOutput:
        if plan.swap_out or plan.swap_in:
            # device -> CPU first: a device block freed by a swap-out may already be promised to
            # someone else in this step, and its old contents must leave before anything lands there
            start = time.perf_counter()
            copy_blocks(self.cache, self.swap_cache, plan.swap_out)
            copy_blocks(self.swap_cache, self.cache, plan.swap_in)
            self.swap_seconds += time.perf_counter() - start
        # copies on write, before any new K/V lands in a copied block. Within one step no destination
        # is also a source, so gathering every source before writing equals copying in order
        copy_blocks(self.cache, self.cache, plan.copies)
        if self.block_copies is not None and plan.copies:
            self.block_copies.inc(len(plan.copies))
        if not plan.work:
            return RunnerOutput([])
        start = time.perf_counter()
        logits = self.forward(plan.work)
        return sampled_output(plan, logits, plan.num_tokens, time.perf_counter() - start)

    def forward(self, work) -> torch.Tensor:
        """One forward pass over the planned sequences (step.py's ScheduledSeq). Returns logits
        [rows, V]: each sequence's last token's row, and with a draft (chapter 09) the row of its own
        token then one per guess."""
        tokens, positions, slots, tables, context_lens, query_lens, rows = [], [], [], [], [], [], []
        for w in work:
            tokens += w.tokens
            positions += range(w.cached, w.cached + w.num_new)
            slots += w.slots
            tables.append(self.policy.block_table(w.seq.seq_id))
            context_lens.append(w.cached + w.num_new)
            query_lens.append(w.num_new)
            end = len(tokens)
            rows += range(end - 1 - len(w.draft), end)
        device = self.model.device
        batch = PagedBatch(self.cache, slots, tables, context_lens, query_lens, self.attention)
        with kernels.enabled(self.cpu_kernels):
            logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                                batch, logits_rows=torch.tensor(rows, device=device))  # [rows, V]
        if logits.is_cuda:
            torch.cuda.synchronize()
        return logits
