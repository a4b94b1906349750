"""Chapter 06: continuous (iteration-level) batching, with preemption by recompute or by swap.

A static batcher runs a batch until its longest request ends. This scheduler decides again at every
step (every forward pass), in three moves:

    1. running requests, oldest first, get room for their next token; when the pool has no block
       for one, the newest running request is preempted (last come, first out);
    2. if nobody was preempted, swapped-out requests come back, oldest first, while they fit;
    3. if nobody was preempted and nothing is swapped out, waiting requests are admitted, first come
       first served, while the KV policy has room (its watermark included), within ``max_num_seqs``
       sequences and ``max_num_batched_tokens`` tokens (a step with nothing else in it takes the
       head whole; chapter 08's scheduler/chunked.py cuts it into chunks instead).

A finished sequence frees its blocks at once, so they serve a waiting request at the next step.
Preemption by ``preemption_mode``: "recompute" frees the request's blocks and puts it back at the
head of the queue, to be prefilled again with what it generated (several samples come back as one
request each; a beam search starts over); "swap" copies its blocks to the CPU swap space (kv/swap.py)
and brings them back later, or recomputes if the swap space is full.

Nothing starves: preempted requests return before anything new is admitted. A request that could
never fit (a sample longer than the pool, a beam search that could outgrow it) is refused with the
reason when it reaches the head of the queue, and the others go on. With a prefix cache (chapter 07)
the blocks already cached count as computed and only the rest counts against the token budget.

Not handled: priorities, favouring requests with long cache hits.
"""
from __future__ import annotations

import itertools
from collections import deque

from minipaged.beam_search import BeamSearchOutput
from minipaged.config import PREEMPTION_MODES, EngineArgs
from minipaged.kv.base import NoFreeMemory
from minipaged.metrics import engine_metrics
from minipaged.request import Request, RequestStatus
from minipaged.step import ScheduledSeq, StepPlan, StepResult

# Every event the scheduler counts (``stats``), with the metric that counts it too, if any:
EVENTS = {"preemptions": "minipaged:num_preemptions", "preempted_recompute": None, "preempted_swap": None,
          "swap_fallbacks": None, "refused": "minipaged:num_requests_refused",
          "blocks_swapped_out": "minipaged:blocks_swapped_out", "blocks_swapped_in": "minipaged:blocks_swapped_in",
          "forks": None, "spec_seq_steps": None, "spec_draft_tokens": "minipaged:spec_decode_num_draft_tokens",
          "spec_accepted_tokens": "minipaged:spec_decode_num_accepted_tokens"}


class ContinuousScheduler:
    name = "continuous"

    def __init__(self, policy, *, max_num_seqs: int = EngineArgs.max_num_seqs,
                 max_num_batched_tokens: int | None = None, preemption_mode: str = EngineArgs.preemption_mode,
                 swap_space=None, metrics=None):
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode={preemption_mode!r} is not known; "
                             f"choose one of {list(PREEMPTION_MODES)}")
        if preemption_mode == "swap" and swap_space is None:
            raise ValueError("preemption_mode='swap' needs a swap space (swap_space_tokens > 0)")
        self.policy, self.swap_space = policy, swap_space
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.preemption_mode = preemption_mode
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the newest is preempted first
        self.swapped: deque[Request] = deque()
        self._uids = itertools.count()
        self.next_seq_id = itertools.count().__next__  # ids for the sequences of requests and beams
        self.metrics = metrics if metrics is not None else engine_metrics()
        self.stats = dict.fromkeys(EVENTS, 0)  # every scheduling event, counted once where it happens
        self._counters = {event: self.metrics.counter(name) for event, name in EVENTS.items() if name}

    def _count(self, event: str, n: int = 1) -> None:
        """Tally an event; the ones the metrics registry names (minipaged:num_preemptions, ...) go into
        its counters by the same call."""
        self.stats[event] = self.stats.get(event, 0) + n
        if event in self._counters:
            self._counters[event].inc(n)

    # ---- the queues ---------------------------------------------------------------------------

    def add(self, request: Request) -> Request:
        """Queue a request: its first sequence, and the samples to fork from it once its prompt is
        cached (``request.children``), or a beam search that starts from this one sequence."""
        request.uid = next(self._uids)
        self.waiting.append(request)
        return request

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def release_all(self) -> None:
        """Give back every block still held, on the device and in the swap space (after every request
        was aborted: what a client that drove the scheduler by hand may have left behind)."""
        self.policy.drain_copies()
        for seq_id in reversed(self.policy.seq_ids()):
            self.policy.free(seq_id)
        if self.swap_space is not None:
            for seq_id in self.swap_space.seq_ids():
                self.swap_space.drop(seq_id)

    def num_running_seqs(self) -> int:
        return sum(g.num_seqs for g in self.running)

    # ---- one step -----------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan one step: who runs, the slots of their new tokens, and the block copies to make first."""
        plan = StepPlan()
        self._plan_step(plan)
        plan.copies = self.policy.drain_copies()  # every copy on write the step's slots asked for
        if not plan.work and not (plan.refused or plan.preempted) and self.has_work():  # a bug, not a full pool
            head = (self.waiting or self.swapped or self.running)[0]
            raise RuntimeError(f"request {head.request_id} can neither be scheduled nor refused")
        return plan

    def _plan_step(self, plan: StepPlan) -> None:
        self._schedule_running(plan)
        if not plan.preempted:
            self._swap_in(plan)
        if not plan.preempted and not self.swapped:
            self._admit(plan)

    def _appends(self, request: Request) -> list[tuple[int, int]]:
        return [(s.seq_id, s.num_tokens - self.policy.num_tokens(s.seq_id)) for s in request.seqs]

    def _plan(self, request: Request, plan: StepPlan) -> None:
        """Slots for every uncached token of the request (the caller has checked they fit)."""
        for seq in request.seqs:
            self._schedule_seq(request, seq, seq.num_tokens - self.policy.num_tokens(seq.seq_id), plan)

    def _schedule_seq(self, request: Request, seq, n: int, plan: StepPlan) -> ScheduledSeq:
        """Plan seq's next n uncached tokens: their slots, and, once its prompt is all in, the samples
        waiting to fork from it (chapter 05), whose first tokens the runner draws from the same row."""
        work = ScheduledSeq(request, seq, self.policy.num_tokens(seq.seq_id), self.policy.append_slots(seq.seq_id, n))
        if request.children and seq is request.seqs[0] and work.completes:
            work.forks = list(request.children)
        plan.work.append(work)
        return work

    def _schedule_running(self, plan: StepPlan) -> None:
        # exercise 06.2: begin
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if self.policy.can_append_all(self._appends(request)):
                self._plan(request, plan)
                i += 1
            else:  # a victim goes; the default, the newest, sits at or after i: not planned yet
                at = self.running.index(self._victim())
                i -= at < i  # one planned already (another rule's): the index moves back with the list
                self._preempt(self.running.pop(at), plan)
        # exercise 06.2: end

    def _victim(self) -> Request:
        """The request preemption takes: the newest, as in vLLM (chapter 06's question 3 tries another)."""
        return self.running[-1]

    def _swap_in(self, plan: StepPlan) -> None:
        running = self.num_running_seqs()
        while self.swapped:
            request = self.swapped[0]
            if self.running and running + request.num_seqs > self.max_num_seqs:
                return
            ids = [s.seq_id for s in request.seqs]
            appends = [(s.seq_id, s.num_tokens - self.swap_space.num_tokens(s.seq_id)) for s in request.seqs]
            needed = self.swap_space.blocks_to_resume(appends)
            if needed + (self.policy.watermark_blocks if self.running else 0) > self.policy.num_free_blocks:
                if not self.running and needed > self.policy.num_free_blocks:
                    # even the pool with nobody else in it is too small for the request's next step (its
                    # samples grew apart): it comes back by recompute, one request per sample
                    self.swapped.popleft()
                    for seq_id in ids:
                        self.swap_space.drop(seq_id)
                    self._count("swap_fallbacks")
                    self._requeue(request)
                    continue
                return
            self.swapped.popleft()
            to_device = self.policy.attach_swapped(self.swap_space.tables_of(ids))  # fresh device blocks
            copies = self.swap_space.swap_in(ids, to_device)
            plan.swap_in += copies
            self._count("blocks_swapped_in", len(copies))
            request.status = RequestStatus.RUNNING
            running += request.num_seqs
            self.running.append(request)
            self._plan(request, plan)

    def _may_admit(self, request: Request) -> bool:
        """Whether the queue head may start now (static batching says no while a batch runs)."""
        return True

    def _admit(self, plan: StepPlan) -> None:
        # exercise 06.3: begin
        running = self.num_running_seqs()
        while self.waiting:
            request = self.waiting[0]
            if not self._may_admit(request):
                return
            if self.running and running + request.num_seqs > self.max_num_seqs:
                return
            if self._over_budget(request, plan):
                return
            reason = self._never_fits(request)
            if reason is None:
                try:
                    admitted = self._allocate(request)
                except ValueError as e:  # the policy says it can never fit
                    admitted, reason = False, str(e)
                if not admitted and reason is None:
                    if not self.running and len(request.seqs) > 1 and not request.beam_width:
                        # its samples do not fit side by side even in an empty pool: one request each
                        self.waiting.popleft()
                        self._requeue(request)
                        continue
                    return  # first come, first served: nobody jumps the queue
            self.waiting.popleft()
            if reason is not None:
                self._refuse(request, reason, plan)
                continue
            running += request.num_seqs
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._plan(request, plan)
        # exercise 06.3: end

    def _over_budget(self, request: Request, plan: StepPlan) -> bool:
        """Whether admitting the request whole would take the step past ``max_num_batched_tokens``
        (a step with nothing else in it takes it anyway; chapter 08's scheduler chunks it instead)."""
        budget = self.max_num_batched_tokens
        return budget is not None and bool(plan.work) and plan.num_tokens + self._tokens_to_compute(request) > budget

    def _allocate(self, request: Request) -> bool:
        """Allocate every sequence of the request, all or nothing. False if there is no room now;
        ValueError (nothing allocated) if the policy says it can never fit."""
        done = []
        try:
            for seq in request.seqs:  # with a prefix cache (chapter 07) its cached blocks count as computed
                self.policy.allocate(seq.seq_id, seq.num_tokens, self._remaining(seq), token_ids=seq.all_ids)
                if not seq.output_ids:
                    seq.num_cached_tokens = self.policy.num_tokens(seq.seq_id)
                done.append(seq)
        except (NoFreeMemory, ValueError) as e:
            for seq in done:
                self.policy.free(seq.seq_id)
            if isinstance(e, NoFreeMemory):
                return False
            raise
        return True

    def _tokens_to_compute(self, request: Request) -> int:
        """New tokens the request's admission adds to the step: its outputs too, if it was preempted, and
        minus what the prefix cache would serve (chapter 07)."""
        return sum(s.num_tokens - self.policy.cached_prefix_tokens(s.all_ids) for s in request.seqs)

    @staticmethod
    def _remaining(seq) -> int:
        return max(seq.max_new_tokens - len(seq.output_ids), 1)

    def _never_fits(self, request: Request) -> str | None:
        """Why the request could never run even in an empty pool, or None. The policy checks each
        sequence alone (``allocate`` raises ValueError). Samples that outgrow the pool together are
        not refused: preemption by recompute splits them into one request each, and each fits alone.
        A beam search cannot be split: its worst case must fit whole (beam_search.py)."""
        return request.beam.never_fits(self.policy) if request.beam is not None else None

    # ---- preemption, refusal, abort ------------------------------------------------------------

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        plan.preempted += 1
        kept = [w for w in plan.work if w.request is not request]  # planned already (another victim rule):
        planned, plan.work = len(kept) < len(plan.work), kept  # its work leaves the plan, and it is recomputed
        self._count("preemptions")
        ids = [s.seq_id for s in request.seqs]
        cached = sum(self.policy.num_tokens(i) for i in ids)
        if self.preemption_mode == "swap" and cached and not planned:
            if self.swap_space.can_swap_out(self.policy, ids):  # the policy lets go of the blocks, the swap
                copies = self.swap_space.swap_out({i: self.policy.detach(i) for i in ids})  # space keeps them
                plan.swap_out += copies
                self._count("blocks_swapped_out", len(copies))
                self._count("preempted_swap")
                request.status = RequestStatus.SWAPPED
                self.swapped.appendleft(request)  # the newest victim first: they come back oldest first
                return
            self._count("swap_fallbacks")
        self._count("preempted_recompute")
        for seq_id in ids:
            self.policy.free(seq_id)
        self._requeue(request)

    def _requeue(self, request: Request) -> None:
        """Put a request that holds no blocks back at the head of the queue, to be prefilled again.
        Several samples come back as one request each (``Request.split``), unshared, in the request's
        order; a beam search starts over from its prompt, as one sequence (``BeamState.restart``)."""
        # exercise 06.1: begin
        request.status = RequestStatus.WAITING
        if request.beam is not None:
            request.seqs = [request.beam.restart(self.next_seq_id())]
            self.waiting.appendleft(request)
            return
        for seq in reversed(request.seqs[1:]):
            part = request.split(seq, next(self._uids))
            self._on_split(request, part)
            self.waiting.appendleft(part)
        self.waiting.appendleft(request)
        # exercise 06.1: end

    def _on_split(self, request: Request, part: Request) -> None:
        """A recomputed request of several samples became one request per sample (static batching
        keeps the parts in its batch)."""

    def _refuse(self, request: Request, reason: str, plan: StepPlan) -> None:
        """The request can never fit: it leaves the queues holding nothing, and the step's output
        ends it (``update_from_output``) with the reason."""
        request.refusal_reason = reason
        self._count("refused")
        plan.refused.append(request)

    def abort(self, request: Request, now: float) -> None:
        """Drop the request wherever it is (waiting, running, swapped out; all its parts), with every
        block it holds on the device or in the swap space."""
        held = set(self.policy.seq_ids())
        swapped = set(self.swap_space.seq_ids()) if self.swap_space is not None else set()
        for queue in (self.waiting, self.running, self.swapped):
            for unit in [r for r in queue if r.root is request]:
                queue.remove(unit)
                for seq in unit.seqs:
                    if seq.seq_id in held:
                        self.policy.free(seq.seq_id)
                    if seq.seq_id in swapped:
                        self.swap_space.drop(seq.seq_id)
                unit.seqs, unit.children = [], []
                if unit is not request:
                    self._leave(unit, RequestStatus.ABORTED, now)
        for seq in request.samples:
            if not seq.finished:
                seq.finish_reason, seq.stop_reason, seq.finished_time = "abort", None, now
        self._leave(request, RequestStatus.ABORTED, now)

    def _on_done(self, request: Request) -> None:
        """Hook: the request (or a part of one) has left (finished, refused or aborted)."""

    # ---- the step's output ----------------------------------------------------------------------

    def update_from_output(self, plan: StepPlan, output, now: float) -> StepResult:
        """Apply what the runner returned (step.py's RunnerOutput) to the books, as vLLM V1's
        ``Scheduler.update_from_output`` does. For each planned sequence, in plan order:

            1. its tokens' K/V is written now: they are committed to the KV policy (a prefix cache,
               chapter 07, makes the blocks they filled findable). This is the one place that commits;
            2. a prompt chunk with more to come (chapter 08) stops here: it sampled nothing;
            3. a beam (chapter 05) keeps its candidates; once every live beam of the search has its
               own, the search ranks them (``_advance_beams``);
            4. otherwise the samples waiting to fork from it are forked (chapter 05) and get their
               first tokens, and it gets its own: one, or a draft's accepted guesses and one more
               (chapter 09), whose rejected guesses' slots go back (``policy.truncate``);
            5. a sequence that ended frees its blocks at once; its request ends once all its
               samples have (``_leave``, the one place a request ends).

        Returns a ``StepResult``: the requests that changed, in order, and what the core's metrics need."""
        result = StepResult()
        for request in plan.refused:
            self._end_refused(request, now, result)
        searches = {}
        for work, out in zip(plan.work, output.seqs):
            request, seq = work.request, work.seq
            self.policy.commit_tokens(seq.seq_id, work.tokens[:work.num_own])
            if not work.completes:  # chapter 08: a prompt chunk with more to come samples nothing yet
                continue
            if request.beam is not None:  # ranked once every beam of the search has its candidates
                request.beam.rows[seq.seq_id] = out.candidates
                searches[id(request)] = request
                continue
            for child, sampled in zip(self._fork(request, work), out.forks):
                self._append(request, child, [sampled], now, result)
                if child.finished:
                    self._finish(request, child, now, result)
            before = seq.num_tokens
            kept = self._append(request, seq, out.sampled, now, result)
            if work.draft:  # chapter 09: the right guesses keep their K/V, the others' slots go back
                accepted = work.draft[:kept - 1]
                self.policy.truncate(seq.seq_id, before + len(accepted))
                self.policy.commit_tokens(seq.seq_id, accepted)
                self._count("spec_accepted_tokens", len(accepted))
            if seq.finished:
                self._finish(request, seq, now, result)
        for request in searches.values():
            if request.beam.ready():
                self._advance_beams(request, now, result)
        return result

    def _append(self, request: Request, seq, sampled: list, now: float, result: StepResult) -> int:
        """Append the runner's tokens to seq until it ends (a stop string is found here, in the text);
        returns how many it took. Notes when each came, and the request's first token."""
        for n, s in enumerate(sampled, 1):
            seq.append(s.token_id, s.logprob, s.top_logprobs)
            if seq.token_times:
                result.gaps.append(now - seq.token_times[-1])
            seq.token_times.append(now)
            if seq.first_token_time is None:
                seq.first_token_time = now
            self._tokens_came(request, seq.num_cached_tokens, 1, now, result)
            if seq.finished:
                return n
        return len(sampled)

    def _tokens_came(self, request: Request, cached: int, n: int, now: float, result: StepResult) -> None:
        root = request.root
        if root.first_token_time is None:  # its first token: the prompt is counted once, with its hit
            root.first_token_time = now
            result.first.append((root, cached))
        result.num_tokens += n
        result.changed[root.request_id] = None

    def _fork(self, request: Request, work: ScheduledSeq) -> list:
        """The samples waiting on this prompt, forked now that it is cached (chapter 05): they share its
        blocks and run beside it from here on."""
        if not work.forks:
            return []
        request.children = [c for c in request.children if c not in work.forks]
        for child in work.forks:
            self.policy.fork(work.seq.seq_id, child.seq_id)
            request.seqs.append(child)
        self._count("forks", len(work.forks))
        return work.forks

    def _finish(self, request: Request, seq, now: float, result: StepResult) -> None:
        """seq is done: its blocks go back, and its request leaves once all its samples are done."""
        self.policy.free(seq.seq_id)
        request.seqs.remove(seq)
        seq.finished_time = now
        request.root.done.add(seq.seq_id)
        result.changed[request.root.request_id] = None
        if not request.seqs and not request.children:
            self.running.remove(request)
            self._leave(request, RequestStatus.FINISHED, now, result)

    def _end_refused(self, request: Request, now: float, result: StepResult) -> None:
        """A request the plan refused (``_refuse``) ends, with every sample it still had."""
        for seq in [*request.seqs, *request.children]:
            seq.finish_reason = "abort"
            request.root.done.add(seq.seq_id)
        request.seqs, request.children = [], []
        if request.beam is not None:
            request.beam.output = BeamSearchOutput([], refused=request.refusal_reason)
        result.changed[request.root.request_id] = None
        self._leave(request, RequestStatus.REFUSED, now, result)

    def _leave(self, request: Request, status: RequestStatus, now: float, result: StepResult | None = None) -> None:
        """The one place a request ends. ``request`` (or a part split off it) has left the queues; the
        request the client sees ends once every one of its samples has, or at once if it is aborted.
        A refused part makes the whole request refused, with the part's reason."""
        self._on_done(request)
        root = request.root
        if request is not root:
            request.status = status
        if status is RequestStatus.REFUSED and root.refusal_reason is None:
            root.refusal_reason = request.refusal_reason
        if root.status.is_over or (status is not RequestStatus.ABORTED and len(root.done) < len(root.samples)):
            return
        refused = root.refusal_reason is not None and status is not RequestStatus.ABORTED
        root.status = RequestStatus.REFUSED if refused else status
        root.finished_time = now
        if result is not None:
            result.finished.append(root)

    # ---- beam search (chapter 05) ---------------------------------------------------------------

    def _advance_beams(self, request: Request, now: float, result: StepResult) -> None:
        """One step of a beam search: the search ranks its beams' candidates (beam_search.py), and the
        K/V follows the new beams: a beam that branches forks its parent's blocks, a parent nobody
        continues is freed (its shared blocks lose a holder). Ends the search when it says so."""
        cached = request.seqs[0].num_cached_tokens
        moves = request.beam.advance(self.next_seq_id)
        self._tokens_came(request, cached, moves.num_tokens, now, result)
        for parent, child in moves.forks:
            self.policy.fork(parent.seq_id, child.seq_id)
            request.seqs.append(child)
        self._count("forks", len(moves.forks))
        for seq in moves.freed:
            self.policy.free(seq.seq_id)
            request.seqs.remove(seq)
        if request.beam.output is not None:
            self.running.remove(request)
            self._leave(request, RequestStatus.FINISHED, now, result)
