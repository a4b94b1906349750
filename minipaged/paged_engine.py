"""The engine for pooled KV memory (chapters 01-06): many sequences per forward pass, K/V in a pool.

The engine executes; a scheduler decides (minipaged/scheduler/). Each step:

    1. the scheduler plans the step (``schedule() -> StepPlan``): which requests run, and for every
       token whose K/V is not cached yet (a whole prompt for a newly admitted request, one token for
       a running one) a slot from the KV policy. Admission, the watermark, the token budget and
       preemption (recompute, or swap to CPU memory) all happen there;
    2. the engine makes the block copies the plan and the policy ask for, in this order: swap-outs
       (device -> CPU), swap-ins (CPU -> device), copies on write (chapter 05); then it runs the
       model once over all the planned tokens; attention reads each sequence's K/V through its block
       table (kv/paged_cache.py);
    3. it samples one token per sequence and tells the scheduler which sequences finished, so their
       memory serves someone else at the very next step.

Parallel sampling with a sharing policy (chapter 05). ``run(..., forks={parent: [children]})``
makes the children wait beside their parent, in the parent's request. When the parent's prompt has
been prefilled, each child is forked from it (``policy.fork``: same blocks, no copy) and samples
its own first token from the parent's prompt logits with its own generator. From then on every
sample is an ordinary sequence of the request; the first write into the shared, partly filled last
prompt block is copied on write.

The default scheduler is "continuous" with recompute, which is what chapters 01-05 ran: admission at
every step, the newest request preempted when the pool runs dry. Whatever the policy or scheduler,
the math per sequence is the same, so greedy outputs match the per-request engine whenever the batch
is the same.

Timing (``stats``): each step's wall time and the model's forward time within it, so a benchmark
can report the engine's own bookkeeping (everything but the forward pass) as a fraction of the step.

Prefix caching (chapter 07, kv/prefix_cache.py) needs one thing from the engine: after each forward
pass it tells the policy which tokens' K/V it wrote (``commit_tokens``), so full blocks can be
found again by later requests. The scheduler admits with token ids, and the cached part of a prompt
is simply "already cached": the forward pass computes the tokens after ``cached`` as for any sequence.

If a run is interrupted (an error in a forward pass, a KeyboardInterrupt), ``abort_all`` gives every
sequence's blocks back before the exception goes on, so the pool is whole again for the next call.

Chunked prefill (chapter 08, scheduler/chunked.py) needs two things from the engine: it computes
the planned ``num_new`` tokens of each sequence, which may be a prompt's next chunk rather than all
of it, and it samples only for the sequences whose last token was computed (``completes``). Each
sampled token's time goes to ``seq.token_times``, so a benchmark can measure inter-token latency.

Speculative decoding (chapter 09, scheduler/speculative.py and spec/) adds a ``draft`` to some
decoding sequences: the forward pass computes the guessed tokens after the sequence's own, returns a
logits row for each, and commits only the own token. ``_verify`` then emits the model's tokens while
they agree with the guesses, gives back the slots of the wrong ones (``policy.truncate``) and commits
the right ones.

Beam search drives this engine's ``forward`` from minipaged/beam_search.py with a loop of its own
(its prompts are prefilled whole, and it does not speculate).
"""

from __future__ import annotations

import time

import torch

from minipaged.engine import next_token
from minipaged.kv.paged_cache import PagedBatch, PagedKVCache, SwapKVCache, copy_blocks
from minipaged.kv.swap import SwapSpace
from minipaged.scheduler import make_scheduler
from minipaged.sequence import Sequence
from minipaged.spec.verify import verify


class PagedEngine:
    def __init__(self, model, tokenizer, policy, attention_backend: str = "torch", max_num_seqs: int = 64,
                 scheduler: str = "continuous", preemption_mode: str = "recompute",
                 max_num_batched_tokens: int | None = None, swap_space_tokens: int = 0,
                 enable_chunked_prefill: bool = False, speculative_config=None):
        cfg = model.config
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.cache = PagedKVCache(cfg, policy.num_blocks, policy.block_size, model.dtype, model.device)
        self.backend = attention_backend
        self.max_num_seqs = max_num_seqs
        self.stats = {"steps": 0, "forward_passes": 0, "tokens_computed": 0, "preemptions": 0,
                      "refused": 0, "max_running": 0, "usage": [], "forks": 0, "block_copies": 0,
                      "blocks_physical": [], "blocks_logical": [], "batch_sizes": [], "kv_occupied": [],
                      "step_seconds": [], "forward_seconds": [], "swap_seconds": 0.0, "step_tokens": [],
                      "step_decodes": [], "spec_accepted_tokens": 0}
        if preemption_mode == "swap" and not hasattr(policy, "detach"):
            raise ValueError(f"preemption_mode='swap' needs a block-table policy (block_table, on_demand, shared); "
                             f"{policy.label} reserves each request's memory up front and never preempts")
        swap_blocks = swap_space_tokens // policy.block_size
        self.swap_space = SwapSpace(swap_blocks, policy.block_size) if swap_blocks and hasattr(policy, "detach") \
            else None
        self.swap_cache = SwapKVCache(cfg, swap_blocks, policy.block_size, model.dtype) if self.swap_space else None
        self.scheduler_name, self.preemption_mode = scheduler, preemption_mode
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.speculative_config = speculative_config
        self.scheduler = self._new_scheduler()

    def _new_scheduler(self):
        return make_scheduler(self.scheduler_name, self.policy, max_num_seqs=self.max_num_seqs,
                              max_num_batched_tokens=self.max_num_batched_tokens,
                              preemption_mode=self.preemption_mode, swap_space=self.swap_space, stats=self.stats,
                              enable_chunked_prefill=self.enable_chunked_prefill,
                              speculative_config=self.speculative_config)

    @property
    def kv(self):
        return self.policy

    # ---- block copies -----------------------------------------------------------------------

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks src -> dst in every layer's K and V (copy-on-write, or a full fork).
        Within one batch no destination is also a source (a copy's destination is a block just taken
        by one sequence), so gathering all sources before writing is the same as copying in order."""
        copy_blocks(self.cache, self.cache, copies)
        self.stats["block_copies"] += len(copies)

    def swap_blocks(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        """Device -> CPU copies first: a device block freed by a swap-out may already be promised
        to someone else in this step, and its old contents must leave before anything lands there."""
        if not swap_out and not swap_in:
            return
        start = time.perf_counter()
        copy_blocks(self.cache, self.swap_cache, swap_out)
        copy_blocks(self.swap_cache, self.cache, swap_in)
        self.stats["swap_seconds"] += time.perf_counter() - start

    # ---- the forward pass ----------------------------------------------------------------------

    def forward(self, work, drafts: dict | None = None) -> torch.Tensor:
        """One forward pass. work: [(seq_id, token ids to compute, tokens already cached, their
        slots)] whose slots the policy has just handed out. Returns logits [len(work), V] of each
        entry's last token. drafts (chapter 09): {seq_id: d} for entries whose last d tokens are
        guesses; those get d + 1 rows (the token before the guesses, then each guess), and their
        guesses are not committed, since they may be wrong."""
        drafts = drafts or {}
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
        ends = torch.tensor(query_lens).cumsum(0)
        last_rows = ends - 1  # each entry's newest token
        if drafts:  # a drafted entry also gives the rows of its own token and every guess (chapter 09)
            last_rows = torch.cat([torch.arange(end - 1 - drafts.get(seq_id, 0), end)
                                   for end, (seq_id, *_) in zip(ends.tolist(), work)])
        start = time.perf_counter()
        logits = self.model(torch.tensor(tokens, device=device), torch.tensor(positions, device=device),
                            batch, logits_rows=last_rows.to(device))  # [S, V]
        if logits.is_cuda:
            torch.cuda.synchronize()
        self.stats["forward_seconds"].append(time.perf_counter() - start)
        for seq_id, new_tokens, _, _ in work:  # their K/V is written now (a prefix cache records it)
            self.policy.commit_tokens(seq_id, new_tokens[:len(new_tokens) - drafts.get(seq_id, 0)])
        self.stats["forward_passes"] += 1
        self.stats["tokens_computed"] += len(tokens)
        self.stats["max_running"] = max(self.stats["max_running"], len(work))
        self.stats["batch_sizes"].append(len(work))
        usage = self.policy.usage()
        self.stats["usage"].append(usage.utilization)  # tokens / slots held
        self.stats["kv_occupied"].append(usage.occupied / usage.total)  # slots held / the whole pool
        if self.policy.shares_blocks:
            sharing = self.policy.sharing()
            self.stats["blocks_physical"].append(sharing.physical_blocks)
            self.stats["blocks_logical"].append(sharing.logical_blocks)
        return logits

    # ---- sampling and finishing ----------------------------------------------------------------

    def _sample(self, plan, logits, generators: dict) -> list[Sequence]:
        finished, now = [], time.perf_counter()
        rows = iter(logits)
        for work in plan.work:
            if work.draft:  # chapter 09: check the guesses, keep what the model agrees with
                self._verify(work, [next(rows) for _ in range(len(work.draft) + 1)], generators, now, finished)
                continue
            row = next(rows)
            if not work.completes:  # a prompt chunk with more to come (chapter 08): nothing to sample yet
                continue
            seq = work.seq
            for s in [*self.scheduler.fork_children(seq), seq]:  # forks first: seq may finish now
                next_token(s, row, generators[s.seq_id], self.tokenizer)
                s.token_times.append(now)
                if s.first_token_time is None:
                    s.first_token_time = now
                if s.finished:
                    s.finished_time = now
                    self.scheduler.finish(s)
                    finished.append(s)
        return finished

    def _verify(self, work, rows, generators: dict, now: float, finished: list) -> None:
        """Emit the model's own tokens row by row while they equal the draft (spec/verify.py), then
        forget the K/V of the guesses that were wrong and commit the right ones."""
        seq, before = work.seq, work.seq.num_tokens

        def emit(j):
            next_token(seq, rows[j], generators[seq.seq_id], self.tokenizer)
            seq.token_times.append(now)
            return seq.output_ids[-1], seq.finished

        emitted = verify(work.draft, emit)
        accepted = work.draft[:emitted - 1]  # the guesses that were right; their K/V is valid
        self.policy.truncate(seq.seq_id, before + len(accepted))
        self.policy.commit_tokens(seq.seq_id, accepted)
        self.stats["spec_accepted_tokens"] += len(accepted)
        if seq.finished:
            seq.finished_time = now
            self.scheduler.finish(seq)
            finished.append(seq)

    def step(self, generators: dict) -> list[Sequence]:
        """One engine step; returns the sequences that finished (or were refused) during it."""
        start = time.perf_counter()
        plan = self.scheduler.schedule()
        finished = list(plan.refused)
        if not plan.work:
            return finished
        self.swap_blocks(plan.swap_out, plan.swap_in)
        self.stats["step_tokens"].append(plan.num_tokens)  # both per engine step (beam search has its own loop)
        self.stats["step_decodes"].append(plan.num_decodes)
        logits = self.forward([(w.seq.seq_id, w.tokens, w.cached, w.slots) for w in plan.work],
                              drafts={w.seq.seq_id: len(w.draft) for w in plan.work if w.draft})
        finished += self._sample(plan, logits, generators)
        self.stats["steps"] += 1
        self.stats["step_seconds"].append(time.perf_counter() - start)
        return finished

    def run(self, seqs: list[Sequence], generators: dict, on_finish=None,
            forks: dict[int, list[Sequence]] | None = None) -> None:
        """Generate every sequence to completion. `generators` maps seq_id -> torch.Generator.

        forks: {parent seq_id: [samples]} (sharing policies only): each sample shares its parent's
        prompt blocks instead of being prefilled itself. The samples must not be in ``seqs``.
        """
        if forks and not self.policy.shares_blocks:
            raise ValueError(f"forks need a policy that shares blocks ('shared'), not {self.policy.label!r}")
        forks = forks or {}
        self.scheduler = self._new_scheduler()
        now = time.perf_counter()
        for seq in seqs:
            children = forks.get(seq.seq_id, [])
            for s in [seq, *children]:
                if s.arrival_time is None:
                    s.arrival_time = now
            self.scheduler.add(seq, children)
        try:
            while self.scheduler.has_work():
                passes = self.stats["forward_passes"]
                done = self.step(generators)
                if not done and self.stats["forward_passes"] == passes:  # nothing ran, nothing ended
                    head = (self.scheduler.waiting or self.scheduler.swapped or self.scheduler.running)[0]
                    raise RuntimeError(f"request {head.group_id} can neither be scheduled nor refused")
                for seq in done:
                    if on_finish:
                        on_finish(seq)
        except BaseException:  # an interrupt, an error in a forward pass: give every block back first
            self.abort_all()
            raise

    def abort_all(self) -> None:
        """Drop every sequence still held, newest first, and its blocks (device and swap space), so
        an interrupted ``run`` leaks nothing. Blocks a prefix cache had promised but that were never
        written leave the cache (kv/prefix_cache.py), so a later request cannot read them."""
        self.policy.drain_copies()
        for seq_id in reversed(self.policy.seq_ids()):
            self.policy.free(seq_id)
        if self.swap_space is not None:
            for seq_id in self.swap_space.seq_ids():
                self.swap_space.drop(seq_id)
        self.scheduler = self._new_scheduler()
