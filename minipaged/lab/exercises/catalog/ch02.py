"""Chapter 02's graded exercises: runs of free blocks, and a run taken from and put back in the free list."""

from minipaged.lab.exercises.catalog import Exercise

T = "tests/ch02_fixed_blocks/test_fixed_blocks.py"
G = "tests/ch02_fixed_blocks/test_graded_exercises.py"

EXERCISES = [
    Exercise(
        id="02.1",
        title="FixedBlockPolicy.free_runs: runs of consecutive free blocks",
        task="Return the runs of consecutive free blocks as (first_block, length) pairs in address order, "
             "read from the sorted free list self._free. Two neighbouring free blocks always belong to the "
             "same run: a run split in two makes first fit (_first_fit) refuse a request that fits, and "
             "makes the external fragmentation look larger than it is.",
        hint="One pass over self._free: a block either extends the last run (it comes right after its end) or "
             "starts a new one. You may keep the result in self._runs_cache; _place and _release reset it.",
        tests=(f"{G}::test_free_runs_of_a_free_list_set_by_hand",),
        minutes=15,
    ),
    Exercise(
        id="02.2",
        title="FixedBlockPolicy._place and _release: a run out of the free list and back",
        task="Write _place and _release. _place turns the reservation (slots, always whole blocks) into a block "
             "count, finds the lowest run long enough with self._first_fit, removes exactly those blocks from "
             "the sorted free list self._free and returns a BlockRun with the state's prompt_len, "
             "max_new_tokens, final_len and the run's first_block and num_blocks. _release gives the run's "
             "blocks back to self._free so that it stays sorted, every block once. Both reset "
             "self._runs_cache. A block left in the free list while a sequence owns it is handed out twice; a "
             "block missing from it leaks; a free list out of order breaks free_runs and so first fit.",
        hint="A run's blocks sit next to each other in the sorted free list too: bisect_left finds where the run "
             "starts (or where a released run goes), and one slice deletion (or assignment) does the rest.",
        tests=(f"{T}::test_slots_follow_the_run_of_blocks",
               f"{T}::test_first_fit_run_and_refusal_despite_enough_free_blocks",
               f"{T}::test_random_operations_keep_the_invariants",
               f"{G}::test_free_runs_split_and_merge",
               f"{G}::test_free_runs_of_single_blocks",
               f"{G}::test_place_takes_the_first_run_that_is_long_enough",
               f"{G}::test_place_can_split_a_run_in_the_middle_of_the_free_list",
               f"{G}::test_release_puts_the_run_back_in_order"),
        minutes=30,
    ),
]
