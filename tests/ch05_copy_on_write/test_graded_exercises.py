"""Chapter 05's graded exercises, pinned down: reference counts, fork and copy-on-write (no model).

Each expected value below follows from the rules of the chapter, worked out by hand in the comments:
a block leaves the free list with count 1, each fork adds a holder, each release removes one, and a
block goes back to the end of the free list when its last holder lets go.

The exercises build on each other in this order, and so do their tests: 05.1's use the pool alone,
05.2's fork sequences whose tokens were never written through ``append_slots`` (whose copy-on-write
hook is exercise 05.3), and 05.3's use everything.
"""

import pytest

from minipaged.kv import RefCountedBlockPool, SharedPolicy


def shared(num_blocks=8, block_size=4, max_model_len=32):
    return SharedPolicy(num_blocks * block_size, block_size=block_size, max_model_len=max_model_len, watermark=0)


def admit_prompt(p, seq_id, prompt_len, max_new_tokens, **kw):
    """Admit a sequence and count its prompt as written. Before any fork no block is shared, so
    ``append_slots`` would write in place; setting the count directly keeps 05.2's tests off 05.3."""
    p.allocate(seq_id, prompt_len, max_new_tokens, **kw)
    p._state(seq_id).num_tokens = prompt_len


# ---- 05.1: RefCountedBlockPool.release -------------------------------------------------------------


def test_release_frees_a_block_only_when_its_last_holder_lets_go():
    pool = RefCountedBlockPool(4)
    a, b = pool.take(2)  # [0, 1]; the free list is [2, 3]
    pool.share([a, a])  # three holders of a
    pool.release([a])
    assert pool.ref_count(a) == 2 and not pool.is_free(a) and pool.num_free == 2
    pool.release([b])  # b's only holder: b goes to the end of the free list, [2, 3, 1]
    assert pool.ref_count(b) == 0 and pool.is_free(b) and pool.num_free == 3
    pool.release([a, a])  # the same block twice in one call: two holders fewer, then free: [2, 3, 1, 0]
    assert pool.ref_count(a) == 0 and pool.is_free(a) and pool.num_free == 4
    pool.check_invariants()
    assert pool.take(4) == [2, 3, b, a]  # freed blocks went to the back, in the order they were freed


def test_releasing_a_free_block_is_a_double_free_and_changes_nothing():
    pool = RefCountedBlockPool(3)
    (a,) = pool.take(1)
    pool.release([a])
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release([a])
    assert pool.ref_count(a) == 0 and pool.num_free == 3  # no negative count, no second copy in the list
    pool.check_invariants()
    assert sorted(pool.take(3)) == [0, 1, 2]


# ---- 05.2: SharedPolicy.fork ---------------------------------------------------------------------


def test_fork_takes_no_block_and_gives_the_child_the_parents_tokens():
    p = shared()
    admit_prompt(p, "a", 5, 6)  # on demand: the prompt's 2 blocks at admission
    free = p.num_free_blocks
    p.fork("a", "b")
    p.fork("b", "c")  # a fork of a fork shares the same blocks once more
    assert p.num_free_blocks == free
    assert p.num_tokens("b") == p.num_tokens("c") == 5
    assert p.allocated_blocks("c") == p.allocated_blocks("a") and p.token_slots("c") == p.token_slots("a")
    assert [p.ref_count(x) for x in p.allocated_blocks("a")] == [3, 3]
    assert p.sharing().physical_blocks == 2 and p.sharing().logical_blocks == 6
    assert p.drain_copies() == []
    p.check_invariants()


def test_the_childs_table_is_a_list_of_its_own():
    """Growing one table must not grow the other: the child gets a copy of the parent's list."""
    p = shared()
    admit_prompt(p, "a", 8, 8)
    p.fork("a", "b")
    assert p._state("b").blocks == p._state("a").blocks
    assert p._state("b").blocks is not p._state("a").blocks


def test_the_child_keeps_its_own_future_or_inherits_the_parents():
    p = shared(max_model_len=64)
    admit_prompt(p, "a", 6, 10, final_len=12)
    p.fork("a", "same")
    p.fork("a", "longer", max_new_tokens=30, final_len=20)
    same, longer = p._state("same"), p._state("longer")
    assert (same.prompt_len, same.max_new_tokens, same.final_len, same.num_tokens) == (6, 10, 12, 6)
    assert (longer.prompt_len, longer.max_new_tokens, longer.final_len, longer.num_tokens) == (6, 30, 20, 6)


def test_a_block_shared_by_a_fork_outlives_whichever_holder_goes_first():
    for first, second in (("a", "b"), ("b", "a")):
        p = shared()
        admit_prompt(p, "a", 8, 4)  # two full blocks
        p.fork("a", "b")
        blocks = p.block_table("a")
        p.free(first)
        assert [p.ref_count(x) for x in blocks] == [1, 1] and p.num_free_blocks == 6
        assert p.block_table(second) == blocks
        p.free(second)
        assert p.num_free_blocks == 8 and all(p.pool.is_free(x) for x in blocks)
        p.check_invariants()


# ---- 05.3: SharedPolicy._block_for_write ---------------------------------------------------------


def test_every_writer_but_the_last_holder_copies_and_the_copies_are_recorded_in_order():
    p = shared()
    p.allocate("a", 6, 10)
    p.append_slots("a", 6)  # block 0 full, block 1 holds 2 of 4
    p.fork("a", "b")
    p.fork("a", "c")
    full, partial = p.block_table("a")
    free = p.num_free_blocks
    (slot_b,) = p.append_slots("b", 1)
    (slot_c,) = p.append_slots("c", 1)
    (slot_a,) = p.append_slots("a", 1)  # by now a is the last holder: it writes in place
    copy_b, copy_c = p.block_table("b")[1], p.block_table("c")[1]
    assert p.pending_copies() == [(partial, copy_b), (partial, copy_c)]
    assert len({full, partial, copy_b, copy_c}) == 4 and p.num_free_blocks == free - 2
    assert (slot_b, slot_c, slot_a) == (copy_b * 4 + 2, copy_c * 4 + 2, partial * 4 + 2)
    assert [p.ref_count(x) for x in (full, partial, copy_b, copy_c)] == [3, 1, 1, 1]
    assert p.stats["cow_copies"] == 2
    p.check_invariants()


def test_a_write_of_several_tokens_copies_the_shared_block_once():
    p = shared()
    p.allocate("a", 6, 10)
    p.append_slots("a", 6)
    p.fork("a", "b")
    full, partial = p.block_table("a")
    slots = p.append_slots("b", 3)  # positions 6 and 7 in the (copied) block 1, position 8 in a new block
    ((src, dst),) = p.drain_copies()
    grown = p.block_table("b")[2]
    assert src == partial and p.block_table("b") == [full, dst, grown]
    assert slots == [dst * 4 + 2, dst * 4 + 3, grown * 4 + 0]
    assert p.block_table("a") == [full, partial] and p.ref_count(partial) == 1 and p.ref_count(full) == 2
    assert p.stats["cow_copies"] == 1
    p.check_invariants()


def test_an_unshared_block_is_written_in_place():
    p = shared()
    p.allocate("a", 3, 5)
    first = p.append_slots("a", 3)
    more = p.append_slots("a", 2)
    (block,) = p.block_table("a")[:1]
    assert first + more[:1] == [block * 4 + i for i in range(4)]
    assert p.pending_copies() == [] and p.stats["cow_copies"] == 0
