"""What a scheduler works with: requests (``Group``) and the plan of one engine step (``StepPlan``).

A ``Group`` is one request's sequences. They are admitted, preempted, swapped and finished as a unit,
because under copy-on-write (chapter 05) they share blocks: swapping out one sample of four would
copy the shared prompt blocks anyway, and recomputing one would have to prefill the prompt again.
The parallel samples that are to be forked from the first sequence once its prompt is cached wait
in ``children``. A beam search's group (``beam_width`` > 0) gains and loses sequences as its beams
branch and are pruned (``fork_seq``, ``drop_seq`` in continuous.py), and is never split.

A ``StepPlan`` is everything the engine must do in one step, in order:

    1. the block copies for swapping: device -> CPU (``swap_out``), then CPU -> device (``swap_in``);
    2. one forward pass over ``work``: for each scheduled sequence, the next tokens of it that have
       no K/V yet (``seq.all_ids[cached:cached + num_own]``: all of them, unless chapter 08's
       scheduler cut a prompt into chunks), then its ``draft`` if chapter 09 guessed one, and the
       slots their K/V goes to;
    3. sampling one token for each sequence whose tokens are now all computed (``completes``), or,
       with a draft, checking the guesses and keeping the ones the model agrees with.

``refused`` are the requests that were dropped this step because they could never fit;
``restarted`` the beam searches preempted by recompute, which start over from their prompt (their
beams, prefilled again one by one, could need more memory than the search that shared them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.sequence import Sequence


@dataclass
class Group:
    group_id: int
    seqs: list[Sequence]  # the live sequences (unfinished, and forked if they were children)
    children: list[Sequence] = field(default_factory=list)  # samples to fork from seqs[0] after its prefill
    beam_width: int = 0  # a beam search (beam_search.py): its beams grow to this many, and stay together

    @property
    def num_seqs(self) -> int:
        """Sequences the group runs, or will run: a beam search counts its full width."""
        return max(len(self.seqs) + len(self.children), self.beam_width)

    @property
    def done(self) -> bool:
        return not self.seqs and not self.children


@dataclass
class ScheduledSeq:
    seq: Sequence
    cached: int  # tokens whose K/V is in the cache already
    slots: list[int]  # where the K/V of the step's tokens goes (``tokens``: its own, then the draft)
    draft: list[int] = field(default_factory=list)  # guessed next tokens to verify (chapter 09)

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


@dataclass
class StepPlan:
    work: list[ScheduledSeq] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, CPU block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (CPU block, device block)
    refused: list[Sequence] = field(default_factory=list)
    preempted: int = 0  # requests preempted while planning this step
    restarted: list[Group] = field(default_factory=list)  # beam searches preempted by recompute: start over

    @property
    def num_tokens(self) -> int:
        return sum(w.num_new for w in self.work)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(w.num_new for w in self.work if w.is_prefill)

    @property
    def num_decodes(self) -> int:
        return sum(1 for w in self.work if not w.is_prefill)
