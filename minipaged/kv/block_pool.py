"""The pool of physical KV blocks: a free list and nothing else.

Blocks are handed out from the front of a FIFO queue and returned to its back, so after a while a
sequence's blocks are scattered over the pool, which is fine once a block table maps them (chapter 03).
A bitmap beside the queue answers "is block b free?" in O(1) and catches double frees.

This pool knows nothing about sequences. Chapter 05 subclasses it to count references (a block
shared by several sequences returns to the free list only when the last one lets go); the policies
reach the pool only through ``take``, ``release`` and ``num_free``, so that change stays local.

Not handled: reference counts, caching freed blocks by content (later chapters).
"""

from __future__ import annotations

from collections import deque

from minipaged.kv.base import NoFreeMemory, check_positive_int


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self._free_queue: deque[int] = deque(range(num_blocks))
        self._is_free = [True] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free_queue)

    def is_free(self, block: int) -> bool:
        return self._is_free[block]

    def free_blocks(self) -> list[int]:
        return list(self._free_queue)

    def take(self, n: int) -> list[int]:
        """Take n free blocks, all or nothing (NoFreeMemory, and the pool unchanged, if too few)."""
        # exercise 03.1: begin
        if n > len(self._free_queue):
            raise NoFreeMemory(f"{n} blocks wanted, {len(self._free_queue)} free")
        blocks = [self._free_queue.popleft() for _ in range(n)]
        for block in blocks:
            self._is_free[block] = False
        return blocks
        # exercise 03.1: end

    def release(self, blocks: list[int]) -> None:
        """Return blocks to the back of the free list."""
        # exercise 03.1: begin
        for block in blocks:
            if self._is_free[block]:
                raise RuntimeError(f"block {block} is released twice")
            self._is_free[block] = True
            self._free_queue.append(block)
        # exercise 03.1: end

    def check_invariants(self) -> None:
        queued = list(self._free_queue)
        assert len(set(queued)) == len(queued), "a block is on the free list twice"
        assert all(0 <= b < self.num_blocks for b in queued), "the free list holds an out-of-range block"
        flagged = [b for b in range(self.num_blocks) if self._is_free[b]]
        assert sorted(queued) == flagged, "the free bitmap disagrees with the free list"
