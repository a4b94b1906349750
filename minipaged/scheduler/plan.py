"""The plan of one engine step (``StepPlan``): what the scheduler decided, for the runner to execute.

A ``StepPlan`` is everything the runner must do in one step, in order:

    1. the block copies for swapping: device -> CPU (``swap_out``), then CPU -> device (``swap_in``);
    2. the copies on write the step's slots asked for (``copies``, chapter 05: (src, dst) blocks; with
       chapter 00's private tensors, (parent, child) sequences whose K/V a fork duplicates);
    3. one forward pass over ``work``: for each scheduled sequence, the next tokens of it that have
       no K/V yet (``seq.all_ids[cached:cached + num_own]``: all of them, unless chapter 08's
       scheduler cut a prompt into chunks), then its ``draft`` if chapter 09 guessed one, and the
       slots their K/V goes to.

The runner returns the logits rows; the scheduler applies them (``update_from_output``): it samples
one token for each sequence whose tokens are now all computed (``completes``), checks a draft's
guesses, or ranks a beam search's candidates. ``refused`` are the requests dropped this step because
they could never fit (scheduler/request.py says why, in ``refusal_reason``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.sequence import Sequence


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
    copies: list[tuple[int, int]] = field(default_factory=list)  # copies on write, made after the swaps
    refused: list = field(default_factory=list)  # Requests that could never fit: dropped this step
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
