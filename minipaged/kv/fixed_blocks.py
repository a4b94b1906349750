"""Chapter 02: memory cut into fixed-size blocks, but each request still takes one contiguous run.

The pool is cut into ``num_blocks`` blocks of ``block_size`` token slots. Bookkeeping is now per
block: a free list records which blocks nobody owns. A request reserves its whole reservation
(same rules as chapter 01) rounded up to whole blocks, and because its tokens must still sit at
consecutive addresses it needs a *run* of consecutive free blocks, taken first-fit.

What blocks change: sizes come in block units, so the bookkeeping is smaller (one entry per block,
not per slot) and the rounding adds internal fragmentation of less than one block per request.
What they do not change: the reservation, and external fragmentation. Free blocks scattered between
runs cannot serve a request that needs a longer run. Chapter 03 removes that with a block table.

The free list is kept sorted, so a run of consecutive free blocks shows up as consecutive entries.

Not handled: compaction, growing a run in place.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from minipaged.kv.base import (
    KVPolicy,
    ReservationExceeded,
    SequenceState,
    blocks_for,
)
from minipaged.kv.contiguous import reservation_tokens


@dataclass
class BlockRun(SequenceState):
    first_block: int = 0
    num_blocks: int = 0


class FixedBlockPolicy(KVPolicy):
    name = "fixed_blocks"

    def __init__(self, num_slots: int, block_size: int = 16, max_model_len: int = 2048,
                 reservation: str = "max"):
        super().__init__(num_slots, block_size=block_size, max_model_len=max_model_len)
        reservation_tokens(reservation, 1, 1, None, max_model_len)  # ValueError for an unknown rule
        self.reservation = reservation
        self._free: list[int] = list(range(self.num_blocks))  # free block ids, sorted
        self._runs_cache: list[tuple[int, int]] | None = None  # free runs, recomputed after a change

    @property
    def label(self) -> str:
        return f"{self.name}({self.reservation})"

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    # ---- sizes and placement -----------------------------------------------------------------

    def _slots_needed(self, prompt_len, max_new_tokens, final_len) -> int:
        tokens = reservation_tokens(self.reservation, prompt_len, max_new_tokens, final_len,
                                    self.max_model_len)
        return blocks_for(tokens, self.block_size) * self.block_size

    def free_runs(self) -> list[tuple[int, int]]:
        """Runs of consecutive free blocks as (first_block, length), in address order."""
        # exercise 02.1: begin
        if self._runs_cache is None:
            runs: list[tuple[int, int]] = []
            for block in self._free:
                if runs and runs[-1][0] + runs[-1][1] == block:
                    runs[-1] = (runs[-1][0], runs[-1][1] + 1)
                else:
                    runs.append((block, 1))
            self._runs_cache = runs
        return self._runs_cache
        # exercise 02.1: end

    def _first_fit(self, num_blocks: int) -> int | None:
        for first, length in self.free_runs():
            if length >= num_blocks:
                return first
        return None

    def _largest_hole(self) -> int:
        return max((length for _, length in self.free_runs()), default=0) * self.block_size

    def _fits_now(self, slots: int) -> bool:
        return self._first_fit(slots // self.block_size) is not None

    def _place(self, seq_id, state: SequenceState, slots: int) -> BlockRun:
        # exercise 02.2: begin
        count = slots // self.block_size
        first = self._first_fit(count)
        i = bisect_left(self._free, first)
        del self._free[i:i + count]  # the run is consecutive in the sorted free list too
        self._runs_cache = None
        return BlockRun(state.prompt_len, state.max_new_tokens, state.final_len,
                        first_block=first, num_blocks=count)
        # exercise 02.2: end

    def _release(self, run: BlockRun) -> None:
        # exercise 02.2: begin
        i = bisect_left(self._free, run.first_block)
        self._free[i:i] = range(run.first_block, run.first_block + run.num_blocks)
        self._runs_cache = None
        # exercise 02.2: end

    def _occupied_slots(self, run: BlockRun) -> int:
        return run.num_blocks * self.block_size

    def num_free_slots(self) -> int:
        return len(self._free) * self.block_size

    # ---- tokens ------------------------------------------------------------------------------

    def can_append_slots(self, seq_id, n: int = 1) -> bool:
        run = self._check_append(seq_id, n)
        return run.num_tokens + n <= run.num_blocks * self.block_size

    def append_slots(self, seq_id, n: int) -> list[int]:
        run = self._check_append(seq_id, n)
        capacity = run.num_blocks * self.block_size
        if run.num_tokens + n > capacity:
            raise ReservationExceeded(f"seq {seq_id!r} has {run.num_tokens} tokens in {run.num_blocks} "
                                      f"blocks ({capacity} slots); {n} more do not fit")
        bs = self.block_size
        positions = range(run.num_tokens, run.num_tokens + n)
        run.num_tokens += n
        return [(run.first_block + p // bs) * bs + p % bs for p in positions]

    def block_table(self, seq_id) -> list[int]:
        run = self._state(seq_id)
        return list(range(run.first_block, run.first_block + blocks_for(run.num_tokens, self.block_size)))

    def allocated_blocks(self, seq_id) -> range:
        run = self._state(seq_id)
        return range(run.first_block, run.first_block + run.num_blocks)

    def check_invariants(self) -> None:
        self._runs_cache = None
        assert self._free == sorted(set(self._free)), "free list is not sorted or holds a block twice"
        assert all(0 <= b < self.num_blocks for b in self._free), "free list holds an out-of-range block"
        owner: dict[int, object] = {}
        for seq_id, run in self._seqs.items():
            assert 0 <= run.num_tokens <= run.num_blocks * self.block_size, (
                f"seq {seq_id!r} holds {run.num_tokens} tokens in {run.num_blocks} blocks")
            for block in range(run.first_block, run.first_block + run.num_blocks):
                assert 0 <= block < self.num_blocks, f"seq {seq_id!r} owns out-of-range block {block}"
                assert block not in owner, f"block {block} is owned by {owner[block]!r} and {seq_id!r}"
                owner[block] = seq_id
        both = set(owner) & set(self._free)
        assert not both, f"blocks {sorted(both)[:8]} are both free and owned"
        assert len(owner) + len(self._free) == self.num_blocks, (
            f"owned {len(owner)} + free {len(self._free)} != total {self.num_blocks} blocks")
