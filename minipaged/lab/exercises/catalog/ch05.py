"""Chapter 05's graded exercises: reference counts, fork, and copy-on-write."""

from minipaged.lab.exercises.catalog import Exercise

T = "tests/ch05_copy_on_write/test_refcount_cow.py"
G = "tests/ch05_copy_on_write/test_graded_exercises.py"
P = "tests/ch05_copy_on_write/test_properties.py"

EXERCISES = [
    Exercise(
        id="05.1",
        title="RefCountedBlockPool.release: one holder fewer, free at zero",
        task="For each block in `blocks`, in order, drop one reference from self._refs[block]; when the count "
             "reaches zero, and only then, hand the block back to the free list through the parent class's "
             "release. A block whose count is already 0 must raise RuntimeError('block B is released twice') "
             "and must not go negative. Freeing a shared block too early would let a new sequence overwrite "
             "K/V that another sequence still reads.",
        hint="super().release([block]) puts one block at the end of the free list and marks it free; the same "
             "block may appear more than once in `blocks`.",
        tests=(f"{G}::test_release_frees_a_block_only_when_its_last_holder_lets_go",
               f"{G}::test_releasing_a_free_block_is_a_double_free_and_changes_nothing",
               f"{T}::test_pool_counts_references_and_frees_at_zero"),
        minutes=10,
    ),
    Exercise(
        id="05.2",
        title="SharedPolicy.fork: the child shares the parent's blocks",
        task="Give child_id a new BlockTable that starts where the parent is: the parent's prompt_len and "
             "num_tokens, its max_new_tokens and final_len unless the caller passed the child's own, and the "
             "parent's physical blocks, each with one more holder (self.pool.share). Store it in "
             "self._seqs[child_id]. No free block is taken and no "
             "K/V is copied; the child's table must still be a list of its own, or growing one sequence would "
             "grow the other.",
        hint="The parent's table is `parent` (already looked up). BlockTable(prompt_len, max_new_tokens, "
             "final_len, num_tokens=..., blocks=...); list(...) copies a list.",
        tests=(f"{G}::test_fork_takes_no_block_and_gives_the_child_the_parents_tokens",
               f"{G}::test_the_childs_table_is_a_list_of_its_own",
               f"{G}::test_the_child_keeps_its_own_future_or_inherits_the_parents",
               f"{G}::test_a_block_shared_by_a_fork_outlives_whichever_holder_goes_first"),
        minutes=15,
    ),
    Exercise(
        id="05.3",
        title="SharedPolicy._block_for_write: copy a shared block before writing",
        task="Return the physical block that a token written into logical block `logical_block` of `table` "
             "goes to. If that block has more than one holder (self.pool.ref_count), take a fresh block from "
             "self.pool, record the copy (old, fresh) at the end of self._copies for the engine, release this "
             "sequence's reference to the old block, put the fresh block in the table and count it in "
             "self.stats['cow_copies']. Otherwise write in place. No token may ever land in a block that "
             "another sequence holds: it would change what that sequence reads.",
        hint="The caller has already checked that a free block exists. Once the table points at the copy, "
             "the next tokens of the same block find count 1 and write in place: one copy per block, not per "
             "token.",
        tests=(f"{G}::test_every_writer_but_the_last_holder_copies_and_the_copies_are_recorded_in_order",
               f"{G}::test_a_write_of_several_tokens_copies_the_shared_block_once",
               f"{G}::test_an_unshared_block_is_written_in_place",
               f"{T}::test_write_into_a_shared_partly_filled_block_copies_it_first",
               f"{T}::test_copy_on_write_is_all_or_nothing_when_the_pool_is_dry",
               f"{T}::test_a_pending_copy_into_a_freed_block_is_dropped",
               f"{T}::test_fork_shares_every_block_and_copies_nothing",
               f"{T}::test_a_full_shared_block_is_never_copied",
               f"{T}::test_free_drops_one_reference_and_the_block_returns_at_zero",
               P),
        minutes=20,
    ),
]
