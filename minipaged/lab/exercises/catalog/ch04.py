"""Chapter 04's graded exercises: the admission watermark, and growing a block table as tokens arrive."""

from minipaged.lab.exercises.catalog import Exercise

T = "tests/ch04_on_demand_allocation/test_on_demand.py"
G = "tests/ch04_on_demand_allocation/test_graded_exercises.py"

EXERCISES = [
    Exercise(
        id="04.1",
        title="OnDemandPolicy._fits_now: admit the prompt, keep the watermark free",
        task="Say whether a new request whose prompt needs `slots` slots (whole blocks) may be admitted now. "
             "When no sequence runs, it fits if its blocks are free (self.pool.num_free). Otherwise at least "
             "self.watermark_blocks blocks must still be free after taking them: they are kept for the "
             "running sequences to grow into, so that admitting one more request does not force a preemption "
             "at the next step.",
        hint="Work in blocks: slots // self.block_size. self._seqs is empty when nothing runs.",
        tests=(f"{T}::test_the_watermark_keeps_blocks_for_running_sequences",
               f"{G}::test_admission_keeps_the_watermark_free"),
        minutes=10,
    ),
    Exercise(
        id="04.2",
        title="OnDemandPolicy._grow: more blocks for a table, all or nothing",
        task="Add num_blocks free blocks from self.pool to the end of table.blocks. If fewer are free, raise "
             "NoFreeMemory('seq S needs N more block(s) for its next tokens; F free') before changing "
             "anything: the caller then preempts someone and tries again, which only works if the failed "
             "attempt took no block. Growth ignores the watermark: it is kept for exactly this.",
        hint="self.pool.num_free says how many are free; self.pool.take(n) returns n blocks in order.",
        tests=(f"{T}::test_admission_takes_the_prompt_blocks_and_tables_grow_one_block_at_a_time",
               f"{T}::test_no_free_block_raises_and_changes_nothing",
               f"{T}::test_random_operations_keep_the_invariants",
               f"{G}::test_growing_by_several_blocks_is_all_or_nothing",
               f"{G}::test_a_table_grows_by_exactly_the_missing_blocks",
               f"{G}::test_running_sequences_may_grow_into_the_watermark"),
        minutes=15,
    ),
]
