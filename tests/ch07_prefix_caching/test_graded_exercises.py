"""Chapter 07, focused tests for the graded exercises (python -m minipaged.lab.exercises list --chapter 07):
the block keys, the LRU list of cached blocks nobody holds (release puts a block there, take evicts
from it), and the lookup of a prompt's cached prefix. No model: the pool and the policy alone."""

import random

import pytest

from minipaged.kv import NoFreeMemory, PrefixBlockPool, PrefixCachingPolicy
from minipaged.kv.prefix_cache import block_keys


def keys_by_definition(ids, block_size):
    """The chapter's definition: key(i) = (hash(key(i - 1)), tokens of block i), key(-1) = None."""
    keys, parent = [], None
    for i in range(len(ids) // block_size):
        key = (None if parent is None else hash(parent), tuple(ids[i * block_size:(i + 1) * block_size]))
        keys.append(key)
        parent = key
    return keys


# ---- 07.1: block keys ------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [0, 1, 3, 4, 5, 8, 11, 12])
def test_block_keys_name_only_the_full_blocks(length):
    ids = list(range(100, 100 + length))
    keys = block_keys(ids, 4)
    assert len(keys) == length // 4, "a partial last block gets no key"
    assert keys == keys_by_definition(ids, 4)
    assert all(isinstance(k[1], tuple) for k in keys), "a key holds the block's tokens as a tuple (hashable)"


def test_equal_keys_mean_equal_whole_prefixes():
    rng = random.Random(7)
    bs = 2
    seqs = [[rng.randrange(2) for _ in range(rng.randint(0, 12))] for _ in range(40)]  # many shared prefixes
    keys = [block_keys(s, bs) for s in seqs]
    for a, ka in zip(seqs, keys):
        for b, kb in zip(seqs, keys):
            for i, key_a in enumerate(ka):
                for j, key_b in enumerate(kb):
                    same_prefix = i == j and a[:(i + 1) * bs] == b[:(j + 1) * bs]
                    assert (key_a == key_b) == same_prefix, (a, i, b, j)


def test_block_keys_resume_from_a_parent_and_grow_with_the_sequence():
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    keys = block_keys(ids, 3)
    assert keys == keys_by_definition(ids, 3)
    for start in range(len(keys) + 2):  # from block `start` on, given the key of block start - 1
        parent = keys[start - 1] if 0 < start <= len(keys) else None
        if start <= len(keys):
            assert block_keys(ids, 3, parent, start=start) == keys[start:]
        else:
            assert block_keys(ids, 3, parent, start=start) == []
    assert block_keys(ids + [8], 3)[:len(keys)] == keys, "more tokens never change the earlier keys"
    assert len(block_keys(ids + [8], 3)) == len(keys) + 1, "... and the block they fill gets a key"


# ---- 07.2 and 07.3: the LRU list of cached blocks -------------------------------------------------


def pool_with_cached(num_blocks, cached, release_order):
    """A pool whose blocks were all taken, the blocks in ``cached`` registered (block b under the key
    (None, (b,))), then all released in ``release_order``."""
    pool = PrefixBlockPool(num_blocks)
    assert sorted(pool.take(num_blocks)) == list(range(num_blocks))
    for b in cached:
        assert pool.register(b, (None, (b,)))
    pool.release(release_order)
    pool.check_invariants()
    return pool


def test_take_uses_plain_free_blocks_before_evicting_anything():
    pool = pool_with_cached(6, cached=[1, 3, 4], release_order=[4, 0, 1, 5, 3, 2])
    assert pool.num_free == 6 and pool.num_cached == 3 and pool.num_evictable == 3
    got = pool.take(3)
    assert sorted(got) == [0, 2, 5] and pool.evictions == 0
    assert [pool.lookup((None, (b,))) for b in (1, 3, 4)] == [1, 3, 4], "nothing cached was given up"
    assert all(pool.ref_count(b) == 1 for b in got)
    pool.check_invariants()


def test_take_evicts_the_least_recently_released_cached_block_first():
    pool = pool_with_cached(6, cached=[1, 3, 4], release_order=[4, 0, 1, 5, 3, 2])  # LRU order: 4, 1, 3
    pool.take(3)  # the plain ones
    (first,) = pool.take(1)
    assert first == 4 and pool.evictions == 1
    assert pool.lookup((None, (4,))) is None and pool.key_of(4) is None, "an evicted block's key is forgotten"
    assert pool.ref_count(4) == 1 and not pool.is_free(4) and pool.num_cached == 2 and pool.num_evictable == 2
    pool.check_invariants()
    assert sorted(pool.take(2)) == [1, 3] and pool.evictions == 3
    assert pool.num_free == 0 and pool.num_cached == 0 and pool.num_evictable == 0
    pool.check_invariants()
    with pytest.raises(NoFreeMemory):
        pool.take(1)
    pool.release([4, 1])  # no longer cached: back to the plain free list
    assert pool.num_free == 2 and pool.num_evictable == 0
    pool.check_invariants()


def test_take_mixes_plain_and_evicted_blocks_in_one_call():
    pool = pool_with_cached(5, cached=[0, 2, 4], release_order=[2, 1, 0, 3, 4])  # plain: 1, 3; LRU: 2, 0, 4
    got = pool.take(4)
    assert sorted(got) == [0, 1, 2, 3] and pool.evictions == 2
    assert pool.lookup((None, (4,))) == 4 and pool.num_cached == 1, "only the two oldest cached blocks went"
    assert all(pool.ref_count(b) == 1 for b in got)
    pool.check_invariants()


def test_release_keeps_a_cached_block_findable_on_the_lru_list():
    pool = PrefixBlockPool(4)
    a, b, c, d = pool.take(4)
    for blk in (a, b, c):
        pool.register(blk, (None, (blk,)))
    pool.share([b])  # b has two holders
    pool.release([a])
    assert pool.ref_count(a) == 0 and pool.is_free(a) and pool.lookup((None, (a,))) == a
    assert pool.num_free == 1 and pool.num_evictable == 1 and pool.free_blocks() == [], "a waits on the LRU list"
    pool.release([b])
    assert pool.ref_count(b) == 1 and not pool.is_free(b) and pool.num_evictable == 1, "b is still held"
    pool.release([d])
    assert pool.free_blocks() == [d] and pool.ref_count(d) == 0, "an uncached block goes to the plain free list"
    pool.check_invariants()
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release([a])
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release([d])
    pool.check_invariants()


def test_release_puts_a_block_at_the_back_of_the_eviction_order():
    pool = PrefixBlockPool(4)
    a, b, c, d = pool.take(4)
    for blk in (a, b, c):
        pool.register(blk, (None, (blk,)))
    pool.release([a, b, c, d])  # plain: d; LRU: a, b, c
    pool.reuse(a)  # a hit takes it off the list ...
    assert pool.num_evictable == 2 and pool.ref_count(a) == 1
    pool.release([a])  # ... and giving it back makes it the most recently used: LRU b, c, a
    assert pool.num_free == 4 and pool.num_evictable == 3
    pool.check_invariants()
    assert pool.take(1) == [d] and pool.evictions == 0
    assert [pool.take(1)[0] for _ in range(3)] == [b, c, a], "evicted in the order they were given back"
    assert pool.evictions == 3 and pool.num_cached == 0
    pool.check_invariants()


def test_a_freed_sequence_leaves_its_full_blocks_cached_and_its_partial_block_plain():
    bs = 4
    p = PrefixCachingPolicy(8 * bs, block_size=bs, max_model_len=32, watermark=0.0)
    ids = list(range(10))  # blocks [0-3] [4-7] and 2 tokens
    p.allocate("a", len(ids), 1, token_ids=ids)
    p.append_slots("a", len(ids))
    p.commit_tokens("a", ids)
    table = p.block_table("a")
    p.free("a")
    assert p.num_free_blocks == 8 and p.pool.num_evictable == 2 and p.num_cached_blocks() == 2
    assert table[2] in p.pool.free_blocks() and not set(table[:2]) & set(p.pool.free_blocks())
    p.check_invariants()


# ---- 07.4: the lookup of a prompt's cached prefix ----------------------------------------------


def test_the_lookup_finds_the_longest_cached_prefix_of_whole_blocks():
    """Prompts and outputs written one after another in a pool that never evicts: a block is cached
    exactly when some earlier request wrote the same whole prefix. The oracle keeps those prefixes."""
    bs, rng = 2, random.Random(3)
    p = PrefixCachingPolicy(1024 * bs, block_size=bs, max_model_len=40, watermark=0.0)
    written: set[tuple] = set()  # every whole-block prefix some request has written

    def expected_hits(ids):
        k = 0
        while k < (len(ids) - 1) // bs and tuple(ids[:(k + 1) * bs]) in written:
            k += 1
        return k

    for n in range(300):
        prompt = [rng.randrange(2) for _ in range(rng.randint(1, 11))]
        want = expected_hits(prompt)
        assert p.cached_prefix_tokens(prompt) == want * bs, (prompt, sorted(written))
        blocks, keys = p._hits(prompt)
        assert keys == block_keys(prompt, bs)[:want], "the keys of the hits, in order"
        assert [p.pool.key_of(b) for b in blocks] == keys, "each hit is the block cached under its key"
        p.allocate(n, len(prompt), 4, token_ids=prompt)
        assert p.num_tokens(n) == want * bs and p.block_table(n)[:want] == blocks
        p.append_slots(n, len(prompt) - want * bs)
        p.commit_tokens(n, prompt[want * bs:])
        ids = list(prompt)
        for _ in range(rng.randint(0, 4)):
            ids.append(rng.randrange(2))
            p.append_slots(n, 1)
            p.commit_tokens(n, ids[-1:])
        written.update(tuple(ids[:(k + 1) * bs]) for k in range(len(ids) // bs))
        p.free(n)
        p.check_invariants()
    assert p.evictions == 0 and p.stats["hit_tokens"] > 300


def test_the_lookup_never_serves_the_last_prompt_token_and_stops_at_the_first_miss():
    bs = 4
    p = PrefixCachingPolicy(16 * bs, block_size=bs, max_model_len=64, watermark=0.0)
    ids = list(range(12))
    p.allocate("a", 12, 1, token_ids=ids)
    p.append_slots("a", 12)
    p.commit_tokens("a", ids)  # three full blocks cached
    assert p.cached_prefix_tokens(ids) == 8, "all 12 cached, but the last token's logits are needed"
    assert p.cached_prefix_tokens(ids + [99]) == 12
    assert p.cached_prefix_tokens(ids[:4] + [0, 0, 0, 0] + ids[8:] + [99]) == 4, "a miss ends the run"
    assert p.cached_prefix_tokens([77] + ids[1:] + [99]) == 0, "another first token: nothing"
    assert p.cached_prefix_tokens(ids[:3]) == 0 and p.cached_prefix_tokens([]) == 0
