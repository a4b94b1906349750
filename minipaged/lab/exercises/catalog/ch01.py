"""Chapter 01's graded exercises: the holes between slabs, the reservation rules, the waste accounting."""

from minipaged.lab.exercises.catalog import Exercise

T = "tests/ch01_contiguous_cache/test_contiguous_arena.py"
G = "tests/ch01_contiguous_cache/test_graded_exercises.py"

EXERCISES = [
    Exercise(
        id="01.1",
        title="reservation_tokens: how much a request reserves (max, pow2, oracle)",
        task="Return the token slots a reserving policy sets aside when it admits a request. 'max': "
             "max_model_len, whatever the request. 'pow2': the next power of two of prompt_len + "
             "max_new_tokens, but never more than max_model_len. 'oracle': final_len, or prompt_len + "
             "max_new_tokens when final_len is None. Any other rule raises ValueError listing the choices in "
             "RESERVATION_RULES. Chapters 01-03 all size their reservations with this function.",
        hint="next_power_of_two(n) is defined just above; a number that is already a power of two stays "
             "as it is.",
        tests=(f"{T}::test_reservation_rules",
               f"{G}::test_reservation_tokens_by_rule"),
        minutes=15,
    ),
    Exercise(
        id="01.2",
        title="ContiguousArena.holes: the free gaps between slabs",
        task="Return the free regions of the arena as (start, size) pairs in address order: the gaps between "
             "the slabs in self._slabs (sorted (start, size) pairs), plus the gap before the first slab and the "
             "one after the last, up to self.num_slots. Never list a gap of size 0. First fit (_first_fit) "
             "scans this list from the front, so a missing, misplaced or out-of-order hole puts a slab on top "
             "of another one or refuses a request that fits.",
        hint="Walk the slabs with a cursor at the end of the previous slab (0 at first). You may keep the "
             "result in self._holes_cache: _place and _release set it back to None after every change.",
        tests=(f"{T}::test_first_fit_reuses_the_lowest_hole",
               f"{G}::test_holes_never_include_empty_gaps",
               f"{G}::test_holes_follow_every_change"),
        minutes=20,
    ),
    Exercise(
        id="01.3",
        title="KVPolicy.usage: split the pool into tokens, reserved, internal, external, free",
        task="Sum over the sequences in self._seqs: each one occupies self._occupied_slots(state) slots, of "
             "which state.num_tokens hold tokens, those up to the length it will reach (max of state.final_len "
             "and num_tokens, at most what it occupies) are reserved, and the rest are internal fragmentation. "
             "Every free slot is external when head is given and needs (self._slots_needed(*head)) more than "
             "self._largest_hole() but no more than all free slots; otherwise the free slots are free. Return "
             "a Usage; the five parts must always add up to self.num_slots.",
        hint="A sequence may hold more tokens than its final_len says: then nothing of it is reserved. "
             "The chapter's 'The waste, defined' section gives each term.",
        tests=(f"{T}::test_waste_accounting_by_hand",
               f"{T}::test_refused_although_total_free_memory_would_hold_it",
               f"{T}::test_random_operations_keep_the_invariants",
               f"{G}::test_usage_when_a_sequence_runs_past_its_final_length",
               f"{G}::test_usage_of_an_empty_arena",
               f"{G}::test_external_fragmentation_boundaries"),
        minutes=30,
    ),
]
