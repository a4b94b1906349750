"""One engine step as plain data: the scheduler's plan, the runner's output, the result the core counts.

    plan = scheduler.schedule()                   StepPlan: who runs, where their K/V goes, what to copy
    output = runner.execute(plan)                 RunnerOutput: the tokens sampled, nothing else changed
    result = scheduler.update_from_output(plan, output, now)
                                                  StepResult: which requests changed, for outputs and metrics

The runner does a ``StepPlan`` in order: the swap copies (``swap_out`` then ``swap_in``), the copies on
write (``copies``), one forward pass over ``work`` (each ``ScheduledSeq``'s tokens without K/V, its
draft, their slots), then sampling for each sequence whose tokens are all computed (``completes``):
its next token, or a draft's kept guesses and one more (spec/verify.py), the first tokens of the
samples forked from it (``forks``), or a beam's candidates. It returns one ``SeqOutput`` per
scheduled sequence, in plan order. ``refused`` are the requests the plan drops because they can
never fit.

Not handled: a tree of drafts per sequence, an output that arrives a step late (vLLM V1 can overlap
scheduling with the forward pass).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.request import Request, Sequence


@dataclass
class ScheduledSeq:
    request: Request  # the request (or the part of one) that runs it
    seq: Sequence
    cached: int  # tokens whose K/V is in the cache already
    slots: list[int]  # where the K/V of the step's tokens goes (``tokens``: its own, then the draft)
    draft: list[int] = field(default_factory=list)  # guessed next tokens to verify (chapter 09)
    forks: list[Sequence] = field(default_factory=list)  # samples forked from it once its prompt is in (ch. 05)

    @property
    def num_new(self) -> int:
        """Tokens the step computes for this sequence, draft tokens included."""
        return len(self.slots)

    @property
    def num_own(self) -> int:
        """The sequence's own uncached tokens the step computes (not the guesses)."""
        return len(self.slots) - len(self.draft)

    @property
    def tokens(self) -> list[int]:
        return self.seq.all_ids[self.cached:self.cached + self.num_own] + self.draft

    @property
    def completes(self) -> bool:
        """Whether this step computes the sequence's last uncached token, so it samples a token
        (false for a prompt chunk that is not the last, chapter 08)."""
        return self.cached + self.num_own == self.seq.num_tokens

    @property
    def is_prefill(self) -> bool:
        """Prompt work (or a recomputed sequence's): more than one token, no output yet, or a chunk."""
        return self.num_own > 1 or not self.seq.output_ids or not self.completes

    @property
    def beam_width(self) -> int:
        """A beam of a beam search (chapter 05) is ranked, not sampled: its candidates are wanted."""
        return self.request.beam_width


@dataclass
class StepPlan:
    work: list[ScheduledSeq] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, CPU block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (CPU block, device block)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copies on write, made after the swaps
    refused: list[Request] = field(default_factory=list)  # requests that could never fit: dropped this step
    preempted: int = 0  # requests preempted while planning this step

    @property
    def num_tokens(self) -> int:
        return sum(w.num_new for w in self.work)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(w.num_new for w in self.work if w.is_prefill)

    @property
    def num_decodes(self) -> int:
        return sum(1 for w in self.work if not w.is_prefill)


@dataclass
class Sampled:
    """One sampled token, with its log-probability and, when the request asked for logprobs, the
    most likely tokens of its row (``SamplingParams.logprobs``)."""

    token_id: int
    logprob: float | None = None
    top_logprobs: dict[int, float] | None = None


@dataclass
class SeqOutput:
    """What the runner computed for one scheduled sequence."""

    sampled: list[Sampled] = field(default_factory=list)  # its new tokens: none for a chunk with more to
    #                                                       come, one, or a draft's accepted guesses + one
    forks: list[Sampled] = field(default_factory=list)  # the first token of each of ScheduledSeq.forks
    candidates: list[tuple[int, float]] | None = None  # a beam's 2 * beam_width best (token, logprob)


@dataclass
class RunnerOutput:
    seqs: list[SeqOutput]  # one per ScheduledSeq, in plan order
    num_tokens_computed: int = 0  # token positions the forward pass computed (more than planned without a cache)
    forward_seconds: float = 0.0


@dataclass
class StepResult:
    """What one step changed, for the core's outputs and metrics."""

    changed: dict = field(default_factory=dict)  # request_id -> None, in the order they changed
    num_tokens: int = 0  # tokens generated (a beam search counts every candidate it kept)
    gaps: list = field(default_factory=list)  # seconds since each sequence's previous token
    first: list = field(default_factory=list)  # (request, prompt tokens the prefix cache served): first tokens
    finished: list = field(default_factory=list)  # requests that ended (finished or refused)
