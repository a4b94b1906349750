"""A request's state, in one home: the ``Request`` the scheduler owns, and the ``Sequence`` of each sample.

    WAITING  -> RUNNING  -> FINISHED                 served
    WAITING  -> REFUSED                              could never fit the pool (refusal_reason says why)
    RUNNING  -> WAITING                              preempted by recompute (prefilled again later)
    RUNNING  -> SWAPPED  -> RUNNING                  preempted by swap (chapter 06)
    any live -> ABORTED                              the client gave up

Only the scheduler (scheduler/continuous.py) changes them; the core and the front end read them for
outputs and metrics; the runner reads a sequence to sample its next token. A preemption by recompute
that splits a request's samples makes each sample after the first a part of its own in the queues
(``split``), whose ``parent`` is the request the client sees.

``Sequence.append(token)`` adds a token and decides, in vLLM's order, whether the sample ends:
max_tokens ("length"), EOS or a stop token id ("stop"), a stop string in the text ("stop", the text
cut before it, or after it with include_stop_str_in_output). The text is decoded incrementally
(detokenizer.py); ``stream_text()`` is what a streaming client may already be shown.

Not handled: priorities, several prompts per request.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from minipaged.detokenizer import IncrementalDetokenizer
from minipaged.outputs import CompletionOutput
from minipaged.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    ABORTED = "aborted"
    REFUSED = "refused"

    @property
    def is_over(self) -> bool:
        return self in (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.REFUSED)


@dataclass(eq=False)  # two sequences are the same only if they are one object
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_token_id: int | None
    max_model_len: int
    index: int = 0  # which of the request's n samples
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    cumulative_logprob: float = 0.0
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    arrival_time: float | None = None  # when it arrived, got its first token and finished (the engine's clock)
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served at its first prefill (chapter 07)
    token_times: list[float] = field(default_factory=list)  # when each output token came
    generator: object = field(default=None, repr=False)  # the random generator this sample draws from
    tokenizer: object = field(default=None, repr=False)  # decodes the text; None: tokens only (simulators)
    _detok: IncrementalDetokenizer | None = field(default=None, repr=False)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def max_new_tokens(self) -> int:
        room = self.max_model_len - len(self.prompt_ids)
        return room if self.params.max_tokens is None else min(self.params.max_tokens, room)

    def append(self, token: int, logprob: float | None = None, top: dict | None = None) -> None:
        self.output_ids.append(token)
        if logprob is not None:
            self.cumulative_logprob += logprob
        if top is not None:
            self.logprobs.append(top)
        p = self.params
        past_min = len(self.output_ids) > p.min_tokens
        if past_min and not p.ignore_eos and token == self.eos_token_id:
            self.finish_reason, self.stop_reason = "stop", None
        elif past_min and token in p.stop_token_ids:
            self.finish_reason, self.stop_reason = "stop", token
        if self.tokenizer is not None:
            if self._detok is None:
                self._detok = IncrementalDetokenizer(self.tokenizer, p.skip_special_tokens, p.stop_strings,
                                                     p.include_stop_str_in_output)
            stop = self._detok.add(token, check_stop=past_min and self.finish_reason is None)
            self.text = self._detok.text
            if stop is not None:
                self.finish_reason, self.stop_reason = "stop", stop
        if self.finish_reason is None and len(self.output_ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None and self._detok is not None:
            self._detok.finish()

    def stream_text(self) -> str:
        """The part of the text that may be shown while the sequence is still going: never a final
        half-decoded character, nor the last characters a stop string could still take back. Once
        finished, the whole text."""
        if self.finished or self._detok is None:
            return self.text
        return self._detok.stream_text

    def to_output(self) -> CompletionOutput:
        return CompletionOutput(self.index, self.text, list(self.output_ids), self.cumulative_logprob,
                                self.logprobs if self.params.logprobs is not None else None, self.finish_reason,
                                self.stop_reason)


@dataclass(eq=False)  # two requests are the same only if they are one object
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    samples: list[Sequence]  # every sample the client gets back, in order (a beam search: its first beam)
    arrival_time: float = 0.0
    seqs: list[Sequence] = field(default_factory=list)  # the live sequences the scheduler runs
    children: list[Sequence] = field(default_factory=list)  # samples to fork from seqs[0] after its prefill
    beam: object = None  # a beam search's BeamState (beam_search.py): its beams are ``seqs``
    status: RequestStatus = RequestStatus.WAITING
    refusal_reason: str | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    extra: dict = field(default_factory=dict)  # what a front end keeps with it (its prompt text)
    parent: Request | None = None  # for a part split off by a preemption: the request it came from
    done: set = field(default_factory=set)  # ids of the samples that have ended (counted, not scanned)
    uid: int = 0  # the scheduler's number for it (a part gets its own)

    @classmethod
    def of(cls, seq: Sequence, children=(), request_id: str | None = None) -> Request:
        """A request of one sequence and the samples to fork from it (for driving a scheduler by hand)."""
        return cls(request_id or f"r{seq.seq_id}", seq.prompt_ids, seq.params, [seq, *children],
                   seq.arrival_time or 0.0, seqs=[seq], children=list(children))

    @property
    def root(self) -> Request:
        """The request the client sees (itself, unless this is a part split off it)."""
        return self.parent if self.parent is not None else self

    @property
    def beam_width(self) -> int:
        return self.beam.params.beam_width if self.beam is not None else 0

    @property
    def num_seqs(self) -> int:
        """Sequences the request runs, or will run: a beam search counts its full width."""
        return max(len(self.seqs) + len(self.children), self.beam_width)

    @property
    def finished(self) -> bool:
        return self.status.is_over

    def split(self, seq: Sequence, uid: int) -> Request:
        """A part of this request that runs ``seq`` alone (preemption by recompute splits samples)."""
        self.seqs.remove(seq)
        return Request(self.request_id, self.prompt_ids, self.params, self.samples, self.arrival_time, seqs=[seq],
                       parent=self.root, uid=uid)
