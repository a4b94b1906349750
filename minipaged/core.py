"""The engine core: the one loop that admits, preempts, runs and finishes requests.

    core = EngineCore(args, policy, runner, tokenizer, eos_token_id, max_model_len)
    core.add_request("r1", prompt_ids, SamplingParams(max_tokens=8))
    while core.has_unfinished_requests():
        changed = core.step()          # ids of the requests that got tokens, finished or were refused
    core.abort_request(["r2"])         # its blocks are back in the pool before the next step

Each step:

    1. the scheduler plans (scheduler/): which requests run, and for every token whose K/V is not
       cached yet, a slot from the KV policy (kv/). Admission, the watermark, the token budget,
       chunks (chapter 08), drafts (chapter 09) and preemption (recompute, swap) all happen there;
    2. the runner executes the plan (runner.py): block copies, then one forward pass over every
       planned token, returning each sequence's logits rows (a synthetic runner returns none);
    3. the core samples one token for each sequence whose last token was computed, or checks a
       draft's guesses and keeps those the model agrees with (spec/verify.py); then it tells the
       scheduler which sequences finished, so their memory serves someone else at the next step.

Everything that happens is counted in the metrics registry (metrics.py): requests running and
waiting, KV usage, preemptions, prefix-cache queries and hits, tokens, latencies. A benchmark that
needs one record per step subscribes a recorder (``core.metrics.recording()``).

Parallel sampling. With a policy that shares blocks (chapter 05) the n samples of a request are one
group: the first is prefilled, the others wait beside it and are forked from it (same blocks, no
copy) when its prompt is cached; each then samples its first token from the prompt's logits with
its own generator. Other policies run the n samples as n independent sequences. Sample i always
draws from a generator seeded with ``sample_seed(seed, i)``, so the outputs are the same either way.

The same core runs the model (ModelRunner), chapter 00's per-sequence memory (PerRequestRunner) and
the simulators (SyntheticRunner): one loop, whatever executes the plan.

Not handled yet: priorities, several engine cores (data parallelism), pipelining a step's scheduling
with the previous step's forward pass.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from minipaged.metrics import engine_metrics
from minipaged.sampling import sample_seed
from minipaged.sampling_params import SamplingParams
from minipaged.sequence import Sequence
from minipaged.spec.verify import verify


@dataclass
class CoreRequest:
    """One request inside the core: its n sequences, and when things happened to it."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    aborted: bool = False
    extra: dict = field(default_factory=dict)  # what a front end keeps with it (its prompt text)
    beam: object = None  # a beam search's BeamState (beam_search.py), or None
    done: set = field(default_factory=set)  # ids of its sequences that have finished (counted, not scanned)

    @property
    def finished(self) -> bool:
        if self.beam is not None:
            return self.aborted or self.beam.output is not None
        return self.aborted or len(self.done) == len(self.seqs)


class EngineCore:
    def __init__(self, args, policy, runner, tokenizer, eos_token_id: int | None, max_model_len: int,
                 metrics=None, proposer=None):
        from minipaged.kv.swap import SwapSpace
        from minipaged.scheduler import make_scheduler

        self.args, self.policy, self.runner = args, policy, runner
        self.tokenizer, self._eos, self.max_model_len = tokenizer, eos_token_id, max_model_len
        self.metrics = metrics if metrics is not None else engine_metrics()
        swap_blocks = args.swap_tokens // policy.block_size if hasattr(policy, "detach") else 0
        self.swap_space = SwapSpace(swap_blocks, policy.block_size) if swap_blocks else None
        self.stats: dict = {}  # the scheduler's own tallies (ints: preemptions by kind, forks, swaps...)
        options = dict(max_num_seqs=args.max_num_seqs if args.pooled else 1,
                       max_num_batched_tokens=args.batched_tokens, preemption_mode=args.preemption_mode,
                       swap_space=self.swap_space, stats=self.stats,
                       enable_chunked_prefill=args.enable_chunked_prefill, speculative_config=args.spec)
        if proposer is not None:
            options["proposer"] = proposer
        self.scheduler = make_scheduler(args.scheduler, policy, **options)
        self.requests: dict[str, CoreRequest] = {}
        self._request_of: dict[int, CoreRequest] = {}  # seq_id -> its request
        self._generators: dict[int, object] = {}
        self._seq_ids = itertools.count()
        self.num_steps = 0
        m = self.metrics
        self._forward_passes = m.counter("minipaged:forward_passes")
        self._tokens_computed = m.counter("minipaged:tokens_computed")
        self._preemptions = m.counter("minipaged:num_preemptions")
        self._prompt_tokens = m.counter("minipaged:prompt_tokens")
        self._generation_tokens = m.counter("minipaged:generation_tokens")
        self._cache_queries = m.counter("minipaged:prefix_cache_queries")
        self._cache_hits = m.counter("minipaged:prefix_cache_hits")
        self._success = m.counter("minipaged:request_success")
        self._aborted = m.counter("minipaged:num_requests_aborted")
        self._refused = m.counter("minipaged:num_requests_refused")
        self._swapped_out = m.counter("minipaged:blocks_swapped_out")
        self._swapped_in = m.counter("minipaged:blocks_swapped_in")
        self._drafted = m.counter("minipaged:spec_decode_num_draft_tokens")
        self._accepted = m.counter("minipaged:spec_decode_num_accepted_tokens")
        self._running = m.gauge("minipaged:num_requests_running")
        self._waiting = m.gauge("minipaged:num_requests_waiting")
        self._swapped = m.gauge("minipaged:num_requests_swapped")
        self._kv_usage = m.gauge("minipaged:kv_cache_usage_perc")
        self._ttft = m.histogram("minipaged:time_to_first_token_seconds")
        self._itl = m.histogram("minipaged:inter_token_latency_seconds")
        self._e2e = m.histogram("minipaged:e2e_request_latency_seconds")
        self._step_seconds = m.histogram("minipaged:step_seconds")
        self._forward_seconds = m.histogram("minipaged:forward_seconds")
        self._tokens_per_step = m.histogram("minipaged:num_tokens_per_step")

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's end-of-sequence id (read when a request arrives), or the one given."""
        return getattr(self.tokenizer, "eos_token_id", self._eos)

    # ---- requests in and out ------------------------------------------------------------------

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> CoreRequest:
        """Queue a request (its prompt already checked by the front end). Its n samples are built here."""
        if request_id in self.requests:
            raise ValueError(f"request_id={request_id!r} is already in the engine; give each request its own id")
        now = time.perf_counter() if arrival_time is None else arrival_time
        seqs = [Sequence(seq_id=next(self._seq_ids), prompt_ids=list(prompt_ids), params=params, index=i,
                         eos_token_id=self.eos_token_id, max_model_len=self.max_model_len, arrival_time=now)
                for i in range(params.n)]
        request = CoreRequest(request_id, list(prompt_ids), params, seqs, now)
        self.requests[request_id] = request
        for seq in seqs:
            self._request_of[seq.seq_id] = request
            self._generators[seq.seq_id] = self.runner.make_generator(sample_seed(params.seed, seq.index))
        if self.policy.shares_blocks and len(seqs) > 1:  # prefill once, fork the other samples
            self.scheduler.add(seqs[0], seqs[1:])
        else:
            for seq in seqs:
                self.scheduler.add(seq)
        self._update_gauges()
        return request

    def add_beam_request(self, request_id: str, prompt_ids: list[int], params, max_tokens: int | None = None,
                         arrival_time: float | None = None) -> CoreRequest:
        """Queue a beam search (beam_search.py): one sequence, the prompt, from which the beams branch.
        Each step the scheduler plans every live beam like any sequence; instead of sampling, the core
        ranks their candidates, forks the beams that branch and frees the ones pruned (``_advance_beams``).
        ``max_tokens`` overrides params.max_tokens (the simulator gives each request its own)."""
        from minipaged.beam_search import BeamSearchSequence, BeamState

        if request_id in self.requests:
            raise ValueError(f"request_id={request_id!r} is already in the engine; give each request its own id")
        if not self.policy.can_fork:
            raise ValueError(f"beam search needs a KV policy that can fork a sequence (kv_policy 'shared', "
                             f"'prefix_caching' or 'per_request'), not {self.policy.label!r}")
        now = time.perf_counter() if arrival_time is None else arrival_time
        limit = min(params.max_tokens if max_tokens is None else max_tokens, self.max_model_len - len(prompt_ids))
        bookkeeping = SamplingParams(temperature=0, max_tokens=max(limit, 1), ignore_eos=True)
        seq = Sequence(seq_id=next(self._seq_ids), prompt_ids=list(prompt_ids), params=bookkeeping,
                       eos_token_id=None, max_model_len=self.max_model_len, arrival_time=now)
        request = CoreRequest(request_id, list(prompt_ids), bookkeeping, [seq], now)
        request.beam = BeamState(params, list(prompt_ids), limit, [BeamSearchSequence(list(prompt_ids))], [seq])
        self.requests[request_id] = request
        self._request_of[seq.seq_id] = request
        self.scheduler.add(seq, beam_width=params.beam_width)
        self._update_gauges()
        return request

    def abort_request(self, request_ids) -> list[str]:
        """Stop these requests wherever they are (waiting, running, swapped out). Their blocks go back
        at once; an unknown or finished id is ignored. Returns the ids that were aborted."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        done = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.finished:
                continue
            seqs = request.beam.seqs if request.beam is not None else request.seqs
            self.scheduler.abort([s.seq_id for s in seqs if not s.finished])
            now = time.perf_counter()
            for seq in request.seqs:
                if not seq.finished:
                    seq.finish_reason, seq.stop_reason, seq.finished_time = "abort", None, now
            request.aborted, request.finished_time = True, now
            self._aborted.inc()
            done.append(request_id)
        self._update_gauges()
        return done

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def get_num_unfinished_requests(self) -> int:
        return sum(1 for r in self.requests.values() if not r.finished)

    def pop_finished(self, request_id: str) -> CoreRequest:
        """Forget a finished request (the front end has taken its output)."""
        request = self.requests.pop(request_id)
        for seq in request.seqs:
            self._request_of.pop(seq.seq_id, None)
            self._generators.pop(seq.seq_id, None)
        return request

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[str]:
        """Plan, execute, sample. Returns the ids of the requests that changed (new tokens, finished,
        refused), in the order they did."""
        start = time.perf_counter()
        plan = self.scheduler.schedule()
        changed: dict[str, None] = {}
        for seq in plan.refused:
            self._finish_seq(seq, start, changed)
        for group in plan.restarted:
            self._restart_beams(group)
        if plan.preempted:
            self._preemptions.inc(plan.preempted)
        self._swapped_out.inc(len(plan.swap_out))
        self._swapped_in.inc(len(plan.swap_in))
        if not plan.work:  # every running request was preempted, or refused: no forward pass this step
            self.runner.swap_blocks(plan.swap_out, plan.swap_in)  # but what was swapped out must leave now
            if not (plan.refused or plan.preempted) and self.scheduler.has_work():  # a bug, not a full pool
                s = self.scheduler
                head = (s.waiting or s.swapped or s.running)[0]
                raise RuntimeError(f"request {head.group_id} can neither be scheduled nor refused")
            self._update_gauges()
            return list(changed)
        for work in plan.work:
            if work.draft:
                self._drafted.inc(len(work.draft))
        rows = self.runner.execute(plan)
        now = time.perf_counter()
        record = self._step_record(plan) if self.metrics.listening else None  # the pool as the pass saw it
        beams: dict[str, CoreRequest] = {}
        for work, work_rows in zip(plan.work, rows):
            request = self._request_of[work.seq.seq_id]
            if request.beam is not None:  # ranked below, once every beam of the search has its row
                if work.completes:
                    request.beam.rows[work.seq.seq_id] = work_rows[0]
                    beams[request.request_id] = request
            elif work.draft:  # chapter 09: check the guesses, keep what the model agrees with
                self._verify(work, work_rows, now, changed)
            elif work.completes:  # a prompt chunk with more to come (chapter 08) samples nothing yet
                seq = work.seq
                for s in [*self.scheduler.fork_children(seq), seq]:  # forks first: seq may finish now
                    self._emit(s, work_rows[0], now, changed)
        for request in beams.values():
            if request.beam.ready():
                self._advance_beams(request, now, changed)
        self.num_steps += 1
        elapsed = time.perf_counter() - start
        self._forward_passes.inc()
        self._tokens_computed.inc(self.runner.last_num_tokens)  # all it recomputed, without a cache
        self._tokens_per_step.observe(plan.num_tokens)
        self._step_seconds.observe(elapsed)
        self._forward_seconds.observe(self.runner.last_forward_seconds)
        self._update_gauges()
        if record is not None:
            record["step_seconds"] = elapsed
            self.metrics.publish_step(record)
        return list(changed)

    def _emit(self, seq: Sequence, row, now: float, changed: dict) -> None:
        """Sample seq's next token from its row, and account for it."""
        self.runner.append_token(seq, row, self._generators[seq.seq_id])
        self._token_came(seq, now, changed)
        if seq.finished:
            self._finish_seq(seq, now, changed)

    def _token_came(self, seq: Sequence, now: float, changed: dict) -> None:
        request = self._request_of[seq.seq_id]
        if seq.token_times:
            self._itl.observe(now - seq.token_times[-1])
        seq.token_times.append(now)
        if seq.first_token_time is None:
            seq.first_token_time = now
        if request.first_token_time is None:
            self._first_token(request, seq, now)
        self._generation_tokens.inc()
        changed[request.request_id] = None

    def _first_token(self, request: CoreRequest, seq: Sequence, now: float) -> None:
        """The request's first token came: its time to first token, and its prompt counted once (with
        what the prefix cache served of it)."""
        request.first_token_time = now
        self._ttft.observe(now - request.arrival_time)
        self._prompt_tokens.inc(len(request.prompt_ids))
        if self.policy.caches_prefixes:
            self._cache_queries.inc(len(request.prompt_ids))
            self._cache_hits.inc(seq.num_cached_tokens)

    def _finish_seq(self, seq: Sequence, now: float, changed: dict) -> None:
        request = self._request_of[seq.seq_id]
        seq.finished_time = now
        request.done.add(seq.seq_id)
        if request.beam is not None and request.beam.output is None:  # a refused beam search
            from minipaged.beam_search import BeamSearchOutput

            request.beam.output = BeamSearchOutput([], refused=str(seq.stop_reason).removeprefix("refused: "))
            request.beam.seqs = []
        if seq.finish_reason != "abort":  # a refused sequence holds nothing
            self.scheduler.finish(seq)
        changed[request.request_id] = None
        if request.finished and request.finished_time is None:
            request.finished_time = now
            self._e2e.observe(now - request.arrival_time)
            if any(str(s.stop_reason).startswith("refused") for s in request.seqs):
                self._refused.inc()
            else:
                self._success.inc()

    def _advance_beams(self, request: CoreRequest, now: float, changed: dict) -> None:
        """One step of a beam search: rank every live beam's candidates, then make the K/V follow the
        new beams (take over, fork, prune; beam_search.py). Ends the search after max_tokens steps or
        when no live beam is left."""
        from minipaged.beam_search import finish_output, plan_moves, select_beams

        state, p = request.beam, request.beam.params
        rows = [state.rows.pop(s.seq_id) for s in state.seqs]
        candidates = self.runner.beam_candidates(rows, p.beam_width, p.temperature)
        chosen, complete = select_beams(state.beams, candidates, p.beam_width, self.eos_token_id, p.ignore_eos,
                                        p.length_penalty)
        state.complete += complete
        state.steps += 1
        self._generation_tokens.inc(len(chosen) + len(complete))
        if request.first_token_time is None:
            self._first_token(request, state.seqs[0], now)
        changed[request.request_id] = None
        if state.steps >= state.max_tokens or not chosen:  # done: the last tokens need no K/V
            for seq in state.seqs:
                seq.finish_reason = seq.finish_reason or "length"
                self.scheduler.finish(seq)
                self._request_of.pop(seq.seq_id, None)
            state.beams, state.seqs = [beam for _, beam in chosen], []
            state.output = finish_output(state, self.eos_token_id, self.tokenizer)
            request.finished_time = now
            self._e2e.observe(now - request.arrival_time)
            self._success.inc()
            return
        forks, pruned = plan_moves(chosen, len(state.seqs))
        # the first new beam of a parent is the parent itself; a further one forks it (shared blocks)
        seqs = [self._fork_beam(state.seqs[parent], request) if fork else state.seqs[parent]
                for (parent, _), fork in zip(chosen, forks)]
        for parent in pruned:  # nobody continues this beam
            self._request_of.pop(state.seqs[parent].seq_id, None)
            self.scheduler.drop_seq(state.seqs[parent])
        for (_, beam), seq in zip(chosen, seqs):
            seq.append(beam.tokens[-1], None, beam.logprobs[-1])
        state.beams, state.seqs = [beam for _, beam in chosen], seqs

    def _restart_beams(self, group) -> None:
        """A beam search preempted by recompute starts over from its prompt, as one sequence."""
        from minipaged.beam_search import BeamSearchSequence

        request = self._request_of[group.seqs[0].seq_id]
        state, first = request.beam, group.seqs[0]
        for seq in group.seqs:
            self._request_of.pop(seq.seq_id, None)
        seq = Sequence(seq_id=next(self._seq_ids), prompt_ids=list(state.prompt), params=first.params,
                       eos_token_id=None, max_model_len=self.max_model_len, arrival_time=first.arrival_time)
        self._request_of[seq.seq_id] = request
        self.scheduler.restart(group, seq)
        state.beams, state.seqs, state.complete, state.steps = [BeamSearchSequence(list(state.prompt))], [seq], [], 0
        state.rows.clear()

    def _fork_beam(self, parent: Sequence, request: CoreRequest) -> Sequence:
        child = Sequence(seq_id=next(self._seq_ids), prompt_ids=parent.prompt_ids, params=parent.params,
                         eos_token_id=parent.eos_token_id, max_model_len=parent.max_model_len,
                         output_ids=list(parent.output_ids), arrival_time=parent.arrival_time,
                         num_cached_tokens=parent.num_cached_tokens)
        self._request_of[child.seq_id] = request
        self.scheduler.fork_seq(parent, child)
        return child

    def _verify(self, work, rows, now: float, changed: dict) -> None:
        """Emit the model's own tokens row by row while they equal the draft (spec/verify.py), then
        forget the K/V of the guesses that were wrong and commit the right ones."""
        seq, before = work.seq, work.seq.num_tokens

        def emit(j):
            self.runner.append_token(seq, rows[j], self._generators[seq.seq_id])
            self._token_came(seq, now, changed)
            return seq.output_ids[-1], seq.finished

        emitted = verify(work.draft, emit)
        accepted = work.draft[:emitted - 1]  # the guesses that were right; their K/V is valid
        self.policy.truncate(seq.seq_id, before + len(accepted))
        self.policy.commit_tokens(seq.seq_id, accepted)
        self._accepted.inc(len(accepted))
        if seq.finished:
            self._finish_seq(seq, now, changed)

    # ---- metrics --------------------------------------------------------------------------------

    def _update_gauges(self) -> None:
        s = self.scheduler
        self._running.set(len(s.running))
        self._waiting.set(len(s.waiting))
        self._swapped.set(len(s.swapped))
        self._kv_usage.set(self.kv_cache_usage())

    def kv_cache_usage(self) -> float:
        """Fraction of the pool's slots that requests hold (0 when nobody holds a block; blocks that
        only the prefix cache keeps count as free)."""
        if not self.args.pooled:
            return 0.0
        usage = self.policy.usage()
        return usage.occupied / usage.total

    def _step_record(self, plan) -> dict:
        usage = self.policy.usage()
        record = {"step": self.num_steps, "forward_seconds": self.runner.last_forward_seconds,
                  "batch_size": len(plan.work), "num_tokens": plan.num_tokens, "num_decodes": plan.num_decodes,
                  "num_prefill_tokens": plan.num_prefill_tokens, "preempted": plan.preempted,
                  "kv_utilization": usage.utilization, "kv_occupied": usage.occupied / usage.total,
                  "running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                  "swapped": len(self.scheduler.swapped)}
        if self.policy.shares_blocks:
            sharing = self.policy.sharing()
            record["blocks_physical"], record["blocks_logical"] = sharing.physical_blocks, sharing.logical_blocks
        return record

    # ---- whole-engine operations ----------------------------------------------------------------

    def check_invariants(self, idle: bool = False) -> None:
        """Assert that the books agree: each block's reference count equals the tables holding it, no
        block is both free and held (the policy's and the swap space's ``check_invariants``). With
        ``idle=True`` also that nothing is left behind: no request, no sequence, every slot free."""
        self.policy.check_invariants()
        if self.swap_space is not None:
            self.swap_space.check_invariants()
        if not idle:
            return
        assert not self.scheduler.has_work(), "the scheduler still has requests"
        assert not self.policy.seq_ids(), f"KV memory leaked: sequences {self.policy.seq_ids()[:8]} still hold it"
        usage = self.policy.usage()
        assert usage.free == usage.total, f"KV memory leaked: {usage}"
        if self.policy.shares_blocks:
            assert not self.policy.pending_copies(), "copies on write were planned that no step made"
        if self.swap_space is not None:
            assert not self.swap_space.seq_ids(), f"the swap space leaked: {self.swap_space.seq_ids()[:8]}"

    def abort_all(self) -> None:
        """Drop every request still held, and its blocks (device and swap space), so an interrupted
        run leaks nothing. Blocks a prefix cache had promised but that were never written leave the
        cache (kv/prefix_cache.py), so a later request cannot read them."""
        # newest first: a newer request may count an older one's promised prefix blocks as computed
        self.abort_request([r for r, req in reversed(self.requests.items()) if not req.finished])
        self.policy.drain_copies()
        for seq_id in reversed(self.policy.seq_ids()):  # anything a client of the core left behind
            self.policy.free(seq_id)
        if self.swap_space is not None:
            for seq_id in self.swap_space.seq_ids():
                self.swap_space.drop(seq_id)
        self.runner.reset()
