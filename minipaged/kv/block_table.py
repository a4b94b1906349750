"""Chapter 03: a block table per sequence, so any free block can serve any request.

Entry i of a sequence's table is the physical block holding its tokens i*block_size to
(i+1)*block_size - 1, so token position p lives in slot

    block_table[p // block_size] * block_size + p % block_size

and attention reads the cache through the same table. A request takes any free blocks from the
``BlockPool`` (a FIFO free list, with a bitmap that catches double frees): no block is stranded, and
external fragmentation is gone. This stage still reserves the whole request at admission (the rules
of chapters 01-02); chapter 04 (on_demand.py) grows the table as tokens arrive instead, by overriding
``_slots_needed`` / ``_fits_now`` (what admission takes) and ``_grow`` (here: refuse). Chapter 05
passes a reference-counted pool and overrides ``_block_for_write``.

Not handled: sharing blocks between sequences. Swapping (chapter 06) uses ``detach`` /
``attach_swapped``: kv/swap.py moves the blocks' contents, this policy hands over the table.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from minipaged.kv.audit import check_policy, check_pool
from minipaged.kv.base import (
    KVPolicy,
    NoFreeMemory,
    ReservationExceeded,
    SequenceState,
    blocks_for,
    check_positive_int,
)
from minipaged.kv.contiguous import reservation_tokens


class BlockPool:
    counts_references = False  # chapter 05's pool counts the tables holding each block (kv/shared.py)
    caches_blocks = False  # chapter 07's pool finds full blocks by their tokens (kv/prefix_cache.py)

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
        check_pool(self)  # what the pool promises: kv/audit.py


@dataclass
class BlockTable(SequenceState):
    blocks: list[int] = field(default_factory=list)  # logical block i -> physical block blocks[i]


def relocate(tables: dict, pool) -> tuple[dict, dict[int, int]]:
    """Give ``tables`` ({seq_id: table of blocks in another pool}) blocks of ``pool``: one fresh block
    for each distinct block, taken all at once (NoFreeMemory, nothing taken, if too few are free), and
    a block that several tables share stays shared here. Returns ({seq_id: the table with the new
    blocks, all else kept}, {old block: new block}): swapping out (device -> CPU) and back in."""
    from dataclasses import replace

    fresh = iter(pool.take(len({b for t in tables.values() for b in t.blocks})))
    moved: dict[int, int] = {}
    new_tables = {}
    for seq_id, table in tables.items():
        blocks = []
        for block in table.blocks:
            if block in moved:
                pool.share([moved[block]])
            else:
                moved[block] = next(fresh)
            blocks.append(moved[block])
        new_tables[seq_id] = replace(table, blocks=blocks)
    return new_tables, moved


class BlockTablePolicy(KVPolicy):
    name = "block_table"
    can_swap = True  # detach / attach_swapped: chapter 06's swap space moves a table out and back
    pool_class = BlockPool  # what a policy builds when not handed a pool (chapter 05 counts references)

    def __init__(self, num_slots: int, block_size: int = 16, max_model_len: int = 2048,
                 reservation: str | None = "max", pool: BlockPool | None = None):
        super().__init__(num_slots, block_size=block_size, max_model_len=max_model_len)
        if reservation is not None:
            reservation_tokens(reservation, 1, 1, None, max_model_len)  # ValueError for an unknown rule
        self.reservation = reservation
        self.pool = pool if pool is not None else self.pool_class(self.num_blocks)
        if self.pool.num_blocks != self.num_blocks:
            raise ValueError(f"pool has {self.pool.num_blocks} blocks, the policy expects {self.num_blocks}")

    @property
    def label(self) -> str:
        return f"{self.name}({self.reservation})" if self.reservation else self.name

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    # ---- admission: the whole reservation, in any free blocks --------------------------------

    def _slots_needed(self, prompt_len, max_new_tokens, final_len) -> int:
        tokens = reservation_tokens(self.reservation, prompt_len, max_new_tokens, final_len,
                                    self.max_model_len)
        return blocks_for(tokens, self.block_size) * self.block_size

    def _fits_now(self, slots: int) -> bool:
        return slots // self.block_size <= self.pool.num_free

    def _largest_hole(self) -> int:
        return self.pool.num_free * self.block_size  # every free block is usable by anyone

    def _place(self, seq_id, state: SequenceState, slots: int) -> BlockTable:
        blocks = self.pool.take(slots // self.block_size)
        return BlockTable(state.prompt_len, state.max_new_tokens, state.final_len, blocks=blocks)

    def _release(self, table: BlockTable) -> None:
        self.pool.release(table.blocks)
        table.blocks = []

    def _occupied_slots(self, table: BlockTable) -> int:
        return len(table.blocks) * self.block_size

    def num_free_slots(self) -> int:
        return self.pool.num_free * self.block_size

    # ---- tokens ------------------------------------------------------------------------------

    def _blocks_missing(self, table: BlockTable, n: int) -> int:
        return blocks_for(table.num_tokens + n, self.block_size) - len(table.blocks)

    def _grow(self, seq_id, table: BlockTable, num_blocks: int) -> None:
        """The sequence needs ``num_blocks`` more blocks. A reserving policy refuses."""
        raise ReservationExceeded(f"seq {seq_id!r} reserved {len(table.blocks)} blocks and holds "
                                  f"{table.num_tokens} tokens; it would need {num_blocks} more blocks")

    def _can_grow(self, num_blocks: int) -> bool:
        return False

    def _block_for_write(self, seq_id, table: BlockTable, logical_block: int) -> int:
        """The physical block that token writes into logical_block go to (copy-on-write hooks here)."""
        return table.blocks[logical_block]

    def can_append_slots(self, seq_id, n: int = 1) -> bool:
        return self.can_append_all([(seq_id, n)])

    def append_slots(self, seq_id, n: int) -> list[int]:
        table = self._check_append(seq_id, n)
        missing = self._blocks_missing(table, n)
        if missing > 0:
            self._grow(seq_id, table, missing)  # all or nothing: raises before changing anything
        # exercise 03.2: begin
        bs = self.block_size
        slots = [self._block_for_write(seq_id, table, p // bs) * bs + p % bs
                 for p in range(table.num_tokens, table.num_tokens + n)]
        table.num_tokens += n
        return slots
        # exercise 03.2: end

    def block_table(self, seq_id) -> list[int]:
        table = self._state(seq_id)
        return table.blocks[:blocks_for(table.num_tokens, self.block_size)]

    def allocated_blocks(self, seq_id) -> list[int]:
        return list(self._state(seq_id).blocks)

    def blocks_needed(self, appends) -> int:
        """Free blocks that appending ``n`` tokens to each ``(seq_id, n)`` of ``appends``, in order,
        would take (a scheduler checks a whole request at once before it touches anything)."""
        return sum(max(0, self._blocks_missing(self._check_append(seq_id, n), n)) for seq_id, n in appends)

    def can_append_all(self, appends) -> bool:
        needed = self.blocks_needed(appends)
        return needed == 0 or self._can_grow(needed)

    # ---- swapping (chapter 06: kv/swap.py moves the blocks, the policy only lets go of the books) ----

    def detach(self, seq_id) -> BlockTable:
        """Take the sequence out of the books and let go of its blocks (last block first), returning
        its table as it was: the caller copies their K/V out in this step, before anyone writes."""
        table = self._state(seq_id)
        del self._seqs[seq_id]
        self.pool.release(table.blocks[::-1])
        return table

    def attach_swapped(self, tables: dict) -> dict[int, int]:
        """Take swapped-out sequences back: ``tables`` {seq_id: table whose blocks are swap-space
        blocks}. Each distinct swap block gets a fresh device block (one shared by several tables
        stays shared); returns {swap block: device block}. NoFreeMemory, nothing changed, if the pool
        has too few free blocks."""
        new_tables, to_device = relocate(tables, self.pool)
        for seq_id, table in new_tables.items():
            self.attach(seq_id, table)
        return to_device

    def attach(self, seq_id, table: BlockTable) -> None:
        """Put a sequence back whose table holds references the caller took from this pool."""
        if seq_id in self._seqs:
            raise ValueError(f"seq_id={seq_id!r} is already allocated; free it first")
        self._seqs[seq_id] = table

    def check_invariants(self) -> None:
        """Assert that the books agree (kv/audit.py: what each stage promises)."""
        check_policy(self)
