"""The engine for pooled KV memory (chapters 01-04): many sequences per forward pass, K/V in a pool.

Each step:

    1. admit waiting sequences, first come first served, while the KV policy has room for them
       (a request that could never fit, even in an empty pool, is refused with the policy's reason);
    2. ask the policy for a slot for every token whose K/V is not cached yet: the whole prompt for a
       newly admitted sequence (prefill), one token for a running one (decode);
    3. run the model once over all those tokens; attention reads each sequence's K/V through its
       block table (kv/paged_cache.py);
    4. sample one token per sequence; free the KV memory of the ones that finished.

If the pool runs dry mid-decode (only possible when blocks are allocated on demand), the most
recently admitted sequence is preempted: its memory is freed and it goes back to the front of the
queue, to be prefilled again later with everything it had generated (recompute). Chapter 06 turns
this into a real scheduler with swapping, watermarks and token budgets.

Whatever the policy, the math per sequence is the same, so greedy outputs match the per-request
engine whenever the batch is the same.

Not handled here: sharing blocks (chapter 05), swapping (06), prefix caching (07), chunked prefill (08).
"""

from __future__ import annotations

from collections import deque

import torch

from minipaged.engine import next_token
from minipaged.kv.base import NoFreeMemory
from minipaged.kv.paged_cache import PagedBatch, PagedKVCache
from minipaged.sequence import Sequence


class PagedEngine:
    def __init__(self, model, tokenizer, policy, attention_backend: str = "torch", max_num_seqs: int = 64):
        cfg = model.config
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.cache = PagedKVCache(cfg, policy.num_blocks, policy.block_size, model.dtype, model.device)
        self.backend = attention_backend
        self.max_num_seqs = max_num_seqs
        self.stats = {"steps": 0, "forward_passes": 0, "tokens_computed": 0, "preemptions": 0,
                      "refused": 0, "max_running": 0, "usage": []}

    @property
    def kv(self):
        return self.policy

    def _admit(self, waiting: deque, running: list) -> list[Sequence]:
        """Admit from the head of the queue while the policy has room; return the refused ones."""
        refused = []
        while waiting and len(running) < self.max_num_seqs:
            seq = waiting[0]
            prompt_len = seq.num_tokens  # after a preemption, its outputs are prefilled again too
            remaining = seq.max_new_tokens - len(seq.output_ids)
            try:
                if not self.policy.can_allocate(prompt_len, remaining):
                    break  # first come, first served: nobody jumps the queue
                self.policy.allocate(seq.seq_id, prompt_len, remaining)
            except ValueError as e:  # can never fit: refuse this one, keep serving the others
                waiting.popleft()
                seq.finish_reason, seq.stop_reason = "abort", f"refused: {e}"
                self.stats["refused"] += 1
                refused.append(seq)
                continue
            running.append(waiting.popleft())
        return refused

    def _reserve_slots(self, running: list, waiting: deque):
        """Slots for every uncached token of every running sequence, preempting if the pool is dry.

        Returns [(seq, tokens already cached, new tokens, their slots)] in running order.
        """
        plan, i = [], 0
        while i < len(running):
            seq = running[i]
            cached = self.policy.num_tokens(seq.seq_id)
            n_new = seq.num_tokens - cached
            try:
                plan.append((seq, cached, n_new, self.policy.append_slots(seq.seq_id, n_new)))
                i += 1
            except NoFreeMemory:
                # The newest sequence gives its memory back and waits at the front of the queue. It
                # has not been planned yet (it sits at or after position i), so the plan stays valid.
                victim = running.pop()
                self.policy.free(victim.seq_id)
                waiting.appendleft(victim)
                self.stats["preemptions"] += 1
        return plan

    def step(self, running: list, waiting: deque, generators: dict) -> list[Sequence]:
        """One engine step; returns the sequences that finished (or were refused) during it."""
        finished = self._admit(waiting, running)
        if not running:
            return finished
        plan = self._reserve_slots(running, waiting)
        if not plan:
            return finished
        tokens, positions, slots, tables, context_lens, query_lens = [], [], [], [], [], []
        for seq, cached, n_new, new_slots in plan:
            tokens += seq.all_ids[cached:]
            positions += range(cached, cached + n_new)
            slots += new_slots
            tables.append(self.policy.block_table(seq.seq_id))
            context_lens.append(cached + n_new)
            query_lens.append(n_new)
        device = self.model.device
        batch = PagedBatch(self.cache, slots, tables, context_lens, query_lens, self.backend)
        last_rows = torch.tensor(query_lens).cumsum(0) - 1  # each sequence's newest token
        logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                            batch, logits_rows=last_rows.to(device))  # [S, V]
        self.stats["steps"] += 1
        self.stats["forward_passes"] += 1
        self.stats["tokens_computed"] += len(tokens)
        self.stats["max_running"] = max(self.stats["max_running"], len(plan))
        self.stats["usage"].append(self.policy.usage().utilization)
        for (seq, *_), row in zip(plan, logits):
            next_token(seq, row, generators[seq.seq_id], self.tokenizer)
            if seq.finished:
                self.policy.free(seq.seq_id)
                running.remove(seq)
                finished.append(seq)
        return finished

    def run(self, seqs: list[Sequence], generators: dict, on_finish=None) -> None:
        """Generate every sequence to completion. `generators` maps seq_id -> torch.Generator."""
        waiting, running = deque(seqs), []
        while waiting or running:
            done = self.step(running, waiting, generators)
            if not done and not running and waiting:
                raise RuntimeError(f"sequence {waiting[0].seq_id} can neither be admitted nor refused")
            for seq in done:
                if on_finish:
                    on_finish(seq)
