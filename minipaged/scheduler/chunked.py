"""Chapter 08: chunked prefill. A long prompt is computed a chunk per step, beside the decodes.

Without chunks, admitting a 1,000-token prompt makes one step compute 1,000 tokens, and every request
that is decoding waits for that step to end: its next token comes late. An operating system meets
the same trade-off between a long batch job and interactive programs, and answers it with a time
slice: the long job runs for a slice, then the others get the processor, and it resumes where it
stopped. Here the slice is a token budget per step, ``max_num_batched_tokens``:

    1. decodes first: every running sequence that needs one token gets it. The budget is at least
       ``max_num_seqs``, so they fit; a lone request with more samples than that (admitted because
       nothing else ran) still gets all its decodes, over budget. Preemption works as in chapter 06;
    2. then the prompts being prefilled, oldest first, each as many of its next uncached tokens as
       the budget has left: a chunk. A chunk that is not the last samples nothing;
    3. then swapped-out requests and new ones, as in chapter 06, while the budget has room. A new
       prompt takes what is left of the budget, and its next chunk comes in the next step.

So no step computes more than the budget (but for the decodes of a lone request with more samples
than that), and a decoding request's next token never waits for more than one budget's worth of
prompt. The price: a long prompt's first token may come a few steps later, and each extra step pays
the fixed cost of reading the weights once more.

At most one prompt is part-way through its prefill at a time: a new prompt is admitted only with
budget left over after the running prompt's chunk, which means that prompt has just finished.

The K/V of a chunk is written like any other tokens' (its queries attend to everything cached before
them plus themselves, causally), so the math is the same as one big prefill. The prompt's blocks are
all allocated at admission, as before; only their slots are handed out chunk by chunk. With a prefix
cache (chapter 07) a block is promised when the chunk that fills it has its slots, no earlier.

Not handled: several prompts part-way at once, sharing the budget (vLLM's
``max_num_partial_prefills``), and static batching (chapter 06's baseline stays as it was).
"""

from __future__ import annotations

from minipaged.config import DEFAULT_CHUNKED_BUDGET, EngineArgs
from minipaged.request import Request
from minipaged.scheduler.continuous import ContinuousScheduler
from minipaged.step import StepPlan


class ChunkedPrefillScheduler(ContinuousScheduler):
    name = "chunked"

    def __init__(self, policy, *, max_num_seqs: int = EngineArgs.max_num_seqs,
                 max_num_batched_tokens: int | None = None, **options):
        budget = DEFAULT_CHUNKED_BUDGET if max_num_batched_tokens is None else max_num_batched_tokens
        assert budget >= max_num_seqs, "EngineArgs.validate() checks that the budget holds every decode"
        super().__init__(policy, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, **options)

    def _budget_left(self, plan: StepPlan) -> int:
        return self.max_num_batched_tokens - plan.num_tokens

    def _chunks(self, request: Request, budget: int) -> list[tuple[int, int]]:
        """(seq_id, tokens to compute now) for the request's sequences that get any: all the uncached
        tokens they have, while ``budget`` lasts."""
        # exercise 08.1: begin
        chunks = []
        for seq in request.seqs:
            take = min(seq.num_tokens - self.policy.num_tokens(seq.seq_id), budget)
            if take > 0:
                chunks.append((seq.seq_id, take))
                budget -= take
        return chunks
        # exercise 08.1: end

    def _plan(self, request: Request, plan: StepPlan) -> None:
        """Slots for the request's next chunk (the caller has checked that it fits)."""
        self._schedule_chunks(request, self._chunks(request, self._budget_left(plan)), plan)

    def _schedule_chunks(self, request: Request, chunks: list[tuple[int, int]], plan: StepPlan) -> None:
        seqs = {s.seq_id: s for s in request.seqs}
        for seq_id, n in chunks:
            self._schedule_seq(request, seqs[seq_id], n, plan)

    def _prefill_budget(self, plan: StepPlan) -> int:
        """What a prompt part-way through its prefill may take in this step: all the budget has left
        (chapter 08's question 4 leaves half of it to the next prompt in the queue)."""
        return self._budget_left(plan)

    def _decoding(self, request: Request) -> bool:
        return all(s.num_tokens - self.policy.num_tokens(s.seq_id) == 1 for s in request.seqs)

    def _schedule_running(self, plan: StepPlan) -> None:
        # exercise 08.2: begin
        self._chunk_waits = False  # a chunk waiting for memory holds back swap-ins and admissions
        # 1. decodes, oldest first; when the pool is dry the newest request goes, as in chapter 06. The
        # newest sits at or after i, so it has not been planned yet.
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if not self._decoding(request):
                i += 1
            elif self.policy.can_append_all(self._appends(request)):
                super()._plan(request, plan)  # one token each, whatever the budget says
                i += 1
            else:
                self._preempt(self.running.pop(), plan)
        # 2. prompts part-way through their prefill, oldest first, with what the budget has left
        i = 0
        while i < len(self.running) and self._budget_left(plan) > 0:
            request = self.running[i]
            chunks = self._chunks(request, self._prefill_budget(plan))
            if not chunks:  # planned in pass 1
                i += 1
            elif self.policy.can_append_all(chunks):
                self._schedule_chunks(request, chunks, plan)
                i += 1
            elif plan.work:
                self._chunk_waits = True  # for memory that the running sequences give back
                return
            else:  # nothing else runs (so nothing is planned): make room as chapter 06 does
                self._preempt(self.running.pop(), plan)
        # exercise 08.2: end

    def _swap_in(self, plan: StepPlan) -> None:
        if self._budget_left(plan) > 0 and not self._chunk_waits:
            super()._swap_in(plan)

    def _over_budget(self, request: Request, plan: StepPlan) -> bool:
        # any room at all: the prompt starts with a chunk of that size
        return self._budget_left(plan) <= 0 or self._chunk_waits
