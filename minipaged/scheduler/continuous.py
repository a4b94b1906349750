"""Chapter 06: continuous (iteration-level) batching, with preemption by recompute or by swap.

A static batcher picks a batch, runs it until its longest request ends, then picks the next. This
scheduler decides again at **every step** (every forward pass), in three moves:

    1. running requests, oldest first, get room for their next token. If the pool has no block for a
       request, the newest running request is preempted to make room (last come, first out);
    2. if nobody was preempted this step, swapped-out requests come back, oldest first, while the
       pool has room for them and their next token (plus the watermark);
    3. if nobody was preempted and nothing is left swapped out, waiting requests are admitted, first
       come first served, while the KV policy has room (its own watermark included), the running
       sequences stay within ``max_num_seqs`` and the step's tokens within ``max_num_batched_tokens``.

A finished request leaves at once, so its blocks serve a waiting one at the very next step.

Preemption, by ``preemption_mode``:
    "recompute"  free the request's blocks and put it back at the head of the queue; when it is
                 admitted again its prompt *and* everything it generated are prefilled as one
                 prompt. Cheap in memory, costs compute. A request of several samples comes back
                 as one request per sample (each re-prefilled on its own, no longer sharing); a
                 beam search starts over from its prompt (``plan.restarted``; it is deterministic,
                 so only its cost changes).
    "swap"       copy the request's blocks to the CPU swap space (kv/swap.py; shared blocks once)
                 and free them; swap them back in later. Costs two copies, no compute. If the swap
                 space cannot hold the request, it is recomputed instead (``swap_fallbacks``).

Nothing starves: preempted requests return before anything new is admitted, in their original
order. A request that could never fit (a sample longer than the whole pool, or a beam search whose
beams could outgrow it) is refused with the reason when it reaches the head of the queue, and the
others go on. Samples that fit one by one but not side by side are served one request each, as a
recompute splits them; a swapped-out request that cannot come back even into an otherwise empty
pool is recomputed instead, so every request is either served or refused.

The token budget: a step's new tokens stay within ``max_num_batched_tokens``, except that a step
with nothing else in it always takes the head of the queue whole, so a long prompt is never starved
(chapter 08's scheduler, scheduler/chunked.py, splits such prompts into chunks instead).

With a prefix cache (chapter 07) a request is admitted with its token ids, so the blocks already
cached count as computed, and only its uncached tokens count against the token budget.

Not handled: priorities, chunked prefill (chapter 08, scheduler/chunked.py builds it on this one),
favouring requests with long cache hits.
"""

from __future__ import annotations

import itertools
from collections import deque

from minipaged.config import PREEMPTION_MODES
from minipaged.kv.base import NoFreeMemory
from minipaged.scheduler.plan import Group, ScheduledSeq, StepPlan


class ContinuousScheduler:
    name = "continuous"

    def __init__(self, policy, *, max_num_seqs: int = 64, max_num_batched_tokens: int | None = None,
                 preemption_mode: str = "recompute", swap_space=None, stats: dict | None = None):
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode={preemption_mode!r} is not known; "
                             f"choose one of {list(PREEMPTION_MODES)}")
        if preemption_mode == "swap" and swap_space is None:
            raise ValueError("preemption_mode='swap' needs a swap space (swap_space_tokens > 0)")
        self.policy, self.swap_space = policy, swap_space
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.preemption_mode = preemption_mode
        self.waiting: deque[Group] = deque()
        self.running: list[Group] = []  # in admission order: the newest is preempted first
        self.swapped: deque[Group] = deque()
        self.stats = stats if stats is not None else {}
        for key in ("preemptions", "preempted_recompute", "preempted_swap", "swap_fallbacks", "refused",
                    "blocks_swapped_out", "blocks_swapped_in", "forks"):
            self.stats.setdefault(key, 0)
        self._group_ids = itertools.count()
        self._group_of: dict[int, Group] = {}  # seq_id -> its group (live and waiting children too)

    # ---- the queues ---------------------------------------------------------------------------

    def add(self, seq, children=(), beam_width: int = 0) -> Group:
        """Queue a request: one sequence, and the samples to fork from it once its prompt is cached
        (or, with beam_width, a beam search that starts from this one sequence)."""
        group = Group(next(self._group_ids), [seq], list(children), beam_width)
        for s in [seq, *group.children]:
            self._group_of[s.seq_id] = group
        self.waiting.append(group)
        return group

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def num_running_seqs(self) -> int:
        return sum(g.num_seqs for g in self.running)

    # ---- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self._schedule_running(plan)
        if not plan.preempted:
            self._swap_in(plan)
        if not plan.preempted and not self.swapped:
            self._admit(plan)
        return plan

    def _appends(self, group: Group) -> list[tuple[int, int]]:
        return [(s.seq_id, s.num_tokens - self.policy.num_tokens(s.seq_id)) for s in group.seqs]

    def _plan(self, group: Group, plan: StepPlan) -> None:
        """Slots for every uncached token of the group (the caller has checked they fit)."""
        for seq in group.seqs:
            cached = self.policy.num_tokens(seq.seq_id)
            plan.work.append(ScheduledSeq(seq, cached, self.policy.append_slots(seq.seq_id, seq.num_tokens - cached)))

    def _schedule_running(self, plan: StepPlan) -> None:
        # exercise 06.2: begin
        i = 0
        while i < len(self.running):
            group = self.running[i]
            if self.policy.can_append_all(self._appends(group)):
                self._plan(group, plan)
                i += 1
            else:  # the newest goes; it has not been planned yet, since it sits at or after i
                self._preempt(self.running.pop(), plan)
        # exercise 06.2: end

    def _swap_in(self, plan: StepPlan) -> None:
        running = self.num_running_seqs()
        while self.swapped:
            group = self.swapped[0]
            if self.running and running + group.num_seqs > self.max_num_seqs:
                return
            ids = [s.seq_id for s in group.seqs]
            appends = [(s.seq_id, s.num_tokens - self.swap_space.num_tokens(s.seq_id)) for s in group.seqs]
            needed = self.swap_space.blocks_to_resume(appends)
            if needed + (self._watermark() if self.running else 0) > self.policy.pool.num_free:
                if not self.running and needed > self.policy.pool.num_free:
                    # even the pool with nobody else in it is too small for the group's next step (its
                    # samples grew apart): it comes back by recompute, one request per sample
                    self.swapped.popleft()
                    for seq_id in ids:
                        self.swap_space.drop(seq_id)
                    self.stats["swap_fallbacks"] += 1
                    self._requeue(group, plan)
                    continue
                return
            self.swapped.popleft()
            copies = self.swap_space.swap_in(self.policy, ids)
            plan.swap_in += copies
            self.stats["blocks_swapped_in"] += len(copies)
            running += group.num_seqs
            self.running.append(group)
            self._plan(group, plan)

    def _may_admit(self, group: Group) -> bool:
        """Whether the queue head may start now (static batching says no while a batch runs)."""
        return True

    def _admit(self, plan: StepPlan) -> None:
        # exercise 06.3: begin
        running = self.num_running_seqs()
        while self.waiting:
            group = self.waiting[0]
            if not self._may_admit(group):
                return
            if self.running and running + group.num_seqs > self.max_num_seqs:
                return
            if self._over_budget(group, plan):
                return
            reason = self._never_fits(group)
            if reason is None:
                try:
                    admitted = self._allocate(group)
                except ValueError as e:  # the policy says it can never fit
                    admitted, reason = False, str(e)
                if not admitted and reason is None:
                    if not self.running and len(group.seqs) > 1 and not group.beam_width:
                        # its samples do not fit side by side even in an empty pool: one request each
                        self.waiting.popleft()
                        self._requeue(group, plan)
                        continue
                    return  # first come, first served: nobody jumps the queue
            self.waiting.popleft()
            if reason is not None:
                self._refuse(group, reason, plan)
                continue
            running += group.num_seqs
            self.running.append(group)
            self._plan(group, plan)
        # exercise 06.3: end

    def _over_budget(self, group: Group, plan: StepPlan) -> bool:
        """Whether admitting the group whole would take the step past ``max_num_batched_tokens``
        (a step with nothing else in it takes it anyway; chapter 08's scheduler chunks it instead)."""
        budget = self.max_num_batched_tokens
        return budget is not None and bool(plan.work) and plan.num_tokens + self._tokens_to_compute(group) > budget

    def _allocate(self, group: Group) -> bool:
        """Allocate every sequence of the group, all or nothing. False if there is no room now;
        ValueError (nothing allocated) if the policy says it can never fit."""
        done = []
        try:
            for seq in group.seqs:
                if self.policy.caches_prefixes:  # chapter 07: the cached blocks of its tokens count as computed
                    self.policy.allocate(seq.seq_id, seq.num_tokens, self._remaining(seq), token_ids=seq.all_ids)
                    if not seq.output_ids:
                        seq.num_cached_tokens = self.policy.num_tokens(seq.seq_id)
                else:
                    self.policy.allocate(seq.seq_id, seq.num_tokens, self._remaining(seq))
                done.append(seq)
        except (NoFreeMemory, ValueError) as e:
            for seq in done:
                self.policy.free(seq.seq_id)
            if isinstance(e, NoFreeMemory):
                return False
            raise
        return True

    def _tokens_to_compute(self, group: Group) -> int:
        """New tokens the group's admission adds to the step: its outputs too, if it was preempted, and
        minus what the prefix cache would serve (chapter 07)."""
        cached = self.policy.cached_prefix_tokens if self.policy.caches_prefixes else lambda ids: 0
        return sum(s.num_tokens - cached(s.all_ids) for s in group.seqs)

    @staticmethod
    def _remaining(seq) -> int:
        return max(seq.max_new_tokens - len(seq.output_ids), 1)

    def _never_fits(self, group: Group) -> str | None:
        """Why the group could never run even in an empty pool, or None. The policy checks each
        sequence alone (``allocate`` raises ValueError). Samples that outgrow the pool together are
        not refused: preemption by recompute splits them into one request each, and each fits alone.
        A beam search cannot be split, so its worst case must fit whole."""
        if not group.beam_width or not hasattr(self.policy, "pool"):
            return None
        from minipaged.beam_search import worst_case_blocks

        bs, num_blocks = self.policy.block_size, self.policy.num_blocks
        seq = group.seqs[0]
        worst = worst_case_blocks(len(seq.prompt_ids), seq.max_new_tokens, group.beam_width, bs)
        if worst <= num_blocks:
            return None
        return (f"beam search with beam_width={group.beam_width} over a {len(seq.prompt_ids)}-token prompt and "
                f"max_tokens={seq.max_new_tokens} may need {worst} blocks; the whole pool has {num_blocks}")

    def _watermark(self) -> int:
        return getattr(self.policy, "watermark_blocks", 0)

    # ---- preemption, refusal, forks, finishing --------------------------------------------------

    def _preempt(self, group: Group, plan: StepPlan) -> None:
        plan.preempted += 1
        self.stats["preemptions"] += 1
        ids = [s.seq_id for s in group.seqs]
        cached = sum(self.policy.num_tokens(i) for i in ids)
        if self.preemption_mode == "swap" and cached:
            if self.swap_space.can_swap_out(self.policy, ids):
                copies = self.swap_space.swap_out(self.policy, ids)
                plan.swap_out += copies
                self.stats["blocks_swapped_out"] += len(copies)
                self.stats["preempted_swap"] += 1
                self._queue_swapped(group)
                return
            self.stats["swap_fallbacks"] += 1
        self.stats["preempted_recompute"] += 1
        for seq_id in ids:
            self.policy.free(seq_id)
        self._requeue(group, plan)

    def _requeue(self, group: Group, plan: StepPlan) -> None:
        """Put a request that holds no blocks back at the head of the queue, to be prefilled again.
        Several samples come back as one request each, unshared, in the group's order; a beam search
        starts over from its prompt (``plan.restarted``: the core resets it)."""
        # exercise 06.1: begin
        if group.beam_width:
            plan.restarted.append(group)
            self.waiting.appendleft(group)
            return
        for seq in reversed(group.seqs[1:]):
            alone = Group(next(self._group_ids), [seq])
            self._group_of[seq.seq_id] = alone
            self._on_split(group, alone)
            self.waiting.appendleft(alone)
        group.seqs = group.seqs[:1]
        self.waiting.appendleft(group)
        # exercise 06.1: end

    def _queue_swapped(self, group: Group) -> None:
        """Swapped requests come back oldest first, and the newest is preempted first: so each new
        victim goes to the front (it was admitted after everyone already swapped out)."""
        self.swapped.appendleft(group)

    def _on_split(self, group: Group, part: Group) -> None:
        """A recomputed request of several samples became one request per sample (static batching
        keeps the parts in its batch)."""

    def _refuse(self, group: Group, reason: str, plan: StepPlan) -> None:
        for seq in [*group.seqs, *group.children]:
            seq.finish_reason, seq.stop_reason = "abort", f"refused: {reason}"
            plan.refused.append(seq)
            self._group_of.pop(seq.seq_id, None)
        self.stats["refused"] += group.num_seqs
        group.seqs, group.children = [], []
        self._on_done(group)

    def abort(self, seq_ids) -> None:
        """Drop the requests these sequences belong to, wherever they are (waiting, running, swapped
        out), with every block they hold on the device or in the swap space."""
        groups = {id(g): g for g in (self._group_of.get(i) for i in seq_ids) if g is not None}
        held = set(self.policy.seq_ids())
        swapped = set(self.swap_space.seq_ids()) if self.swap_space is not None else set()
        for group in groups.values():
            for queue in (self.waiting, self.running, self.swapped):
                if any(g is group for g in queue):
                    queue.remove(group)
            for seq in group.seqs:
                if seq.seq_id in held:
                    self.policy.free(seq.seq_id)
                if seq.seq_id in swapped:
                    self.swap_space.drop(seq.seq_id)
            for seq in [*group.seqs, *group.children]:
                self._group_of.pop(seq.seq_id, None)
            group.seqs, group.children = [], []
            self._on_done(group)

    def fork_seq(self, parent, child) -> None:
        """A beam branches: child starts with parent's blocks (shared, nothing copied) in its group."""
        group = self._group_of[parent.seq_id]
        self.policy.fork(parent.seq_id, child.seq_id)
        group.seqs.append(child)
        self._group_of[child.seq_id] = group
        self.stats["forks"] += 1

    def restart(self, group: Group, seq) -> None:
        """A preempted beam search starts over: its only sequence is now ``seq`` (its prompt)."""
        for old in group.seqs:
            self._group_of.pop(old.seq_id, None)
        group.seqs = [seq]
        self._group_of[seq.seq_id] = group

    def drop_seq(self, seq) -> None:
        """A beam is pruned: its blocks go back (shared ones lose a holder); its group goes on."""
        group = self._group_of.pop(seq.seq_id)
        self.policy.free(seq.seq_id)
        group.seqs.remove(seq)

    def fork_children(self, seq) -> list:
        """The samples waiting to fork from seq, forked now that its prompt is cached (sharing policies)."""
        group = self._group_of[seq.seq_id]
        if not group.children or group.seqs[0] is not seq:
            return []
        children, group.children = group.children, []
        for child in children:
            self.policy.fork(seq.seq_id, child.seq_id)
            group.seqs.append(child)
        self.stats["forks"] += len(children)
        return children

    def finish(self, seq) -> None:
        """seq is done: its blocks go back, and its request leaves once all its samples are done."""
        self.policy.free(seq.seq_id)
        group = self._group_of.pop(seq.seq_id)
        group.seqs.remove(seq)
        if group.done:
            self.running.remove(group)
            self._on_done(group)

    def _on_done(self, group: Group) -> None:
        """Hook: the request has left (finished or refused)."""
