"""Chapter 03's graded exercises: the free list of blocks and the slot mapping."""

from minipaged.lab.exercises.catalog import Exercise

T = "tests/ch03_block_table/test_block_table.py"

EXERCISES = [
    Exercise(
        id="03.1",
        title="BlockPool: the free list (take and release)",
        task="Write BlockPool.take and BlockPool.release. take(n) hands out n blocks from the front of the free "
             "queue (self._free_queue), marks each one not free in self._is_free and returns them in the order "
             "taken; if fewer than n are free it raises NoFreeMemory and changes nothing. release(blocks) puts each "
             "block back at the end of the queue and marks it free, and raises RuntimeError('block B is released "
             "twice') for a block that is free already: a double free would later let two sequences write their "
             "K/V into the same block.",
        hint="Check the count before you pop anything (deque.popleft takes from the front). self._is_free answers "
             "'is it free already?' in O(1), so release needs no search of the queue.",
        tests=(f"{T}::test_block_pool_is_all_or_nothing_and_catches_double_frees",
               f"{T}::test_check_invariants_catches_a_block_in_two_tables"),
        minutes=20,
    ),
    Exercise(
        id="03.2",
        title="append_slots: the slot mapping through the block table",
        task="Return the physical slot of each of the n new token positions p = num_tokens ... num_tokens + n - 1, "
             "then count them in table.num_tokens. Position p lives in logical block p // block_size at offset "
             "p % block_size, and its slot is (physical block) * block_size + offset. Ask "
             "self._block_for_write(seq_id, table, logical_block) for the physical block: chapter 05 copies a "
             "shared block there before anyone writes into it.",
        hint="The table has room already: the lines above grew it if it needed to. One list comprehension over "
             "range(table.num_tokens, table.num_tokens + n) does it.",
        tests=(f"{T}::test_slot_mapping_follows_the_table",
               f"{T}::test_scattered_free_blocks_serve_a_request_that_fixed_blocks_refused",
               f"{T}::test_the_reservation_remains",
               f"{T}::test_random_operations_keep_the_invariants"),
        minutes=20,
    ),
]
