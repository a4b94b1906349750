"""Chapter 01: the contiguous arena. First fit, reservation rules, waste accounting, refusals."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kv import ContiguousArena, NoFreeMemory, ReservationExceeded, make_policy


def arena(num_slots=100, max_model_len=64, reservation="oracle"):
    return ContiguousArena(num_slots, max_model_len=max_model_len, reservation=reservation)


def test_first_fit_reuses_the_lowest_hole():
    a = arena()
    a.allocate("a", 10, 20, final_len=30)  # oracle: slab of exactly 30
    a.allocate("b", 10, 10, final_len=20)
    a.allocate("c", 10, 20, final_len=30)
    assert [a.allocated_blocks(s).start for s in "abc"] == [0, 30, 50]
    a.free("b")
    a.allocate("d", 5, 5, final_len=10)  # fits in the hole b left (30..50), not at the end (80..100)
    assert a.allocated_blocks("d") == range(30, 40)
    assert a.holes() == [(40, 10), (80, 20)]
    a.check_invariants()


def test_refused_although_total_free_memory_would_hold_it():
    a = arena()
    for seq, size in [("a", 30), ("b", 20), ("c", 30), ("d", 10)]:
        a.allocate(seq, size - 5, 5, final_len=size)
    a.free("b")
    a.allocate("e", 5, 5, final_len=10)  # holes now: 40..50 and 90..100
    assert a.num_free_slots() == 20
    assert not a.can_allocate(10, 5, final_len=15)  # 15 <= 20 free, but no hole of 15
    before = (a.seq_ids(), a.holes())
    with pytest.raises(NoFreeMemory) as refusal:
        a.allocate("f", 10, 5, final_len=15)
    assert "largest usable hole has 10" in refusal.value.reason
    assert (a.seq_ids(), a.holes()) == before  # nothing changed, nothing leaked
    usage = a.usage(head=(10, 5, 15))
    assert usage.external == 20 and usage.free == 0  # every free slot is unusable for the head
    assert a.usage(head=(20, 5, 25)).external == 0  # needs more than all free memory: just full
    assert a.usage(head=(5, 5, 10)).external == 0  # fits a hole: no fragmentation to speak of
    a.check_invariants()


def test_reservation_rules():
    assert arena(reservation="max", max_model_len=64)._slots_needed(10, 20, 25) == 64
    assert arena(reservation="pow2")._slots_needed(10, 20, 25) == 32  # next power of two of 30
    assert arena(reservation="pow2", max_model_len=48)._slots_needed(10, 30, 25) == 48  # capped
    assert arena(reservation="oracle")._slots_needed(10, 20, 25) == 25
    assert arena(reservation="oracle")._slots_needed(10, 20, None) == 30  # prompt + max_new_tokens


def test_waste_accounting_by_hand():
    a = ContiguousArena(4096, max_model_len=1024, reservation="max")
    a.allocate("x", 100, 200, final_len=250)
    a.append_slots("x", 100)  # the prompt
    a.append_slots("x", 50)  # 50 decoded tokens
    u = a.usage()
    assert (u.tokens, u.reserved, u.internal, u.external, u.free) == (150, 100, 774, 0, 3072)
    assert u.occupied == 1024 and u.utilization == pytest.approx(150 / 1024)
    assert u.tokens + u.reserved + u.internal + u.external + u.free == u.total == 4096
    a.allocate("y", 10, 20)  # no final_len: assumes it reaches prompt + max_new_tokens = 30
    a.append_slots("y", 10)
    u = a.usage()
    assert (u.tokens, u.reserved, u.internal) == (160, 100 + 20, 774 + 994)


def test_slots_and_block_table_are_the_slab():
    a = arena()
    a.allocate("a", 3, 3, final_len=6)
    a.allocate("b", 4, 4, final_len=8)
    assert a.block_size == 1
    assert a.append_slots("b", 4) == [6, 7, 8, 9]
    assert a.append_slots("b", 1) == [10]
    assert a.block_table("b") == [6, 7, 8, 9, 10] == a.token_slots("b")
    assert a.num_tokens("b") == 5 and a.num_tokens("a") == 0


def test_growing_past_the_slab_is_refused_without_change():
    a = arena()
    a.allocate("a", 4, 2, final_len=6)
    a.append_slots("a", 5)
    assert a.can_append_slots("a", 1) and not a.can_append_slots("a", 2)
    with pytest.raises(ReservationExceeded):
        a.append_slots("a", 2)
    assert a.num_tokens("a") == 5
    assert a.append_slots("a", 1) == [5]


@pytest.mark.parametrize("kwargs, field", [
    (dict(prompt_len=0, max_new_tokens=5), "prompt_len"),
    (dict(prompt_len=-3, max_new_tokens=5), "prompt_len"),
    (dict(prompt_len=5, max_new_tokens=0), "max_new_tokens"),
    (dict(prompt_len=2.5, max_new_tokens=5), "prompt_len"),
    (dict(prompt_len=5, max_new_tokens=5, final_len=4), "final_len"),
    (dict(prompt_len=5, max_new_tokens=5, final_len=11), "final_len"),
    (dict(prompt_len=40, max_new_tokens=40), "max_model_len"),
])
def test_bad_sizes_raise_value_error_naming_the_field(kwargs, field):
    a = arena()
    with pytest.raises(ValueError, match=field):
        a.can_allocate(**kwargs)
    with pytest.raises(ValueError, match=field):
        a.allocate("s", **kwargs)
    assert a.seq_ids() == []


def test_requests_that_can_never_fit_raise_value_error():
    a = ContiguousArena(100, max_model_len=2048, reservation="max")  # every slab would be 2048
    with pytest.raises(ValueError, match="num_slots=100"):
        a.can_allocate(10, 10)


def test_other_bad_input():
    with pytest.raises(ValueError, match="reservation"):
        ContiguousArena(100, reservation="lots")
    with pytest.raises(ValueError, match="num_slots"):
        ContiguousArena(0)
    with pytest.raises(ValueError, match="policy name"):
        make_policy("paged", num_slots=100)
    a = arena()
    a.allocate("a", 5, 5)
    with pytest.raises(ValueError, match="already allocated"):
        a.allocate("a", 5, 5)
    with pytest.raises(ValueError, match="n must be"):
        a.append_slots("a", -1)
    with pytest.raises(KeyError, match="not allocated"):
        a.free("zzz")


def test_check_invariants_catches_overlapping_slabs():
    a = arena()
    a.allocate("a", 5, 5, final_len=10)
    a.allocate("b", 5, 5, final_len=10)
    a._seqs["b"].start = 5  # corrupt: b now overlaps a
    a._slabs = sorted((s.start, s.size) for s in a._seqs.values())
    with pytest.raises(AssertionError, match="overlaps"):
        a.check_invariants()


# ---- property-based: random allocate / append / free, invariants after every step -----------

operations = st.lists(st.tuples(st.sampled_from(["alloc", "append", "free"]), st.integers(0, 7),
                                st.integers(1, 40), st.integers(1, 40), st.integers(0, 40)),
                      max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=operations, reservation=st.sampled_from(["max", "pow2", "oracle"]))
def test_random_operations_keep_the_invariants(ops, reservation):
    a = ContiguousArena(300, max_model_len=100, reservation=reservation)
    for op, seq, x, y, z in ops:
        if op == "alloc" and seq not in a.seq_ids():
            final = x + min(z, y)
            if a.can_allocate(x, y, final):
                a.allocate(seq, x, y, final)
            else:
                with pytest.raises(NoFreeMemory):
                    a.allocate(seq, x, y, final)
        elif op == "append" and seq in a.seq_ids():
            n = 1 + z % 8
            if a.can_append_slots(seq, n):
                before = a.num_tokens(seq)
                slots = a.append_slots(seq, n)
                assert a.token_slots(seq)[before:] == slots
            else:
                with pytest.raises(ReservationExceeded):
                    a.append_slots(seq, n)
        elif op == "free" and seq in a.seq_ids():
            a.free(seq)
        a.check_invariants()
        u = a.usage(head=(x, y, None))
        assert u.tokens + u.reserved + u.internal + u.external + u.free == a.num_slots
    for seq in a.seq_ids():
        a.free(seq)
    a.check_invariants()
    assert a.holes() == [(0, 300)] and a.usage().free == 300  # no leak


def test_bookkeeping_imports_neither_torch_nor_matplotlib():
    import subprocess
    import sys

    code = ("import sys, minipaged.kv, minipaged.lab.simulator, minipaged.lab.plots; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
