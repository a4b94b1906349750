"""Chapter 04: focused checks for the graded exercises (growing a table all or nothing, and the
admission watermark). The expected values are worked out in the comments."""

import pytest

from minipaged.kv import NoFreeMemory, OnDemandPolicy


def policy(num_blocks, block_size=4, watermark=0.0, max_model_len=128):
    return OnDemandPolicy(num_blocks * block_size, block_size=block_size, max_model_len=max_model_len,
                          watermark=watermark)


def test_growing_by_several_blocks_is_all_or_nothing():
    p = policy(4)
    p.allocate("a", 4, 12)  # 1 block
    p.append_slots("a", 4)
    p.allocate("b", 8, 4)  # 2 blocks
    p.append_slots("b", 8)
    assert p.num_free_blocks == 1
    table_before = list(p.allocated_blocks("a"))
    with pytest.raises(NoFreeMemory):
        p.append_slots("a", 8)  # needs 2 more blocks, 1 is free: take none of them
    assert p.num_free_blocks == 1
    assert list(p.allocated_blocks("a")) == table_before and p.num_tokens("a") == 4
    p.check_invariants()
    assert p.append_slots("a", 4) == list(range(12, 16))  # the one free block (3) is still there
    assert p.num_free_blocks == 0
    p.check_invariants()


def test_a_table_grows_by_exactly_the_missing_blocks():
    p = policy(10)
    p.allocate("a", 3, 13)  # 1 block
    assert p.append_slots("a", 3) == [0, 1, 2]
    assert p.append_slots("a", 10) == list(range(3, 13))  # 13 tokens: 4 blocks, 3 of them new
    assert list(p.allocated_blocks("a")) == [0, 1, 2, 3] and p.num_free_blocks == 6
    assert p.append_slots("a", 3) == [13, 14, 15]  # still inside block 3: nothing taken
    assert p.num_free_blocks == 6
    p.check_invariants()


def test_running_sequences_may_grow_into_the_watermark():
    p = policy(20, watermark=0.1)  # 2 blocks kept back at admission
    assert p.watermark_blocks == 2
    p.allocate("a", 4 * 18, 8)  # 18 blocks: the 2 left are the watermark
    p.append_slots("a", 4 * 18)
    p.append_slots("a", 4)  # growth may use the watermark: it is kept for exactly this
    p.append_slots("a", 4)
    assert p.num_free_blocks == 0
    with pytest.raises(NoFreeMemory):
        p.append_slots("a", 1)
    p.check_invariants()


def test_admission_keeps_the_watermark_free():
    p = policy(50, watermark=0.1, max_model_len=256)  # 5 of the 50 blocks kept back
    assert p.watermark_blocks == 5
    assert p.can_allocate(4 * 50 - 1, 1)  # the pool is empty: one request may take all 50 blocks
    p.allocate("a", 4 * 10, 1)  # 10 blocks: 40 free
    assert p.can_allocate(4 * 35, 1)  # 35 blocks: 5 stay free, the watermark exactly
    assert p.can_allocate(4 * 34 + 1, 1)  # 137 tokens: 35 blocks as well
    assert not p.can_allocate(4 * 35 + 1, 1)  # 36 blocks: only 4 would stay free
    with pytest.raises(NoFreeMemory):
        p.allocate("b", 4 * 36, 1)
    assert p.num_free_blocks == 40 and p.seq_ids() == ["a"]
    p.free("a")
    assert p.can_allocate(4 * 50 - 1, 1)  # empty again: no watermark to keep
