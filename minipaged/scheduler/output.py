"""The scheduler's second half: applying a step's output (``update_from_output``), and its event tallies.

After the runner has executed a plan, the scheduler takes what came back and brings its books up to
date, as vLLM V1's ``Scheduler.update_from_output`` does. For each planned sequence, in plan order:

    1. its tokens' K/V is written now: they are committed to the KV policy (a prefix cache,
       chapter 07, makes the blocks they filled findable). This is the one place that commits;
    2. a prompt chunk with more to come (chapter 08) stops here: it samples nothing yet;
    3. a beam search (chapter 05, beam_search.py) keeps the row; once every live beam has one, the
       search ranks the candidates, and the scheduler makes the K/V follow: forks the beams that
       branch, frees the ones pruned, ends the search;
    4. otherwise the samples waiting to fork from this one (chapter 05) are forked, and each
       sequence draws its next token from the row with its own generator. A draft (chapter 09) is
       checked row by row (spec/verify.py): the guesses the model agrees with are kept and
       committed, the slots of the others are given back (``policy.truncate``);
    5. a sequence that ended frees its blocks at once; its request ends once all its samples have.

It returns a ``StepResult``: which requests changed, in order, and what the core's metrics need
(tokens generated, inter-token gaps, the requests that got their first token or ended).

Events. Every scheduling event is counted here, once, where it happens (``_count``): preemptions
(by recompute or swap), blocks swapped out and in, swap fallbacks, refusals, forks, draft tokens
proposed and accepted. ``stats`` holds the tallies; the ones the metrics registry names
(minipaged:num_preemptions, ...) are counted into its counters by the same call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.scheduler.request import Request, RequestStatus
from minipaged.spec.verify import verify

EVENTS = ("preemptions", "preempted_recompute", "preempted_swap", "swap_fallbacks", "refused", "blocks_swapped_out",
          "blocks_swapped_in", "forks", "spec_seq_steps", "spec_draft_tokens", "spec_accepted_tokens")
EVENT_METRICS = {"preemptions": "minipaged:num_preemptions", "refused": "minipaged:num_requests_refused",
                 "blocks_swapped_out": "minipaged:blocks_swapped_out",
                 "blocks_swapped_in": "minipaged:blocks_swapped_in",
                 "spec_draft_tokens": "minipaged:spec_decode_num_draft_tokens",
                 "spec_accepted_tokens": "minipaged:spec_decode_num_accepted_tokens"}


@dataclass
class StepResult:
    """What one step changed, for the core's outputs and metrics."""

    changed: dict = field(default_factory=dict)  # request_id -> None, in the order they changed
    num_tokens: int = 0  # tokens generated (a beam search counts every candidate it kept)
    gaps: list = field(default_factory=list)  # seconds since each sequence's previous token
    first: list = field(default_factory=list)  # (request, prompt tokens the prefix cache served): first tokens
    finished: list = field(default_factory=list)  # requests that ended (finished or refused)


class OutputMixin:
    """``update_from_output`` and the event tallies of ContinuousScheduler (continuous.py)."""

    def _init_events(self, metrics) -> None:
        from minipaged.metrics import engine_metrics

        self.metrics = metrics if metrics is not None else engine_metrics()
        self.stats = dict.fromkeys(EVENTS, 0)
        self._counters = {event: self.metrics.counter(name) for event, name in EVENT_METRICS.items()}

    def _count(self, event: str, n: int = 1) -> None:
        self.stats[event] = self.stats.get(event, 0) + n
        counter = self._counters.get(event)
        if counter is not None:
            counter.inc(n)

    # ---- the step's output ----------------------------------------------------------------------

    def update_from_output(self, plan, output, now: float) -> StepResult:
        result = StepResult()
        for request in plan.refused:
            result.changed[request.request_id] = None
            if request.finished:
                request.finished_time = now
                result.finished.append(request)
        searches = {}
        for work, rows in zip(plan.work, output.rows):
            request = self._request_of[work.seq.seq_id]
            self._commit(work.seq, work.tokens[:work.num_own])
            if not work.completes:  # chapter 08: a prompt chunk with more to come samples nothing yet
                continue
            if request.beam is not None:  # ranked below, once every beam of the search has its row
                request.beam.rows[work.seq.seq_id] = rows[0]
                searches[id(request)] = request
            else:
                self._sample(request, work, rows, output, now, result)
        for request in searches.values():
            if request.beam.ready():
                self._advance_beams(request, output, now, result)
        return result

    def _commit(self, seq, token_ids) -> None:
        """These tokens' K/V is written: the policy may cache the blocks they filled (chapter 07)."""
        self.policy.commit_tokens(seq.seq_id, token_ids)

    def _sample(self, request: Request, work, rows, output, now: float, result: StepResult) -> None:
        """Forks first (the samples waiting on this prompt draw from its row too), then this
        sequence's token, or its draft's tokens while the model agrees with them (spec/verify.py)."""
        seq, before = work.seq, work.seq.num_tokens
        for child in self._fork_children(request, seq):
            self._emit(request, child, rows[0], output, now, result)
            if child.finished:
                self._finish(request, child, now, result)
        if not work.draft:
            self._emit(request, seq, rows[0], output, now, result)
        else:  # chapter 09: emit while the model agrees, keep the right guesses' K/V, drop the others' slots
            emitted = verify(work.draft, lambda j: self._emit(request, seq, rows[j], output, now, result))
            accepted = work.draft[:emitted - 1]
            self.policy.truncate(seq.seq_id, before + len(accepted))
            self._commit(seq, accepted)
            self._count("spec_accepted_tokens", len(accepted))
        if seq.finished:
            self._finish(request, seq, now, result)

    def _emit(self, request: Request, seq, row, output, now: float, result: StepResult):
        """seq draws its next token from row; returns (the token, whether seq is finished now)."""
        output.sample(seq, row)
        self._token_came(request, seq, now, result)
        return seq.output_ids[-1], seq.finished

    def _token_came(self, request: Request, seq, now: float, result: StepResult) -> None:
        """When seq's new token came: the gap since its last one, and the request's first token."""
        if seq.token_times:
            result.gaps.append(now - seq.token_times[-1])
        seq.token_times.append(now)
        if seq.first_token_time is None:
            seq.first_token_time = now
        self._tokens_came(request, seq.num_cached_tokens, 1, now, result)

    def _tokens_came(self, request: Request, cached: int, n: int, now: float, result: StepResult) -> None:
        root = request.root
        if root.first_token_time is None:  # its first token: the prompt is counted once, with its hit
            root.first_token_time = now
            result.first.append((root, cached))
        result.num_tokens += n
        result.changed[root.request_id] = None

    def _fork_children(self, request: Request, seq) -> list:
        """The samples waiting to fork from seq, forked now that its prompt is cached (chapter 05)."""
        if not request.children or request.seqs[0] is not seq:
            return []
        children, request.children = request.children, []
        for child in children:
            self.policy.fork(seq.seq_id, child.seq_id)
            request.seqs.append(child)
        self._count("forks", len(children))
        return children

    def _finish(self, request: Request, seq, now: float, result: StepResult) -> None:
        """seq is done: its blocks go back, and its request leaves once all its samples are done."""
        self.policy.free(seq.seq_id)
        del self._request_of[seq.seq_id]
        request.seqs.remove(seq)
        seq.finished_time = now
        request.root.done.add(seq.seq_id)
        result.changed[request.root.request_id] = None
        if not request.seqs and not request.children:
            self.running.remove(request)
            self._leave(request, RequestStatus.FINISHED, now, result)

    def _leave(self, request: Request, status: RequestStatus, now: float | None = None, result=None) -> None:
        """The request (or a part split off it) has left the queues. The request the client sees
        ends once every one of its samples has."""
        self._on_done(request)
        root = request.root
        if request is not root:
            request.status = status
        if status is RequestStatus.REFUSED and root.refusal_reason is None:
            root.refusal_reason = request.refusal_reason
        if len(root.done) == len(root.samples) and not root.status.is_over:
            root.status = RequestStatus.REFUSED if root.refusal_reason is not None else status
            if now is not None:
                root.finished_time = now
                result.finished.append(root)

    # ---- beam search (chapter 05) ---------------------------------------------------------------

    def _advance_beams(self, request: Request, output, now: float, result: StepResult) -> None:
        """One step of a beam search: rank every live beam's candidates (beam_search.py), then make
        the K/V follow the new beams: the first child of a parent takes its blocks over, a further
        one forks them, a parent nobody continues is freed. Ends the search after max_tokens steps
        or when no live beam is left."""
        from minipaged.beam_search import finish_output, plan_moves, select_beams

        state, p = request.beam, request.beam.params
        rows = [state.rows.pop(s.seq_id) for s in state.seqs]
        chosen, complete = select_beams(state.beams, output.candidates(rows, p.beam_width, p.temperature),
                                        p.beam_width, state.eos_token_id, p.ignore_eos, p.length_penalty)
        state.complete += complete
        state.steps += 1
        self._tokens_came(request, state.seqs[0].num_cached_tokens, len(chosen) + len(complete), now, result)
        if state.steps >= state.max_tokens or not chosen:  # done: the last tokens need no K/V
            for seq in request.seqs:
                seq.finish_reason = seq.finish_reason or "length"
                self.policy.free(seq.seq_id)
                del self._request_of[seq.seq_id]
            request.seqs, state.seqs, state.beams = [], [], [beam for _, beam in chosen]
            state.output = finish_output(state, state.eos_token_id)
            self.running.remove(request)
            self._leave(request, RequestStatus.FINISHED, now, result)
            return
        forks, pruned = plan_moves(chosen, len(state.seqs))
        seqs = [self._fork_beam(request, state.seqs[parent]) if fork else state.seqs[parent]
                for (parent, _), fork in zip(chosen, forks)]
        for parent in pruned:  # nobody continues this beam: its blocks go back (shared ones lose a holder)
            seq = state.seqs[parent]
            self.policy.free(seq.seq_id)
            del self._request_of[seq.seq_id]
            request.seqs.remove(seq)
        for (_, beam), seq in zip(chosen, seqs):
            seq.append(beam.tokens[-1], None, beam.logprobs[-1])
        state.beams, state.seqs = [beam for _, beam in chosen], seqs

    def _fork_beam(self, request: Request, parent):
        """A beam branches: a new sequence that starts with parent's blocks (shared, nothing copied)."""
        child = parent.fork(self.next_seq_id())
        self.policy.fork(parent.seq_id, child.seq_id)
        request.seqs.append(child)
        self._request_of[child.seq_id] = request
        self._count("forks")
        return child
