"""The books of the block-table policies, read from outside: what each stage promises, what sharing
saved, and snapshots for pictures. Nothing here changes the books, and no request's path runs it.

    policy.check_invariants()   check_policy: the promises below (pool.check_invariants(): check_pool)
    policy.sharing()            sharing: blocks in use against what unshared tables would hold (ch05)
    policy.snapshot()           snapshot: tables, counts, fills, pending copies as plain data (ch05, ch07)

The tests check the invariants after every operation, and the server once it has shut down
(``check_engine(core, idle=True)``). Each stage's promises add to the last, read from the stage flags
a policy declares (kv/base.py):

    chapter 03  the free list and the free bitmap agree; every table covers its tokens with blocks
                in range that are not free; a block belongs to one table; owned + free = all
    chapter 04  a table holds no block past what its tokens (or its prompt) need
    chapter 05  count 0 exactly when free; a block's count = the tables holding it (a table never
                holds one twice); every holder of a shared block sees the same tokens in it; a
                pending copy's destination has one holder; the waste accounting adds up
    chapter 07  an evictable block has no holder and is cached; the cache's two maps agree; no
                block on the plain free list is cached; a block a table registered is cached under
                that table's key, if at all

A failed check is an ``AssertionError`` saying what disagrees: a bug in the engine (or in an
exercise), never bad input. Not here: the reserving policies of chapters 00-02 check their own books
(contiguous.py, fixed_blocks.py, per_request.py), and the swap space its own (swap.py).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from minipaged.kv.base import blocks_for


@dataclass(frozen=True)
class Sharing:
    """Blocks in use with sharing, and what the same sequences would hold without it."""

    physical_blocks: int  # distinct blocks held by some table
    logical_blocks: int  # sum of table lengths: the blocks an unshared policy would need
    shared_blocks: int  # blocks held by more than one table

    @property
    def saved_blocks(self) -> int:
        return self.logical_blocks - self.physical_blocks

    @property
    def saved_fraction(self) -> float:
        return self.saved_blocks / self.logical_blocks if self.logical_blocks else 0.0


def sharing(policy) -> Sharing:
    holders = Counter(b for table in policy._seqs.values() for b in table.blocks)
    return Sharing(physical_blocks=len(holders), logical_blocks=sum(holders.values()),
                   shared_blocks=sum(count > 1 for count in holders.values()))


def snapshot(policy) -> dict:
    """Plain data for pictures and notebooks: each sequence's table and token count, each held
    block's reference count and fill, the copies not made yet; with a prefix cache (chapter 07) the
    cached blocks and the evictable ones, oldest first."""
    bs, seqs, fill = policy.block_size, policy._seqs, {}
    for table in seqs.values():
        for i, block in enumerate(table.blocks):
            fill[block] = max(fill.get(block, 0), min(max(table.num_tokens - i * bs, 0), bs))
    snap = {"block_size": bs, "num_blocks": policy.num_blocks,
            "tables": {seq_id: list(t.blocks) for seq_id, t in seqs.items()},
            "tokens": {seq_id: t.num_tokens for seq_id, t in seqs.items()},
            "refs": {b: policy.pool.ref_count(b) for b in sorted(fill)}, "fill": dict(sorted(fill.items())),
            "copies": policy.pending_copies()}
    if policy.caches_prefixes:
        snap["cached"] = sorted(policy.pool._key_of)
        snap["evictable"] = list(policy.pool._evictable)
    return snap


def check_pool(pool) -> None:
    queued = list(pool._free_queue)  # chapter 03: a FIFO free list and a bitmap
    assert len(set(queued)) == len(queued), "a block is on the free list twice"
    assert all(0 <= b < pool.num_blocks for b in queued), "the free list holds an out-of-range block"
    flagged = [b for b in range(pool.num_blocks) if pool._is_free[b]]
    assert sorted(queued) == flagged, "the free bitmap disagrees with the free list"
    if not pool.counts_references:
        return
    refs = pool._refs  # chapter 05
    wrong = [b for b in range(pool.num_blocks) if (refs[b] == 0) != pool.is_free(b)]
    assert not wrong, f"blocks {wrong[:8]}: reference count 0 must mean free, and only then"
    if not pool.caches_blocks:
        return
    assert all(refs[b] == 0 for b in pool._evictable), "an evictable block has holders"  # chapter 07
    assert all(b in pool._key_of for b in pool._evictable), "an evictable block is not cached"
    assert all(pool._block_of[k] == b for b, k in pool._key_of.items()), "the cache's two maps disagree"
    assert len(pool._block_of) == len(pool._key_of), "the cache's two maps disagree"
    assert not set(pool._free_queue) & set(pool._key_of), "a block on the plain free list is still cached"


def check_policy(policy) -> None:
    pool, bs = policy.pool, policy.block_size
    check_pool(pool)
    holders: Counter = Counter()
    for seq_id, table in policy._seqs.items():
        assert len(table.blocks) * bs >= table.num_tokens, (
            f"seq {seq_id!r}: {len(table.blocks)} blocks cannot cover {table.num_tokens} tokens")
        for block in table.blocks:
            assert 0 <= block < policy.num_blocks, f"seq {seq_id!r} maps out-of-range block {block}"
            assert not pool.is_free(block), f"block {block} is in seq {seq_id!r}'s table and free"
        if policy.reservation is None:  # chapter 04: blocks come as tokens do
            needed = max(blocks_for(table.num_tokens, bs), blocks_for(table.prompt_len, bs))
            assert len(table.blocks) <= needed, (
                f"seq {seq_id!r} holds {len(table.blocks)} blocks but needs only {needed} so far")
        if policy.shares_blocks:
            assert len(set(table.blocks)) == len(table.blocks), f"seq {seq_id!r} holds a block twice"
        holders.update(table.blocks)
    if policy.shares_blocks:  # chapter 05: a block may sit in several tables, and its count says how many
        wrong = [(b, n, pool.ref_count(b)) for b, n in holders.items() if pool.ref_count(b) != n]
        assert not wrong, f"(block, tables holding it, reference count) disagree: {wrong[:8]}"
    else:
        shared = [b for b, count in holders.items() if count > 1]
        assert not shared, f"blocks {shared[:8]} appear in more than one block table"
    assert len(holders) + pool.num_free == policy.num_blocks, (
        f"owned {len(holders)} + free {pool.num_free} != total {policy.num_blocks} blocks")
    if policy.shares_blocks:
        _check_sharing(policy)
    if policy.caches_prefixes:
        _check_prefix_tables(policy)


def _check_sharing(policy) -> None:
    """Chapter 05: nobody wrote a shared block in place, and the books add up."""
    pool, bs, fills = policy.pool, policy.block_size, {}
    for seq_id, table in policy._seqs.items():
        for i, block in enumerate(table.blocks):
            if pool.ref_count(block) > 1:
                fill = min(max(table.num_tokens - i * bs, 0), bs)
                first = fills.setdefault(block, (seq_id, fill))
                assert first[1] == fill, (f"shared block {block} holds {first[1]} tokens for seq "
                                          f"{first[0]!r} but {fill} for seq {seq_id!r}")
    for src, dst in policy.pending_copies():
        assert pool.ref_count(dst) == 1, f"pending copy {src} -> {dst}: destination must have one holder"
    usage = policy.usage()
    assert usage.tokens + usage.reserved + usage.internal == (policy.num_blocks - pool.num_free) * bs, (
        f"usage does not add up to the blocks in use: {usage}")


def _check_prefix_tables(policy) -> None:
    """Chapter 07: what each table committed and registered agrees with the cache."""
    for seq_id, table in policy._seqs.items():
        assert hasattr(table, "keys"), f"seq {seq_id!r} has a plain table"
        assert len(table.token_ids) <= table.num_tokens, f"seq {seq_id!r} committed more tokens than it has"
        assert table.registered <= len(table.keys), f"seq {seq_id!r} offered blocks it has no key for"
        for i in range(table.registered):  # a block the cache names holds what this table put there
            key = policy.pool.key_of(table.blocks[i])
            assert key is None or key == table.keys[i], f"seq {seq_id!r}: block {i} is cached under another key"


def check_engine(core, idle: bool = False) -> None:
    """The core's books: its policy's and its swap space's. With ``idle=True`` also that nothing is
    left behind: no request, no sequence, every slot free, no copy planned and never made."""
    policy, swap = core.policy, core.swap_space
    policy.check_invariants()
    if swap is not None:
        swap.check_invariants()
    if not idle:
        return
    assert not core.scheduler.has_work(), "the scheduler still has requests"
    assert not policy.seq_ids(), f"KV memory leaked: sequences {policy.seq_ids()[:8]} still hold it"
    usage = policy.usage()
    assert usage.free == usage.total, f"KV memory leaked: {usage}"
    if policy.shares_blocks:
        assert not policy.pending_copies(), "copies on write were planned that no step made"
    if swap is not None:
        assert not swap.seq_ids(), f"the swap space leaked: {swap.seq_ids()[:8]}"
