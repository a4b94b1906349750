"""Chapter 06's baseline: static batching, as a server without iteration-level scheduling does it.

A batch is formed from the head of the queue (first come first served, while the KV policy has
room and up to ``max_num_seqs``), and then nothing new joins until **every** request of the batch
has finished. A request that needs 10 tokens finishes early, but its place in the batch stays empty
while its neighbour generates 400: the batch shrinks as it runs, and the GPU does less and less
useful work per step. That is what padded batches in HF Transformers' ``generate`` do too (there the
finished rows even keep computing padding).

Everything else is the continuous scheduler's: the same admission checks, the same preemption (a
preempted member of the batch comes back before the batch can end). Only the admission gate differs.

Not handled: padding (finished sequences here simply stop computing and free their blocks).
"""

from __future__ import annotations

from minipaged.request import Request
from minipaged.scheduler.continuous import ContinuousScheduler


class StaticScheduler(ContinuousScheduler):
    name = "static"

    def __init__(self, policy, **options):
        super().__init__(policy, **options)
        self._batch: set[int] = set()  # request ids of the batch in flight; empty: a new one may form
        self._forming = False

    def schedule(self):
        self._forming = not self._batch  # a new batch forms only when the last one is over
        if self._forming:
            self._count("batches", 1 if self.waiting else 0)
        return super().schedule()

    def _may_admit(self, request: Request) -> bool:
        if self._forming:
            self._batch.add(request.uid)
            return True
        return request.uid in self._batch  # a preempted member of the batch in flight

    def _admit(self, plan) -> None:
        super()._admit(plan)
        if self._forming:  # the head that was tried but not admitted is not in the batch
            live = {g.uid for g in self.running}
            self._batch &= live
            self._forming = False

    def _on_split(self, request: Request, part: Request) -> None:
        if request.uid in self._batch:
            self._batch.add(part.uid)

    def _on_done(self, request: Request) -> None:
        self._batch.discard(request.uid)
