"""Chapter 05 bookkeeping: reference counts, fork, copy-on-write, free (plain Python, no model)."""

import pytest

from minipaged.kv import ALL_POLICIES, POLICIES, NoFreeMemory, RefCountedBlockPool, SharedPolicy, make_policy


def shared(num_blocks=8, block_size=4, max_model_len=32, **kw):
    return SharedPolicy(num_blocks * block_size, block_size=block_size, max_model_len=max_model_len,
                        watermark=0, **kw)


def test_pool_counts_references_and_frees_at_zero():
    pool = RefCountedBlockPool(4)
    (a, b) = pool.take(2)
    pool.share([a])
    pool.share([a])
    assert pool.ref_count(a) == 3 and pool.ref_count(b) == 1 and pool.num_free == 2
    pool.release([a, b])
    assert pool.ref_count(a) == 2 and pool.is_free(b) and pool.num_free == 3
    pool.release([a])
    pool.release([a])
    assert pool.is_free(a) and pool.num_free == 4
    pool.check_invariants()
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release([a])
    with pytest.raises(RuntimeError, match="free"):
        pool.share([a])


def test_fork_shares_every_block_and_copies_nothing():
    p = shared()
    p.allocate("parent", 6, 10)
    p.append_slots("parent", 6)  # blocks: one full, one holding 2 of 4
    p.fork("parent", "child")
    assert p.block_table("child") == p.block_table("parent")
    assert [p.ref_count(b) for b in p.block_table("parent")] == [2, 2]
    assert p.num_tokens("child") == 6 and p.num_free_blocks == 6 and p.drain_copies() == []
    assert p.sharing().physical_blocks == 2 and p.sharing().logical_blocks == 4
    p.check_invariants()


def test_write_into_a_shared_partly_filled_block_copies_it_first():
    p = shared()
    p.allocate("a", 6, 10)
    p.append_slots("a", 6)
    p.fork("a", "b")
    full, partial = p.block_table("a")
    (slot,) = p.append_slots("b", 1)
    (src, dst), = p.drain_copies()
    assert src == partial and dst not in (full, partial)
    assert slot == dst * 4 + 2  # token 6 lands at offset 2 of the copy, not in the shared block
    assert p.block_table("b") == [full, dst] and p.block_table("a") == [full, partial]
    assert (p.ref_count(full), p.ref_count(partial), p.ref_count(dst)) == (2, 1, 1)
    (slot_a,) = p.append_slots("a", 1)  # a is now alone in its block: it writes in place
    assert slot_a == partial * 4 + 2 and p.drain_copies() == []
    assert p.stats == {"cow_copies": 1}
    p.check_invariants()


def test_a_full_shared_block_is_never_copied():
    p = shared()
    p.allocate("a", 8, 8)
    p.append_slots("a", 8)  # two full blocks
    p.fork("a", "b")
    p.append_slots("b", 1)
    assert p.drain_copies() == [] and p.block_table("b")[:2] == p.block_table("a")
    assert len(p.block_table("b")) == 3


def test_free_drops_one_reference_and_the_block_returns_at_zero():
    p = shared()
    p.allocate("a", 6, 10)
    p.append_slots("a", 6)
    p.fork("a", "b")
    p.fork("a", "c")
    blocks = p.block_table("a")
    p.free("a")
    assert [p.ref_count(b) for b in blocks] == [2, 2] and p.num_free_blocks == 6
    p.free("b")
    p.free("c")
    assert all(p.pool.is_free(b) for b in blocks) and p.num_free_blocks == 8
    p.check_invariants()


def test_copy_on_write_is_all_or_nothing_when_the_pool_is_dry():
    p = shared(num_blocks=3)
    p.allocate("a", 6, 4)
    p.append_slots("a", 6)
    p.fork("a", "b")
    p.allocate("filler", 4, 1)  # takes the last free block
    assert not p.can_append_slots("b", 1)
    before = p.snapshot()
    with pytest.raises(NoFreeMemory, match="copy-on-write"):
        p.append_slots("b", 1)
    assert p.snapshot() == before  # nothing changed
    p.free("filler")
    assert p.can_append_slots("b", 1)
    p.append_slots("b", 1)
    p.check_invariants()


def test_a_pending_copy_into_a_freed_block_is_dropped():
    p = shared()
    p.allocate("a", 6, 10)
    p.append_slots("a", 6)
    p.fork("a", "b")
    p.append_slots("b", 1)
    assert len(p.pending_copies()) == 1
    p.free("b")  # preempted before the engine made the copy
    assert p.pending_copies() == []
    p.check_invariants()


def test_usage_counts_a_shared_block_once():
    p = shared()
    p.allocate("a", 6, 10)
    p.append_slots("a", 6)
    for child in ("b", "c"):
        p.fork("a", child)
    u = p.usage()
    assert (u.tokens, u.internal, u.num_seqs) == (6, 2, 3)  # the shared tail of block 2 is never filled in place
    assert u.tokens + u.reserved + u.internal + u.free == u.total
    p.append_slots("b", 1)
    u = p.usage()
    assert u.tokens == 9 and u.tokens + u.reserved + u.internal == 3 * 4  # 3 blocks in use


def test_bad_input():
    p = shared()
    p.allocate("a", 3, 3)
    with pytest.raises(KeyError, match="nobody"):
        p.fork("nobody", "x")
    with pytest.raises(ValueError, match="already allocated"):
        p.fork("a", "a")
    with pytest.raises(ValueError, match="final_len"):
        p.fork("a", "x", final_len=999)
    with pytest.raises(ValueError, match="RefCountedBlockPool"):
        SharedPolicy(32, block_size=4, pool=object())


def test_shared_is_a_policy_name_beside_the_four_earlier_ones():
    assert "shared" in ALL_POLICIES and "shared" not in POLICIES  # chapters 01-04 compare those four
    p = make_policy("shared", num_slots=64, block_size=4)
    assert isinstance(p, SharedPolicy) and p.shares_blocks and p.label == "shared"
    assert not make_policy("on_demand", num_slots=64).shares_blocks
    assert make_policy("on_demand", num_slots=64).drain_copies() == []


def test_snapshot_is_plain_data():
    p = shared()
    p.allocate("a", 5, 3)
    p.append_slots("a", 5)
    p.fork("a", "b")
    snap = p.snapshot()
    assert snap["tables"] == {"a": [0, 1], "b": [0, 1]} and snap["refs"] == {0: 2, 1: 2}
    assert snap["fill"] == {0: 4, 1: 1} and snap["tokens"] == {"a": 5, "b": 5} and snap["copies"] == []
