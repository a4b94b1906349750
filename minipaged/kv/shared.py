"""Chapter 05: reference-counted blocks, fork and copy-on-write (the KV policy named "shared").

As fork() gives a child process the parent's pages, read-only until one of them writes, here a
sequence's fork gets its parent's blocks:

    fork(parent, child)     the child's table copies the parent's: the same blocks, each count + 1
    append_slots(seq, n)    a block held by more than one table is not written in place: the sequence
                            takes a fresh block, records the copy (old -> new), and writes there
    free(seq)               each block's count - 1; a block returns to the free list at zero

Only a partly filled last block is ever written, so a fork costs nothing up front and at most one
block copy per branch later. The policy keeps the books: the scheduler puts ``drain_copies()`` in
each step's plan, and the runner copies the blocks before any new K/V is written. Its invariants
(kv/audit.py): a block's count equals the tables holding it, and no shared block is written.
``usage()`` counts a shared block once; ``sharing()`` says how many blocks sharing saved (kv/audit.py).

Everything else is chapter 04's on-demand allocation. Not handled: sharing between unrelated
requests (chapter 07's prefix cache).
"""
from __future__ import annotations

from collections import Counter

from minipaged.kv.audit import Sharing, sharing, snapshot
from minipaged.kv.base import NoFreeMemory, Usage, check_positive_int
from minipaged.kv.block_table import BlockPool, BlockTable
from minipaged.kv.on_demand import OnDemandPolicy


class RefCountedBlockPool(BlockPool):
    """A block pool whose blocks carry reference counts: ``take`` hands a block out with count 1,
    ``share`` adds holders, ``release`` removes one holder and frees the block when none is left."""

    counts_references = True

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self._refs = [0] * num_blocks

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def take(self, n: int) -> list[int]:
        blocks = super().take(n)
        for block in blocks:
            self._refs[block] = 1
        return blocks

    def share(self, blocks: list[int]) -> None:
        """One more holder for each block (a fork)."""
        for block in blocks:
            if self._refs[block] == 0:
                raise RuntimeError(f"block {block} is free and cannot be shared")
        for block in blocks:
            self._refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        """One holder fewer for each block; those nobody holds any more go back to the free list."""
        # exercise 05.1: begin
        for block in blocks:
            if self._refs[block] == 0:
                raise RuntimeError(f"block {block} is released twice")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                super().release([block])
        # exercise 05.1: end

class SharedPolicy(OnDemandPolicy):
    name = "shared"
    can_fork = True  # fork(parent, child): beams and samples share blocks
    pool_class = RefCountedBlockPool
    shares_blocks = True

    def __init__(self, num_slots: int, block_size: int = 16, max_model_len: int = 2048,
                 watermark: float = 0.01, pool: RefCountedBlockPool | None = None):
        if pool is not None and not isinstance(pool, self.pool_class):
            raise ValueError(f"pool must be a {self.pool_class.__name__} for {self.name!r}, got {type(pool).__name__}")
        super().__init__(num_slots, block_size=block_size, max_model_len=max_model_len,
                         watermark=watermark, pool=pool)
        self._copies: list[tuple[int, int]] = []  # (src, dst) block copies the engine has not made yet
        self.stats = {"cow_copies": 0}  # (forks are counted by whoever forks: the scheduler)

    def ref_count(self, block: int) -> int:
        return self.pool.ref_count(block)

    # ---- fork -------------------------------------------------------------------------------

    def fork(self, parent_id, child_id, *, max_new_tokens: int | None = None, final_len: int | None = None) -> None:
        """The child starts as the parent: same tokens, same physical blocks (each count + 1).

        max_new_tokens / final_len describe the child's own future (the simulator knows how long
        each sample runs); by default they are the parent's. Takes no free block, so never fails
        for lack of memory.
        """
        parent = self._state(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"seq_id={child_id!r} is already allocated; free it first")
        if max_new_tokens is not None:
            check_positive_int("max_new_tokens", max_new_tokens)
        if final_len is not None:
            check_positive_int("final_len", final_len)
            if final_len > self.max_model_len:
                raise ValueError(f"final_len={final_len} exceeds max_model_len={self.max_model_len}")
        # exercise 05.2: begin
        self.pool.share(parent.blocks)
        self._seqs[child_id] = BlockTable(
            parent.prompt_len,
            parent.max_new_tokens if max_new_tokens is None else max_new_tokens,
            parent.final_len if final_len is None else final_len,
            num_tokens=parent.num_tokens,
            blocks=list(parent.blocks),
        )
        # exercise 05.2: end

    # ---- copy-on-write ----------------------------------------------------------------------

    def blocks_needed(self, appends) -> int:
        """Growth plus copies on write for appending ``n`` tokens to each ``(seq_id, n)``, in order.

        A block held by r tables and written by w of them this time costs min(w, r - 1) copies: each
        writer copies while someone else still holds the block, and the last holder writes in place.
        """
        growth, writers = super().blocks_needed(appends), Counter()
        for seq_id, n in appends:
            table = self._state(seq_id)
            if n:
                first = table.num_tokens // self.block_size
                last = min((table.num_tokens + n - 1) // self.block_size, len(table.blocks) - 1)
                writers.update(table.blocks[first:last + 1])
        return growth + sum(min(w, self.pool.ref_count(b) - 1) for b, w in writers.items())

    def append_slots(self, seq_id, n: int) -> list[int]:
        growth = max(0, self._blocks_missing(self._check_append(seq_id, n), n))
        copies = self.blocks_needed([(seq_id, n)]) - growth  # each shared block the tokens land in
        if growth + copies > self.pool.num_free:  # all or nothing: refuse before changing anything
            raise NoFreeMemory(f"seq {seq_id!r} needs {growth} new block(s) and {copies} copy-on-write "
                               f"block(s) for its next {n} token(s); {self.pool.num_free} free")
        return super().append_slots(seq_id, n)  # growth, then _block_for_write per token

    def _block_for_write(self, seq_id, table: BlockTable, logical_block: int) -> int:
        # exercise 05.3: begin
        block = table.blocks[logical_block]
        if self.pool.ref_count(block) > 1:  # shared: copy it first, then write into the copy
            (fresh,) = self.pool.take(1)
            self._copies.append((block, fresh))
            self.pool.release([block])  # the others keep the old block; our reference moves
            table.blocks[logical_block] = block = fresh
            self.stats["cow_copies"] += 1
        assert self.pool.ref_count(block) == 1, f"seq {seq_id!r} would write into shared block {block}"
        return block
        # exercise 05.3: end

    def drain_copies(self) -> list[tuple[int, int]]:
        copies, self._copies = self._copies, []
        return copies

    def pending_copies(self) -> list[tuple[int, int]]:
        return list(self._copies)

    def free(self, seq_id) -> None:
        super().free(seq_id)  # chapter 03's: each block loses a holder
        self._drop_dead_copies()

    def _drop_dead_copies(self) -> None:
        """A planned copy into a block that is free again would be wasted work (a sequence forked,
        wrote once and was freed in the same step): forget it."""
        self._copies = [(src, dst) for src, dst in self._copies if not self.pool.is_free(dst)]

    def snapshot(self) -> dict:
        """The books as plain data, for pictures and notebooks (kv/audit.py)."""
        return snapshot(self)

    def sharing(self) -> Sharing:
        """Blocks in use against what the same tables would hold unshared (kv/audit.py)."""
        return sharing(self)

    def usage(self, head=None) -> Usage:
        """Like every policy's usage, but a shared block counts once. Its empty tail counts as
        internal fragmentation: nobody will write into it in place (they would copy it first)."""
        bs = self.block_size
        tokens = reserved = internal = 0
        shared_fill: dict[int, int] = {}
        for table in self._seqs.values():
            will_fill = max(table.final_len, table.num_tokens)
            for i, block in enumerate(table.blocks):
                fill = min(max(table.num_tokens - i * bs, 0), bs)
                if self.pool.ref_count(block) > 1:
                    shared_fill[block] = max(shared_fill.get(block, 0), fill)
                    continue
                coming = min(max(will_fill - i * bs, 0), bs) - fill
                tokens += fill
                reserved += coming
                internal += bs - fill - coming
        tokens += sum(shared_fill.values())
        internal += sum(bs - fill for fill in shared_fill.values())
        free = self.pool.num_free * bs  # external is zero: any free block serves anyone
        return Usage(self.num_slots, tokens, reserved, internal, 0, free, len(self._seqs))
