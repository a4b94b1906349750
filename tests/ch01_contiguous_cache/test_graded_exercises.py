"""Chapter 01: focused checks for the graded exercises (the free holes, the reservation rules, the
waste accounting). Every expected value below is worked out by hand in the comments."""

import pytest

from minipaged.kv import ContiguousArena, reservation_tokens


def arena(num_slots=100, max_model_len=64, reservation="oracle"):
    return ContiguousArena(num_slots, max_model_len=max_model_len, reservation=reservation)


def test_holes_never_include_empty_gaps():
    a = arena()
    assert a.holes() == [(0, 100)]  # an empty arena is one hole
    a.allocate("a", 5, 5, final_len=10)  # slab 0..10: no hole before it
    assert a.holes() == [(10, 90)]
    a.allocate("b", 10, 10, final_len=20)  # slab 10..30, right after a: no hole between them
    a.allocate("c", 30, 30, final_len=60)  # slab 30..90
    assert a.holes() == [(90, 10)]
    a.allocate("d", 5, 5, final_len=10)  # slab 90..100: the arena is full, no hole at the end
    assert a.holes() == []
    a.free("b")
    assert a.holes() == [(10, 20)]
    a.free("a")  # 0..10 and 10..30 are one hole, not two
    assert a.holes() == [(0, 30)]
    a.free("d")
    assert a.holes() == [(0, 30), (90, 10)]
    a.check_invariants()


def test_holes_follow_every_change():
    a = arena(num_slots=50)
    a.allocate("a", 5, 5, final_len=10)
    a.allocate("b", 5, 5, final_len=10)
    a.allocate("c", 5, 5, final_len=10)
    assert a.holes() == [(30, 20)]
    a.free("b")
    assert a.holes() == [(10, 10), (30, 20)]
    a.allocate("d", 2, 2, final_len=4)  # first fit: the hole at 10
    assert a.allocated_blocks("d") == range(10, 14)
    assert a.holes() == [(14, 6), (30, 20)]
    a.allocate("e", 4, 4, final_len=8)  # 8 > 6: skips to the hole at 30
    assert a.allocated_blocks("e") == range(30, 38)
    assert a.holes() == [(14, 6), (38, 12)]
    a.check_invariants()


def test_reservation_tokens_by_rule():
    # "max": the model's limit, whatever the request says.
    assert reservation_tokens("max", 3, 4, 5, 64) == 64
    assert reservation_tokens("max", 30, 30, None, 64) == 64
    # "pow2": the next power of two of prompt_len + max_new_tokens (not of final_len), capped.
    assert reservation_tokens("pow2", 10, 22, 12, 64) == 32  # 32 is a power of two already
    assert reservation_tokens("pow2", 10, 23, 12, 64) == 64  # 33 -> 64
    assert reservation_tokens("pow2", 1, 1, None, 64) == 2
    assert reservation_tokens("pow2", 20, 30, None, 40) == 40  # 50 -> 64, capped at max_model_len
    assert reservation_tokens("pow2", 9, 8, 10, 2048) == 32  # 17 -> 32 (final_len 10 would give 16)
    # "oracle": exactly final_len; prompt_len + max_new_tokens when it is not known.
    assert reservation_tokens("oracle", 10, 20, 17, 64) == 17
    assert reservation_tokens("oracle", 10, 20, None, 64) == 30
    with pytest.raises(ValueError, match="choose one of"):
        reservation_tokens("exact", 10, 20, None, 64)


def test_usage_when_a_sequence_runs_past_its_final_length():
    a = arena(num_slots=100, max_model_len=32, reservation="max")  # every slab is 32 slots
    a.allocate("a", 4, 20, final_len=10)
    a.append_slots("a", 12)  # 12 tokens although final_len said 10: none of it is "reserved"
    u = a.usage()
    assert (u.tokens, u.reserved, u.internal, u.external, u.free) == (12, 0, 20, 0, 68)
    a.allocate("b", 4, 4, final_len=6)
    a.append_slots("b", 4)  # 4 tokens, 2 more to come, 26 never used
    u = a.usage()
    assert (u.tokens, u.reserved, u.internal, u.external, u.free) == (16, 2, 46, 0, 36)
    assert u.num_seqs == 2 and u.occupied == 64 and u.utilization == pytest.approx(16 / 64)


def test_usage_of_an_empty_arena():
    u = arena().usage(head=(5, 5, None))  # the head fits: nothing is external
    assert (u.tokens, u.reserved, u.internal, u.external, u.free, u.num_seqs) == (0, 0, 0, 0, 100, 0)
    assert u.utilization == 0.0


def test_external_fragmentation_boundaries():
    a = arena()  # oracle: slabs of exactly final_len
    for seq, size in [("a", 30), ("b", 20), ("c", 30), ("d", 20)]:
        a.allocate(seq, size - 5, 5, final_len=size)
    a.free("b")
    a.free("d")  # two holes of 20 (at 30 and 80): 40 free slots, the largest hole 20
    assert a.holes() == [(30, 20), (80, 20)]
    head = {need: a.usage(head=(need - 5, 5, need)) for need in (20, 21, 40, 41)}
    assert (head[20].external, head[20].free) == (0, 40)  # fits the largest hole exactly
    assert (head[21].external, head[21].free) == (40, 0)  # one slot too big for any hole
    assert (head[40].external, head[40].free) == (40, 0)  # exactly all free memory, but in pieces
    assert (head[41].external, head[41].free) == (0, 40)  # more than all free memory: simply full
    assert a.usage().external == 0  # nothing waits
