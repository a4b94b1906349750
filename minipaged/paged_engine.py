"""The engine for pooled KV memory (chapters 01-05): many sequences per forward pass, K/V in a pool.

Each step:

    1. admit waiting sequences, first come first served, while the KV policy has room for them
       (a request that could never fit, even in an empty pool, is refused with the policy's reason);
    2. ask the policy for a slot for every token whose K/V is not cached yet: the whole prompt for a
       newly admitted sequence (prefill), one token for a running one (decode);
    3. make the block copies the policy asked for (copy-on-write, chapter 05), then run the model once
       over all those tokens; attention reads each sequence's K/V through its block table
       (kv/paged_cache.py);
    4. sample one token per sequence; free the KV memory of the ones that finished.

If the pool runs dry mid-decode (only possible when blocks are allocated on demand), the most
recently admitted sequence is preempted: its memory is freed and it goes back to the front of the
queue, to be prefilled again later with everything it had generated (recompute). Chapter 06 turns
this into a real scheduler with swapping, watermarks and token budgets; admission (``_admit``),
slot reservation and preemption (``_reserve_slots``, ``_preempt``), the forward pass (``forward``)
and sampling (``_sample``) are separate methods so that it can replace the first three alone.

Parallel sampling with a sharing policy (chapter 05). ``run(..., forks={parent: [children]})``
makes the children wait beside their parent instead of in the queue. When the parent's prompt has
been prefilled, each child is forked from it (``policy.fork``: same blocks, no copy) and samples
its own first token from the parent's prompt logits with its own generator. From then on every
sample is an ordinary sequence; the first write into the shared, partly filled last prompt block is
copied on write. A preempted sample comes back as an ordinary, unshared sequence (recompute).

Whatever the policy, the math per sequence is the same, so greedy outputs match the per-request
engine whenever the batch is the same.

Not handled here: swapping (06), prefix caching (07), chunked prefill (08). Beam search drives this
engine's ``forward`` from minipaged/beam_search.py.
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
                      "refused": 0, "max_running": 0, "usage": [], "forks": 0, "block_copies": 0,
                      "blocks_physical": [], "blocks_logical": []}
        self._children: dict[int, list[Sequence]] = {}  # parent seq_id -> samples waiting to fork from it

    @property
    def kv(self):
        return self.policy

    # ---- 1. admission -----------------------------------------------------------------------

    def _refuse(self, seq: Sequence, reason: str) -> list[Sequence]:
        """Refuse seq and the samples waiting to fork from it."""
        refused = [seq, *self._children.pop(seq.seq_id, [])]
        for s in refused:
            s.finish_reason, s.stop_reason = "abort", f"refused: {reason}"
        self.stats["refused"] += len(refused)
        return refused

    def _admit(self, waiting: deque, running: list) -> list[Sequence]:
        """Admit from the head of the queue while the policy has room; return the refused ones."""
        refused = []
        while waiting:
            seq = waiting[0]
            family = 1 + len(self._children.get(seq.seq_id, ()))  # forked samples run beside it
            if running and len(running) + family > self.max_num_seqs:
                break
            prompt_len = seq.num_tokens  # after a preemption, its outputs are prefilled again too
            remaining = seq.max_new_tokens - len(seq.output_ids)
            try:
                if not self.policy.can_allocate(prompt_len, remaining):
                    break  # first come, first served: nobody jumps the queue
                self.policy.allocate(seq.seq_id, prompt_len, remaining)
            except ValueError as e:  # can never fit: refuse this one, keep serving the others
                waiting.popleft()
                refused += self._refuse(seq, str(e))
                continue
            running.append(waiting.popleft())
        return refused

    # ---- 2. slots, and preemption when there are none ----------------------------------------

    def _preempt(self, running: list, waiting: deque) -> Sequence:
        """The newest sequence gives its memory back and waits at the front of the queue."""
        victim = running.pop()
        self.policy.free(victim.seq_id)
        waiting.appendleft(victim)
        self.stats["preemptions"] += 1
        return victim

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
                # The victim has not been planned yet (it sits at or after position i), so the plan
                # stays valid; append_slots changed nothing when it raised.
                self._preempt(running, waiting)
        return plan

    # ---- 3. the forward pass ----------------------------------------------------------------

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks src -> dst in every layer's K and V (copy-on-write, or a full fork)."""
        if not copies:
            return
        device = self.cache.k[0].device
        # Within one batch no destination is also a source (a copy's destination is a block just
        # taken by one sequence), so gathering all sources before writing is the same as copying in order.
        src = torch.tensor([s for s, _ in copies], dtype=torch.long, device=device)
        dst = torch.tensor([d for _, d in copies], dtype=torch.long, device=device)
        for layer in range(len(self.cache.k)):
            self.cache.k[layer][dst] = self.cache.k[layer][src]  # [copies, block_size, KVH, Dh]
            self.cache.v[layer][dst] = self.cache.v[layer][src]
        self.stats["block_copies"] += len(copies)

    def forward(self, work) -> torch.Tensor:
        """One forward pass. work: [(seq_id, token ids to compute, tokens already cached, their
        slots)] whose slots the policy has just handed out. Returns logits [len(work), V] of each
        entry's last token."""
        self.copy_blocks(self.policy.drain_copies())  # before any new K/V lands in a copied block
        tokens, positions, slots, tables, context_lens, query_lens = [], [], [], [], [], []
        for seq_id, new_tokens, cached, new_slots in work:
            tokens += new_tokens
            positions += range(cached, cached + len(new_tokens))
            slots += new_slots
            tables.append(self.policy.block_table(seq_id))
            context_lens.append(cached + len(new_tokens))
            query_lens.append(len(new_tokens))
        device = self.model.device
        batch = PagedBatch(self.cache, slots, tables, context_lens, query_lens, self.backend)
        last_rows = torch.tensor(query_lens).cumsum(0) - 1  # each sequence's newest token
        logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                            batch, logits_rows=last_rows.to(device))  # [S, V]
        self.stats["forward_passes"] += 1
        self.stats["tokens_computed"] += len(tokens)
        self.stats["max_running"] = max(self.stats["max_running"], len(work))
        self.stats["usage"].append(self.policy.usage().utilization)
        if self.policy.shares_blocks:
            sharing = self.policy.sharing()
            self.stats["blocks_physical"].append(sharing.physical_blocks)
            self.stats["blocks_logical"].append(sharing.logical_blocks)
        return logits

    # ---- 4. sampling, forks and finishing ----------------------------------------------------

    def _fork_children(self, parent: Sequence, running: list) -> list[Sequence]:
        """Fork the samples waiting on parent, now that its prompt is cached (before it samples)."""
        children = self._children.pop(parent.seq_id, [])
        for child in children:
            self.policy.fork(parent.seq_id, child.seq_id)
            running.append(child)
        self.stats["forks"] += len(children)
        return children

    def _sample(self, plan, logits, running: list, generators: dict) -> list[Sequence]:
        finished = []
        for (seq, *_), row in zip(plan, logits):
            for s in [*self._fork_children(seq, running), seq]:  # forks first: seq may finish now
                next_token(s, row, generators[s.seq_id], self.tokenizer)
                if s.finished:
                    self.policy.free(s.seq_id)
                    running.remove(s)
                    finished.append(s)
        return finished

    def step(self, running: list, waiting: deque, generators: dict) -> list[Sequence]:
        """One engine step; returns the sequences that finished (or were refused) during it."""
        finished = self._admit(waiting, running)
        if not running:
            return finished
        plan = self._reserve_slots(running, waiting)
        if not plan:
            return finished
        logits = self.forward([(seq.seq_id, seq.all_ids[cached:], cached, slots)
                               for seq, cached, _, slots in plan])
        self.stats["steps"] += 1
        return finished + self._sample(plan, logits, running, generators)

    def run(self, seqs: list[Sequence], generators: dict, on_finish=None,
            forks: dict[int, list[Sequence]] | None = None) -> None:
        """Generate every sequence to completion. `generators` maps seq_id -> torch.Generator.

        forks: {parent seq_id: [samples]} (sharing policies only): each sample shares its parent's
        prompt blocks instead of being prefilled itself. The samples must not be in ``seqs``.
        """
        if forks and not self.policy.shares_blocks:
            raise ValueError(f"forks need a policy that shares blocks ('shared'), not {self.policy.label!r}")
        self._children = {parent: list(children) for parent, children in (forks or {}).items() if children}
        waiting, running = deque(seqs), []
        try:
            while waiting or running:
                done = self.step(running, waiting, generators)
                if not done and not running and waiting:
                    raise RuntimeError(f"sequence {waiting[0].seq_id} can neither be admitted nor refused")
                for seq in done:
                    if on_finish:
                        on_finish(seq)
        finally:
            self._children = {}
