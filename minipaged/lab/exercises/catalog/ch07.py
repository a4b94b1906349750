"""Chapter 07's graded exercises: block keys, the LRU list of cached blocks, the prefix lookup."""

from minipaged.lab.exercises.catalog import Exercise

T = "tests/ch07_prefix_caching/test_block_cache.py"
G = "tests/ch07_prefix_caching/test_graded_exercises.py"
P = "tests/ch07_prefix_caching/test_properties.py"

EXERCISES = [
    Exercise(
        id="07.1",
        title="block_keys: name each full block by its whole prefix",
        task="Return the keys of the full blocks of token_ids, from block `start` on, where `parent` is the key "
             "of block start-1 (None when start is 0). Each key chains its parent's key with the block's own "
             "tokens (next_key does one link), so two blocks get equal keys only when everything up to their "
             "end is equal; a last block with fewer than block_size tokens gets no key, since it may still "
             "change.",
        hint="Loop i from start to len(token_ids) // block_size; the key you just made is the parent of the "
             "next one.",
        tests=(f"{T}::test_a_key_names_the_block_and_everything_before_it",
               "tests/ch07_prefix_caching/test_notebook.py::test_notebook_block_keys_match_the_package",
               f"{G}::test_block_keys_name_only_the_full_blocks",
               f"{G}::test_equal_keys_mean_equal_whole_prefixes",
               f"{G}::test_block_keys_resume_from_a_parent_and_grow_with_the_sequence"),
        minutes=15,
    ),
    Exercise(
        id="07.2",
        title="PrefixBlockPool: the LRU list of cached blocks (take and release)",
        task="Write take and release. take(n) (the lines above have checked that n fit) hands out plain free "
             "blocks first, with the parent class's take; only when they run out it evicts cached blocks from "
             "the front of self._evictable, the least recently used. An evicted block loses its key in both "
             "self._block_of and self._key_of, gets a reference count of 1 and counts in self.evictions: a key "
             "left behind would make a later lookup hand out a block that now holds someone else's K/V. "
             "release drops one holder of each block, raising RuntimeError('block B is released twice') for a "
             "block with none. A cached block (it has a key in self._key_of) whose last holder leaves is not "
             "wiped: its count goes to 0 and it goes to the back of self._evictable, so that it stays findable "
             "and is evicted last. Every other block goes through the parent class's release.",
        hint="super().num_free counts only the plain free blocks; OrderedDict.popitem(last=False) removes the "
             "oldest entry and assigning a new key adds it at the end. In release the cached case is "
             "self._refs[block] == 1 and block in self._key_of.",
        tests=(f"{T}::test_the_pool_alone",
               f"{G}::test_take_uses_plain_free_blocks_before_evicting_anything",
               f"{G}::test_take_evicts_the_least_recently_released_cached_block_first",
               f"{G}::test_take_mixes_plain_and_evicted_blocks_in_one_call",
               f"{G}::test_release_puts_a_block_at_the_back_of_the_eviction_order",
               f"{G}::test_release_keeps_a_cached_block_findable_on_the_lru_list"),
        minutes=35,
    ),
    Exercise(
        id="07.3",
        title="PrefixCachingPolicy._hits: the longest cached prefix of a prompt",
        task="Walk token_ids block by block from the start, making each full block's key from the previous "
             "one (next_key), and ask self.pool.lookup for it; stop at the first miss, since a block after a "
             "miss was computed after other tokens. Return the blocks found and their keys, in order. Never "
             "look at the block that holds the last token: allocate counts the hits as computed, and the "
             "last prompt token must be computed for its logits.",
        hint="At most (len(token_ids) - 1) // self.block_size blocks can hit.",
        tests=(f"{T}::test_a_finished_request_leaves_its_full_blocks_findable",
               f"{T}::test_a_sequence_gives_back_its_last_block_first",
               f"{T}::test_a_hit_on_an_evictable_block_takes_it_off_the_lru_list",
               f"{T}::test_cached_blocks_are_evicted_least_recently_used_first",
               f"{T}::test_swapped_tables_keep_their_tokens_and_come_back_findable",
               f"{G}::test_a_freed_sequence_leaves_its_full_blocks_cached_and_its_partial_block_plain",
               P,
               f"{T}::test_the_last_prompt_token_is_always_computed",
               f"{T}::test_only_an_unbroken_run_from_the_first_block_hits",
               f"{T}::test_a_hit_on_blocks_held_by_others_needs_less_free_memory",
               f"{T}::test_a_prompt_admitted_in_the_same_step_finds_the_blocks_promised_before_it",
               f"{G}::test_the_lookup_finds_the_longest_cached_prefix_of_whole_blocks",
               f"{G}::test_the_lookup_never_serves_the_last_prompt_token_and_stops_at_the_first_miss"),
        minutes=20,
    ),
]
