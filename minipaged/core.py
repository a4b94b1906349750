"""The engine core: one loop that calls the scheduler, the runner, then the scheduler again.

    core = EngineCore(args, policy, runner, tokenizer, eos_token_id, max_model_len)
    core.add_request("r1", prompt_ids, SamplingParams(max_tokens=8))
    while core.has_unfinished_requests():
        changed = core.step()          # ids of the requests that got tokens, finished or were refused
    core.abort_request(["r2"])         # its blocks are back in the pool before the next step

Each step, as vLLM V1's, passes plain data (step.py):

    plan = scheduler.schedule()                         StepPlan: who runs, their slots, block copies
    output = runner.execute(plan)                       RunnerOutput: the tokens sampled
    result = scheduler.update_from_output(plan, output) StepResult: tokens appended, stops, blocks freed

The scheduler owns every request and is the only caller of the KV policy's mutating methods; the
runner only reads the block tables. Admission, chunks (chapter 08), drafts (chapter 09), beams
(chapter 05) and preemption all happen in the scheduler: the step has no branch for any of them.
The core builds requests, with one seeded generator per sample (``sample_seed(seed, i)``, so the
outputs are the same whether the samples share blocks or not), and counts the metrics (metrics.py)
from each step's result. With a policy that shares blocks (chapter 05) the first sample is
prefilled and the others are forked from it once its prompt is cached.

Not handled yet: priorities, several engine cores, overlapping a step's scheduling with the last
step's forward pass.
"""
from __future__ import annotations

import time

from minipaged.beam_search import beam_request
from minipaged.kv.audit import check_engine
from minipaged.metrics import engine_metrics
from minipaged.metrics_reader import step_record
from minipaged.request import Request, RequestStatus, Sequence
from minipaged.sampling import sample_seed
from minipaged.sampling_params import SamplingParams
from minipaged.scheduler import make_scheduler


class EngineCore:
    def __init__(self, args, policy, runner, tokenizer, eos_token_id: int | None, max_model_len: int,
                 metrics=None, proposer=None):
        """``args``: a validated EngineArgs, whole. ``proposer``: a test's own drafts (chapter 09)."""
        from minipaged.kv.swap import SwapSpace, swap_blocks_for

        swap_blocks = swap_blocks_for(args, policy)  # the runner's swap tensors have as many (llm_engine.py)
        self.swap_space = SwapSpace(swap_blocks, policy.block_size) if swap_blocks else None
        self.args, self.policy, self.runner = args, policy, runner
        self.clock = time.perf_counter  # what "now" is; chapter 11's simulator sets a virtual clock
        self.tokenizer, self._eos, self.max_model_len = tokenizer, eos_token_id, max_model_len
        self.metrics = metrics if metrics is not None else engine_metrics()
        options = {"proposer": proposer} if proposer is not None else {}
        self.scheduler = make_scheduler(args.scheduler, policy, max_num_seqs=args.running_limit,
                                        max_num_batched_tokens=args.batched_tokens,
                                        preemption_mode=args.preemption_mode, swap_space=self.swap_space,
                                        enable_chunked_prefill=args.enable_chunked_prefill,
                                        speculative_config=args.spec, metrics=self.metrics, **options)
        self.stats = self.scheduler.stats  # its event tallies: preemptions by kind, swaps, refusals, forks, drafts
        self.requests: dict[str, Request] = {}
        self.num_steps = 0
        m = self.metrics
        self._forward_passes = m.counter("minipaged:forward_passes")
        self._tokens_computed = m.counter("minipaged:tokens_computed")
        self._prompt_tokens = m.counter("minipaged:prompt_tokens")
        self._generation_tokens = m.counter("minipaged:generation_tokens")
        self._cache_queries = m.counter("minipaged:prefix_cache_queries")
        self._cache_hits = m.counter("minipaged:prefix_cache_hits")
        self._success = m.counter("minipaged:request_success")
        self._aborted = m.counter("minipaged:num_requests_aborted")
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
        """The tokenizer's end-of-sequence id, read when a request arrives (a test may change it), or
        the one given when there is no tokenizer (the simulators)."""
        return self.tokenizer.eos_token_id if self.tokenizer is not None else self._eos

    # ---- requests in and out ------------------------------------------------------------------

    def _new_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                     arrival_time: float | None) -> tuple[Request, float]:
        if request_id in self.requests:
            raise ValueError(f"request_id={request_id!r} is already in the engine; give each request its own id")
        now = self.clock() if arrival_time is None else arrival_time
        return Request(request_id, list(prompt_ids), params, [], now), now

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> Request:
        """Queue a request (its prompt already checked by the front end). Its n samples are built here."""
        request, now = self._new_request(request_id, prompt_ids, params, arrival_time)
        request.samples = [Sequence(seq_id=self.scheduler.next_seq_id(), prompt_ids=list(prompt_ids), params=params,
                                    index=i, eos_token_id=self.eos_token_id, max_model_len=self.max_model_len,
                                    arrival_time=now, generator=self.runner.make_generator(sample_seed(params.seed, i)),
                                    tokenizer=self.tokenizer)
                           for i in range(params.n)]
        if self.policy.shares_blocks:  # prefill once, fork the other samples from it
            request.seqs, request.children = request.samples[:1], request.samples[1:]
        else:
            request.seqs = list(request.samples)
        return self._queue(request)

    def add_beam_request(self, request_id: str, prompt_ids: list[int], params, max_tokens: int | None = None,
                         arrival_time: float | None = None) -> Request:
        """Queue a beam search: one sequence, the prompt, from which the beams branch (beam_search.py)."""
        request, _ = self._new_request(request_id, prompt_ids, params, arrival_time)
        return self._queue(beam_request(request, params, self.policy, self.scheduler.next_seq_id(),
                                        self.max_model_len, self.eos_token_id, max_tokens))

    def _queue(self, request: Request) -> Request:
        self.requests[request.request_id] = request
        self.scheduler.add(request)
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
            self.scheduler.abort(request, self.clock())
            self._aborted.inc()
            done.append(request_id)
        self._update_gauges()
        return done

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    def get_num_unfinished_requests(self) -> int:
        return sum(1 for r in self.requests.values() if not r.finished)

    def pop_finished(self, request_id: str) -> Request:
        """Forget a finished request (the front end has taken its output)."""
        return self.requests.pop(request_id)

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[str]:
        """Plan, execute, apply. Returns the ids of the requests that changed (new tokens, finished,
        refused), in the order they did."""
        start = self.clock()
        plan = self.scheduler.schedule()
        output = self.runner.execute(plan)
        steps = self.metrics.steps  # records of the steps, while someone listens (metrics_reader.py)
        record = step_record(self, plan, output) if steps.subscribers and plan.work else None
        result = self.scheduler.update_from_output(plan, output, self.clock())
        self._observe(result)
        elapsed = self.clock() - start
        if plan.work:
            self.num_steps += 1
            self._forward_passes.inc()
            self._tokens_computed.inc(output.num_tokens_computed)  # all it recomputed, without a cache
            self._tokens_per_step.observe(plan.num_tokens)
            self._step_seconds.observe(elapsed)
            self._forward_seconds.observe(output.forward_seconds)
        self._update_gauges()
        if record is not None:
            record["step_seconds"] = elapsed
            steps.publish(record)
        return list(result.changed)

    # ---- metrics --------------------------------------------------------------------------------

    def _observe(self, result) -> None:
        """Count what the step's result says: tokens, gaps between them, first tokens (with their
        prompt, and what the prefix cache served of it), requests that ended."""
        self._generation_tokens.inc(result.num_tokens)
        for gap in result.gaps:
            self._itl.observe(gap)
        for request, cached in result.first:
            self._ttft.observe(request.first_token_time - request.arrival_time)
            self._prompt_tokens.inc(len(request.prompt_ids))
            if self.policy.caches_prefixes:
                self._cache_queries.inc(len(request.prompt_ids))
                self._cache_hits.inc(cached)
        for request in result.finished:
            self._e2e.observe(request.finished_time - request.arrival_time)
            if request.status is RequestStatus.FINISHED:
                self._success.inc()
    def _update_gauges(self) -> None:
        s = self.scheduler
        self._running.set(len(s.running))
        self._waiting.set(len(s.waiting))
        self._swapped.set(len(s.swapped))
        self._kv_usage.set(self.kv_cache_usage())

    def kv_cache_usage(self) -> float:
        """Fraction of the pool's slots that requests hold (0 when nobody holds a block; blocks that
        only the prefix cache keeps count as free)."""
        if not self.policy.bounded:  # chapter 00: no pool at all
            return 0.0
        usage = self.policy.usage()
        return usage.occupied / usage.total

    # ---- whole-engine operations ----------------------------------------------------------------

    def check_invariants(self, idle: bool = False) -> None:
        """Assert that the books agree; with ``idle=True``, that nothing is held (kv/audit.py)."""
        check_engine(self, idle)

    def abort_all(self) -> None:
        """Drop every request still held, and its blocks (device and swap space), so an interrupted
        run leaks nothing. Blocks a prefix cache had promised but that were never written leave the
        cache (kv/prefix_cache.py), so a later request cannot read them."""
        # newest first: a newer request may count an older one's promised prefix blocks as computed
        self.abort_request([r for r, req in reversed(self.requests.items()) if not req.finished])
        self.scheduler.release_all()  # anything a client of the scheduler left behind
        self.runner.reset()
