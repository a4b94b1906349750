"""A ``Request``: one request as the scheduler owns it, from arrival to its end, in one object.

It holds the request's samples (``Sequence``s: the tokens, the text, when each token came), the ones
being run now (``seqs``), the samples still to be forked from the first once its prompt is cached
(``children``, chapter 05), a beam search's state (``beam``, beam_search.py), where it stands
(``status``) and, if it was refused, why (``refusal_reason``). The scheduler (continuous.py) is the
only one that changes it; the engine core and the front end read it to build outputs and metrics.

    WAITING  -> RUNNING  -> FINISHED                 served
    WAITING  -> REFUSED                              could never fit the pool (refusal_reason says why)
    RUNNING  -> WAITING                              preempted by recompute (prefilled again later)
    RUNNING  -> SWAPPED  -> RUNNING                  preempted by swap (chapter 06)
    any live -> ABORTED                              the client gave up

The samples of a request run side by side because they share blocks (chapter 05). A preemption by
recompute that splits them makes each sample after the first a request of its own in the queues
(``split``): a part, whose ``parent`` is the request the client sees. A part's samples are the
parent's; the parent's status says how the whole request ended.

Not handled: priorities, several prompts per request.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from minipaged.sampling_params import SamplingParams
from minipaged.sequence import Sequence


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
