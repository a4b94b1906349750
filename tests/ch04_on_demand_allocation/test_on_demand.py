"""Chapter 04: blocks taken only as tokens arrive. Waste stays under one block per sequence."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.kv import NoFreeMemory, OnDemandPolicy, make_policy


def policy(num_blocks=8, block_size=4, watermark=0.0, max_model_len=64):
    return OnDemandPolicy(num_blocks * block_size, block_size=block_size, max_model_len=max_model_len,
                          watermark=watermark)


def test_admission_takes_the_prompt_blocks_and_tables_grow_one_block_at_a_time():
    p = policy()
    p.allocate("a", 5, 20)  # a 5-token prompt: 2 blocks, whatever max_new_tokens says
    assert len(p.allocated_blocks("a")) == 2 and p.num_free_blocks == 6
    p.append_slots("a", 5)
    for tokens in range(6, 20):
        p.append_slots("a", 1)
        assert len(p.allocated_blocks("a")) == -(-tokens // 4)  # ceil(tokens / block_size)
    u = p.usage()
    assert (u.tokens, u.reserved, u.internal) == (19, 1, 0)  # 5 blocks, 1 slot left, still to be used
    p.check_invariants()


def test_waste_is_below_one_block_per_sequence():
    p = OnDemandPolicy(1024, block_size=16, max_model_len=512, watermark=0)
    for seq, (prompt, out) in enumerate([(1, 1), (15, 3), (16, 1), (17, 40), (100, 100)]):
        p.allocate(seq, prompt, out, final_len=prompt + out)
        p.append_slots(seq, prompt)
        for _ in range(out):
            p.append_slots(seq, 1)
            u = p.usage()
            assert u.reserved + u.internal < 16 * u.num_seqs
    u = p.usage()
    assert u.reserved == 0 and u.internal == sum(-n % 16 for n in (2, 18, 17, 57, 200))


def test_no_free_block_raises_and_changes_nothing():
    p = policy(num_blocks=3)
    p.allocate("a", 4, 8)  # may grow to 12 tokens: the whole pool
    p.allocate("b", 8, 4)
    p.append_slots("a", 4)
    p.append_slots("b", 8)
    assert p.num_free_blocks == 0
    assert not p.can_append_slots("a")
    with pytest.raises(NoFreeMemory, match="needs 1 more block"):
        p.append_slots("a", 1)
    assert p.num_tokens("a") == 4 and len(p.allocated_blocks("a")) == 1
    p.free("b")  # preempt b: its blocks serve a
    assert p.append_slots("a", 5)[0] in range(4 * 1, 4 * 3)  # b's first block, now a's second
    p.check_invariants()


def test_the_watermark_keeps_blocks_for_running_sequences():
    p = policy(num_blocks=100, watermark=0.05, max_model_len=400)  # 5 blocks kept back
    assert p.watermark_blocks == 5
    p.allocate("big", 4 * 98, 4)  # an empty pool admits even into the watermark
    p.free("big")
    p.allocate("big", 4 * 90, 4)
    assert p.can_allocate(4 * 5, 1)  # 5 blocks: 5 left = the watermark
    assert not p.can_allocate(4 * 6, 1)  # 6 blocks would dip into it


def test_requests_longer_than_the_pool_raise_value_error():
    p = policy(num_blocks=8, max_model_len=64)  # 32 slots
    with pytest.raises(ValueError, match="can never fit"):
        p.can_allocate(10, 30)  # might grow to 40 tokens > 32 slots
    assert p.can_allocate(10, 30, final_len=20)  # known to stop at 20
    with pytest.raises(ValueError, match="watermark"):
        OnDemandPolicy(64, watermark=1.5)
    with pytest.raises(ValueError, match="n must be"):
        p.allocate("a", 3, 3)
        p.append_slots("a", "2")


def test_factory_builds_every_stage():
    for name, label in [("contiguous", "contiguous(pow2)"), ("fixed_blocks", "fixed_blocks(pow2)"),
                        ("block_table", "block_table(pow2)"), ("on_demand", "on_demand")]:
        p = make_policy(name, num_slots=4096, block_size=16, max_model_len=1024, reservation="pow2")
        assert p.name == name and p.label == label
        assert p.block_size == (1 if name == "contiguous" else 16) and p.num_slots == 4096
    with pytest.raises(ValueError, match="choose one of"):
        make_policy("on_demand", num_slots=64, reservation="tight")


operations = st.lists(st.tuples(st.sampled_from(["alloc", "append", "free"]), st.integers(0, 7),
                                st.integers(1, 30), st.integers(1, 30), st.integers(0, 30)),
                      max_size=80)


@settings(max_examples=80, deadline=None)
@given(ops=operations, block_size=st.sampled_from([1, 4, 16]), watermark=st.sampled_from([0.0, 0.1]))
def test_random_operations_keep_the_invariants(ops, block_size, watermark):
    p = OnDemandPolicy(256, block_size=block_size, max_model_len=64, watermark=watermark)
    for op, seq, x, y, z in ops:
        if op == "alloc" and seq not in p.seq_ids():
            if p.can_allocate(x, y):
                p.allocate(seq, x, y)
            else:
                with pytest.raises(NoFreeMemory):
                    p.allocate(seq, x, y)
        elif op == "append" and seq in p.seq_ids():
            n = 1 + z % 8
            if p.can_append_slots(seq, n):
                old = p.token_slots(seq)
                new = p.append_slots(seq, n)
                assert p.token_slots(seq) == old + new
            else:
                free_before = p.num_free_blocks
                with pytest.raises(NoFreeMemory):
                    p.append_slots(seq, n)
                assert p.num_free_blocks == free_before
        elif op == "free" and seq in p.seq_ids():
            p.free(seq)
        p.check_invariants()
        u = p.usage(head=(x, y, None))
        assert u.external == 0
        assert u.tokens + u.reserved + u.internal + u.free == p.num_slots
        for q in p.seq_ids():  # once its prompt is written, a sequence wastes less than one block
            if p.num_tokens(q) >= p._seqs[q].prompt_len:
                assert len(p.allocated_blocks(q)) * block_size - p.num_tokens(q) < block_size
    for seq in p.seq_ids():
        p.free(seq)
    p.check_invariants()
    assert p.num_free_blocks == p.num_blocks  # no leak
