"""Chapter 09: the scheduler side of speculative decoding. Each decoding sequence may bring a draft.

A decode step computes one token per sequence and, on a machine bound by reading the weights,
costs about what a step of a few more tokens would. So after chapter 06's scheduler has planned the
step, this one goes back over the sequences that are decoding and, for each, asks the proposer
(spec/ngram.py) for up to ``num_speculative_tokens`` guesses of what comes next. The guesses get
slots right after the sequence's own token, so the forward pass computes them in the same step,
each attending to the tokens before it, exactly as if they had been generated already. The engine
checks them as it samples (sampling.py's step_outputs, spec/verify.py), the scheduler keeps the
right ones when it applies the step's output and gives back the slots of the wrong ones (``policy.truncate``).

Drafts take memory last, after every decode and admission of the step has its slots, so a guess
never makes anyone wait or be preempted in the step it is planned in (an accepted guess keeps its
block, as a token decoded early would). Where the pool has no room, the draft is shortened or
dropped; with the prefix cache, a draft may take a cached block nobody holds, as any new token
does. A step's drafts also stay within ``max_num_batched_tokens`` when one is set. Who gets a draft:

    a sequence that is decoding (one uncached token), alone in its request (samples that share
    blocks would need their drafts checked together), with room left under its max_tokens for more
    than one token. Greedy or sampled: spec/verify.py checks both.

Not handled: chunked prefill in the same engine, adapting the draft length to how often guesses are
right.
"""

from __future__ import annotations

from minipaged.scheduler.continuous import ContinuousScheduler
from minipaged.spec.ngram import propose_ngram
from minipaged.step import ScheduledSeq, StepPlan


class SpeculativeScheduler(ContinuousScheduler):
    name = "speculative"

    def __init__(self, policy, *, speculative_config, proposer=None, **options):
        super().__init__(policy, **options)
        self.spec = speculative_config
        # proposer(seq, k) -> up to k guesses; prompt lookup unless a test brings its own
        self.proposer = proposer or (lambda seq, k: propose_ngram(seq.all_ids, k, speculative_config.prompt_lookup_max,
                                                                   speculative_config.prompt_lookup_min))

    def _plan_step(self, plan: StepPlan) -> None:
        super()._plan_step(plan)
        for work in plan.work:
            draft = self._draft(work)
            if self.max_num_batched_tokens is not None:  # the guesses count against the step's budget
                draft = draft[:max(0, self.max_num_batched_tokens - plan.num_tokens)]
            if draft:
                work.slots += self.policy.append_slots(work.seq.seq_id, len(draft))
                work.draft = draft
                self._count("spec_seq_steps")
                self._count("spec_draft_tokens", len(draft))

    def _draft(self, work: ScheduledSeq) -> list[int]:
        seq, request = work.seq, work.request
        if work.is_prefill or request.num_seqs != 1 or request.beam is not None:  # beams are ranked, not verified
            return []
        room = seq.max_new_tokens - len(seq.output_ids) - 1  # tokens it may emit after this step's own
        k = min(self.spec.num_speculative_tokens, room)
        if k <= 0:
            return []
        draft = list(self.proposer(seq, k))[:k]
        while draft and not self.policy.can_append_slots(seq.seq_id, len(draft)):
            draft = draft[:-1]  # what memory is left after everyone else's slots
        return draft
