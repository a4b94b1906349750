"""Chapter 07, the books alone: block keys, hits, the LRU list of cached blocks, eviction, no leaks."""

import pytest

from minipaged.kv import NoFreeMemory, PrefixBlockPool, PrefixCachingPolicy, make_policy
from minipaged.kv.prefix_cache import block_keys
from minipaged.kv.swap import SwapSpace

BS = 4


def policy(num_blocks=16, **kw):
    return PrefixCachingPolicy(num_blocks * BS, block_size=BS, max_model_len=64, watermark=0.0, **kw)


def run_prompt(p, seq_id, ids, new=2):
    """Admit ids, write (commit) the uncached part and `new` generated tokens, as the engine would."""
    p.allocate(seq_id, len(ids), new, token_ids=ids)
    cached = p.num_tokens(seq_id)
    p.append_slots(seq_id, len(ids) - cached)
    p.commit_tokens(seq_id, ids[cached:])
    for t in range(new):
        p.append_slots(seq_id, 1)
        p.commit_tokens(seq_id, [1000 + t])
    return cached


A = list(range(1, 11))  # 10 tokens: blocks [1-4] [5-8] and 2 tokens in a third


def test_a_key_names_the_block_and_everything_before_it():
    keys = block_keys(A, BS)
    assert len(keys) == 2, "only full blocks get a key"
    assert keys[0] == (None, (1, 2, 3, 4)) and keys[1] == (hash(keys[0]), (5, 6, 7, 8))
    other = block_keys([9, 9, 9, 9, 5, 6, 7, 8], BS)
    assert other[1][1] == keys[1][1] and other[1] != keys[1], "same tokens after another prefix: another key"
    assert block_keys(A, BS, keys[0], start=1) == keys[1:]


def test_a_finished_request_leaves_its_full_blocks_findable():
    p = policy()
    assert run_prompt(p, "a", A) == 0
    a_blocks = p.block_table("a")[:2]
    p.free("a")
    assert p.num_cached_blocks() == 3, "blocks [1-4], [5-8] and [9, 10, 1000, 1001]"
    assert p.num_free_blocks == p.num_blocks, "cached blocks nobody holds still count as free memory"
    b = A[:8] + [50, 51, 52]
    p.allocate("b", len(b), 4, token_ids=b)
    assert p.num_tokens("b") == 8 and p.block_table("b")[:2] == a_blocks
    assert p.cached_prefix_tokens(b) == 8
    assert p.stats["hit_tokens"] == 8 and p.stats["query_tokens"] == len(A) + len(b)
    p.check_invariants()


def test_the_last_prompt_token_is_always_computed():
    p = policy()
    run_prompt(p, "a", A[:8], new=1)
    a_blocks = p.block_table("a")[:2]
    p.free("a")
    p.allocate("b", 8, 1, token_ids=A[:8])  # the very same prompt: its logits are still needed
    assert p.num_tokens("b") == 4
    p.append_slots("b", 4)  # the second block is recomputed into a fresh block ...
    assert p.block_table("b") == [a_blocks[0], p.block_table("b")[1]] and p.block_table("b")[1] != a_blocks[1]
    assert p.pool.lookup(block_keys(A[:8], BS)[1]) == a_blocks[1], "... and the cached one is left as it was"
    p.check_invariants()


def test_only_an_unbroken_run_from_the_first_block_hits():
    p = policy()
    run_prompt(p, "a", A)
    p.free("a")
    assert p.cached_prefix_tokens([0, 0, 0, 0] + A[4:]) == 0, "block [5-8] after another first block"
    assert p.cached_prefix_tokens(A[:4] + [0, 0, 0, 0, 9]) == 4


def test_live_sharers_count_their_holders_and_never_write_into_a_cached_block():
    p = policy()
    p.allocate("a", len(A), 8, token_ids=A)
    p.append_slots("a", len(A))
    p.commit_tokens("a", A)
    p.allocate("b", len(A), 8, token_ids=A)
    assert p.num_tokens("b") == 8
    shared = p.block_table("b")[:2]
    assert [p.ref_count(blk) for blk in shared] == [2, 2]
    p.append_slots("b", 2 + 5)  # fills b's own third block and starts a fourth
    assert p.drain_copies() == [], "the cached blocks are full: nobody writes there, nothing to copy"
    p.check_invariants()
    p.free("a")
    p.free("b")
    assert p.num_free_blocks == p.num_blocks and not p.seq_ids()
    p.check_invariants()


def test_a_hit_on_blocks_held_by_others_needs_less_free_memory():
    p = policy(num_blocks=5)
    p.allocate("a", 12, 1, token_ids=list(range(12)))  # 3 blocks
    p.append_slots("a", 12)
    p.commit_tokens("a", list(range(12)))
    b = list(range(12)) + [77]  # 4 blocks, 3 of them cached and held by "a"
    assert p.num_free_blocks == 2
    assert not p.can_allocate(13, 1), "without its tokens the request needs 4 fresh blocks"
    assert p.can_allocate(13, 1, token_ids=b)
    p.allocate("b", 13, 1, token_ids=b)
    assert p.num_tokens("b") == 12 and p.num_free_blocks == 1
    p.check_invariants()


def test_cached_blocks_are_evicted_least_recently_used_first():
    p = policy(num_blocks=6)
    x, y = [1] * 8 + [2], [3] * 8 + [4]  # 3 blocks each: 6 blocks, the whole pool
    run_prompt(p, "x", x, new=1)
    p.free("x")
    run_prompt(p, "y", y, new=1)
    p.free("y")
    assert p.num_cached_blocks() == 4, "x and y each leave 2 full blocks (their third holds 2 tokens)"
    assert p.pool.num_evictable == 4 and p.num_free_blocks == 6
    p.allocate("z", 5, 1, token_ids=[9] * 5)  # 2 fresh blocks: 2 plain free ones, no eviction
    assert p.evictions == 0
    p.allocate("w", 5, 1, token_ids=[8] * 5)  # 2 more: now the cache must give up x's blocks, last first
    assert p.evictions == 2
    assert p.cached_prefix_tokens(x) == 0 and p.cached_prefix_tokens(y) == 8
    p.free("z")
    p.free("w")
    assert p.num_free_blocks == p.num_blocks
    p.check_invariants()


def test_a_sequence_gives_back_its_last_block_first():
    p = policy(num_blocks=4)
    run_prompt(p, "x", [1] * 12 + [2], new=3)  # 4 blocks; 3 full after the outputs: [1]*4 twice, [1]*4+...
    keys_in_order = list(p.snapshot()["tables"]["x"])
    p.free("x")
    lru = p.snapshot()["evictable"]
    assert lru == [b for b in reversed(keys_in_order) if b in lru], "the prompt's first block is evicted last"


def test_a_hit_on_an_evictable_block_takes_it_off_the_lru_list():
    p = policy()
    run_prompt(p, "a", A)
    p.free("a")
    before = p.pool.num_evictable
    p.allocate("b", len(A), 2, token_ids=A)
    assert p.pool.num_evictable == before - 2
    assert p.num_free_blocks == p.num_blocks - 3, "2 cached blocks revived + 1 fresh block"
    p.check_invariants()


def test_a_prompt_admitted_in_the_same_step_finds_the_blocks_promised_before_it():
    p = policy()
    p.allocate("a", len(A), 2, token_ids=A)
    a_slots = p.append_slots("a", len(A))  # planned, not written: a's two full blocks are findable now ...
    p.allocate("b", len(A), 2, token_ids=A)  # ... so b, admitted in the same step, hits them
    assert p.num_tokens("b") == 8 and p.block_table("b") == p.block_table("a")[:2]
    b_slots = p.append_slots("b", 2)
    assert p.drain_copies() == [], "nobody writes into a block someone else holds"
    assert a_slots[:8] == p.token_slots("b")[:8] and not set(b_slots) & set(a_slots)
    p.commit_tokens("a", A)
    p.commit_tokens("b", A[8:])
    assert p.num_cached_blocks() == 2 and p.stats["blocks_registered"] == 2
    p.check_invariants()
    p.free("a")
    p.free("b")
    assert p.num_free_blocks == p.num_blocks
    p.check_invariants()


def test_blocks_are_promised_only_once_their_slots_are_planned():
    p = policy()
    p.allocate("a", len(A), 2, token_ids=A)
    p.allocate("b", len(A), 2, token_ids=A)  # before a's slots: no hit, so no one shares a's blocks
    assert p.num_tokens("b") == 0
    for s in ("a", "b"):
        p.append_slots(s, len(A))
    assert p.drain_copies() == [], "a writes its own prompt in place: its blocks have one holder"
    assert p.cached_prefix_tokens(A + [1]) == 8 and p.stats["blocks_registered"] == 2, "b's copy stays private"
    p.check_invariants()


def test_promised_blocks_that_are_never_written_leave_the_cache():
    p = policy()
    p.allocate("a", len(A), 2, token_ids=A)
    p.append_slots("a", len(A))
    assert p.cached_prefix_tokens(A) == 8
    p.free("a")  # an admission rolled back before the forward pass wrote anything
    assert p.cached_prefix_tokens(A) == 0 and p.num_cached_blocks() == 0
    assert p.num_free_blocks == p.num_blocks
    p.check_invariants()


def test_swapped_tables_keep_their_tokens_and_come_back_findable():
    p, space = policy(num_blocks=8), SwapSpace(8, BS)
    p.allocate("a", len(A), 4, token_ids=A)
    p.append_slots("a", len(A))
    p.commit_tokens("a", A)
    out = space.swap_out({s: p.detach(s) for s in ["a"]})
    assert len(out) == 3 and p.pool.num_evictable == 2, "its full blocks stay cached on the device, unheld"
    p.allocate("filler", 30, 1, token_ids=list(range(100, 130)))  # 8 blocks: evicts everything cached
    assert p.cached_prefix_tokens(A) == 0 and p.evictions == 2
    p.free("filler")
    space.swap_in(["a"], p.attach_swapped(space.tables_of(["a"])))
    assert p.num_tokens("a") == len(A)
    p.append_slots("a", 1)
    p.commit_tokens("a", [5])
    assert p.cached_prefix_tokens(A + [5]) == 8, "the swapped-in copies entered the cache again"
    p.check_invariants()
    p.free("a")
    space.check_invariants()
    assert p.num_free_blocks == p.num_blocks


def test_fork_children_inherit_the_recorded_tokens():
    p = policy()
    p.allocate("a", 6, 4, token_ids=A[:6])
    p.append_slots("a", 6)
    p.commit_tokens("a", A[:6])
    p.fork("a", "b")
    for s, t in (("a", 70), ("b", 80)):
        p.append_slots(s, 2)
        p.commit_tokens(s, [t, t])
    assert p.cached_prefix_tokens(A[:6] + [70, 70, 1]) == 8
    assert p.cached_prefix_tokens(A[:6] + [80, 80, 1]) == 8, "the child's copy-on-write block is cached too"
    p.check_invariants()


def test_bad_input_names_the_field_and_changes_nothing():
    p = policy()
    with pytest.raises(ValueError, match="token_ids"):
        p.allocate("a", 5, 2, token_ids=[1, 2, 3])
    p.allocate("a", 3, 2, token_ids=[1, 2, 3])
    p.append_slots("a", 3)
    with pytest.raises(ValueError, match="committed"):
        p.commit_tokens("a", [1, 2, 3, 4])
    assert p.snapshot()["tokens"]["a"] == 3
    with pytest.raises(ValueError, match="PrefixBlockPool"):
        PrefixCachingPolicy(64, block_size=BS, pool=make_policy("shared", 64, block_size=BS).pool)
    p.check_invariants()


def test_no_room_raises_no_free_memory_and_changes_nothing():
    p = policy(num_blocks=3)
    run_prompt(p, "a", A)  # 3 blocks held
    snap = p.snapshot()
    with pytest.raises(NoFreeMemory):
        p.allocate("b", len(A), 2, token_ids=A)  # needs one fresh block beside its 2 hits
    assert p.snapshot() == snap and p.stats["queries"] == 1
    p.check_invariants()


def test_the_pool_alone():
    pool = PrefixBlockPool(3)
    (a,) = pool.take(1)
    key = (None, (1, 2))
    assert pool.register(a, key) and not pool.register(a, key)
    pool.release([a])
    assert pool.num_free == 3 and pool.num_cached == 1 and pool.lookup(key) == a
    pool.reuse(a)
    assert pool.ref_count(a) == 1 and pool.num_evictable == 0
    pool.release([a])
    with pytest.raises(RuntimeError, match="twice"):
        pool.release([a])
    assert sorted(pool.take(3)) == [0, 1, 2] and pool.lookup(key) is None and pool.evictions == 1
    pool.check_invariants()


def test_reset_forgets_every_cached_block_and_keeps_the_running_ones():
    p = policy()
    run_prompt(p, "a", A)
    p.free("a")
    run_prompt(p, "b", [7] * 9)
    assert p.num_cached_blocks() == 5
    assert p.reset_cache() == 5
    assert p.num_cached_blocks() == 0 and p.cached_prefix_tokens(A) == 0 and p.pool.num_evictable == 0
    assert p.num_free_blocks == p.num_blocks - 3, "b still holds its three blocks"
    p.append_slots("b", 3)
    p.commit_tokens("b", [7, 7, 7])  # the block b fills now is cached as usual; the forgotten ones stay so
    assert p.num_cached_blocks() == 1 and p.cached_prefix_tokens([7] * 13) == 0
    p.free("b")
    assert p.num_free_blocks == p.num_blocks
    p.check_invariants()


def test_a_promise_someone_relies_on_cannot_be_withdrawn_silently():
    p = policy()
    p.allocate("a", len(A), 2, token_ids=A)
    p.append_slots("a", len(A))
    p.allocate("b", len(A), 2, token_ids=A)  # b counts a's two unwritten blocks as computed
    with pytest.raises(RuntimeError, match="free that sequence first"):
        p.free("a")
    p.free("b")  # the newest first, as the engine's abort does
    p.free("a")
    assert p.num_cached_blocks() == 0 and p.num_free_blocks == p.num_blocks
    p.check_invariants()


def test_a_sequence_with_unwritten_tokens_cannot_be_swapped_out():
    p, space = policy(), SwapSpace(8, BS)
    p.allocate("a", len(A), 2, token_ids=A)
    p.append_slots("a", len(A))
    with pytest.raises(RuntimeError, match="planned but not written"):
        space.swap_out({s: p.detach(s) for s in ["a"]})
    p.commit_tokens("a", A)
    assert len(space.swap_out({s: p.detach(s) for s in ["a"]})) == 3
    space.drop("a")
    space.check_invariants()
    assert not space.seq_ids() and p.num_free_blocks == p.num_blocks
