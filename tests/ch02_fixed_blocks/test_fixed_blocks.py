"""Chapter 02: fixed-size blocks, but a contiguous run per request. Fragmentation is still there."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kv import FixedBlockPolicy, NoFreeMemory, ReservationExceeded, make_policy
from minipaged.lab.simulator import make_workload, simulate


def pool(num_blocks=8, block_size=4, reservation="oracle", max_model_len=32):
    return FixedBlockPolicy(num_blocks * block_size, block_size=block_size, max_model_len=max_model_len,
                            reservation=reservation)


def test_reservations_are_rounded_up_to_whole_blocks():
    p = FixedBlockPolicy(256, block_size=16, max_model_len=128, reservation="oracle")
    p.allocate("a", 10, 10, final_len=20)  # 20 tokens -> 2 blocks of 16
    assert p.allocated_blocks("a") == range(0, 2)
    p.append_slots("a", 20)
    u = p.usage()
    assert (u.tokens, u.reserved, u.internal, u.free) == (20, 0, 12, 224)  # 12 = the rounding, < 1 block


def test_slots_follow_the_run_of_blocks():
    p = pool()
    p.allocate("a", 2, 2, final_len=4)
    p.allocate("b", 5, 4, final_len=9)  # 3 blocks: 1, 2, 3
    assert p.allocated_blocks("b") == range(1, 4)
    assert p.append_slots("b", 6) == [4, 5, 6, 7, 8, 9]
    assert p.block_table("b") == [1, 2]  # the blocks covering the 6 tokens so far
    assert p.token_slots("b") == [4, 5, 6, 7, 8, 9]
    with pytest.raises(ReservationExceeded):
        p.append_slots("b", 7)
    assert p.num_tokens("b") == 6


def test_first_fit_run_and_refusal_despite_enough_free_blocks():
    p = pool()
    for seq in "abcd":
        p.allocate(seq, 4, 4, final_len=8)  # 2 blocks each: the pool is full
    assert p.num_free_blocks == 0
    p.free("a")
    p.free("c")  # free runs: blocks 0-1 and 4-5
    assert p.free_runs() == [(0, 2), (4, 2)]
    assert p.num_free_slots() == 16
    assert not p.can_allocate(8, 4, final_len=12)  # 3 blocks: 4 are free, but no run of 3
    with pytest.raises(NoFreeMemory):
        p.allocate("e", 8, 4, final_len=12)
    assert p.free_runs() == [(0, 2), (4, 2)]  # unchanged
    assert p.usage(head=(8, 4, 12)).external == 16
    p.allocate("f", 2, 2, final_len=4)  # one block: first fit takes block 0
    assert p.allocated_blocks("f") == range(0, 1)
    p.check_invariants()


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="block_size"):
        FixedBlockPolicy(64, block_size=0)
    with pytest.raises(ValueError, match="num_slots"):
        FixedBlockPolicy(8, block_size=16)
    with pytest.raises(ValueError, match="reservation"):
        make_policy("fixed_blocks", num_slots=64, reservation="half")
    p = pool(max_model_len=64)
    with pytest.raises(ValueError, match="can never fit"):
        p.can_allocate(30, 10)  # 40 tokens = 10 blocks > 8
    with pytest.raises(ValueError, match="max_new_tokens"):
        p.allocate("x", 3, 0)


def test_num_slots_is_rounded_down_to_whole_blocks():
    p = FixedBlockPolicy(100, block_size=16)
    assert (p.num_blocks, p.num_slots) == (6, 96)


def test_check_invariants_catches_a_block_both_free_and_owned():
    p = pool()
    p.allocate("a", 2, 2, final_len=4)
    p._free.insert(0, 0)  # corrupt: block 0 is owned by "a"
    with pytest.raises(AssertionError, match="free and owned"):
        p.check_invariants()


def test_external_fragmentation_remains_in_simulation():
    trace = make_workload("sharegpt", 300, arrival_rate=1.0, seed=0)
    fixed = simulate(make_policy("fixed_blocks", num_slots=16384, reservation="oracle"), trace)
    assert fixed.fragmentation_blocked_steps > 0 and fixed.mean_usage["external"] > 0.02
    maxed = simulate(make_policy("fixed_blocks", num_slots=16384, reservation="max"), trace)
    assert 0.20 <= maxed.utilization <= 0.40  # the reservation still wastes most of the pool


operations = st.lists(st.tuples(st.sampled_from(["alloc", "append", "free"]), st.integers(0, 7),
                                st.integers(1, 30), st.integers(1, 30), st.integers(0, 30)),
                      max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=operations, reservation=st.sampled_from(["max", "pow2", "oracle"]),
       block_size=st.sampled_from([1, 3, 4, 16]))
def test_random_operations_keep_the_invariants(ops, reservation, block_size):
    p = FixedBlockPolicy(48 * 16 // block_size * block_size, block_size=block_size, max_model_len=64,
                         reservation=reservation)
    for op, seq, x, y, z in ops:
        if op == "alloc" and seq not in p.seq_ids():
            final = x + min(z, y)
            if p.can_allocate(x, y, final):
                p.allocate(seq, x, y, final)
            else:
                with pytest.raises(NoFreeMemory):
                    p.allocate(seq, x, y, final)
        elif op == "append" and seq in p.seq_ids():
            n = 1 + z % 8
            if p.can_append_slots(seq, n):
                old = p.token_slots(seq)
                new = p.append_slots(seq, n)
                assert p.token_slots(seq) == old + new
            else:
                with pytest.raises(ReservationExceeded):
                    p.append_slots(seq, n)
        elif op == "free" and seq in p.seq_ids():
            p.free(seq)
        p.check_invariants()
        u = p.usage(head=(x, y, None))
        assert u.tokens + u.reserved + u.internal + u.external + u.free == p.num_slots
    for seq in p.seq_ids():
        p.free(seq)
    p.check_invariants()
    assert p.free_runs() == [(0, p.num_blocks)]  # no leak
