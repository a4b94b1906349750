"""Chapter 08's graded exercises: the chunk planner and the chunked pass over the running requests."""

from minipaged.lab.exercises.catalog import Exercise

G = "tests/ch08_chunked_prefill/test_graded_exercises.py"
P = "tests/ch08_chunked_prefill/test_properties.py"
N = "tests/ch08_chunked_prefill/test_notebook.py::test_notebook_planner_matches_the_scheduler"

EXERCISES = [
    Exercise(
        id="08.1",
        title="ChunkedPrefillScheduler._chunks: cut the uncached tokens to fit the budget",
        task="Return (seq_id, n) for the request's sequences in order, where n is the number of the sequence's "
             "tokens that have no K/V yet (seq.num_tokens minus self.policy.num_tokens(seq_id)), cut to what "
             "is left of `budget`; each chunk uses up its share of the budget. Leave out a sequence that would "
             "get 0 tokens. Only plan here, hand out no slots: the step must never compute more than the "
             "budget, and a chunk that is not the whole rest of the prompt samples nothing.",
        hint="min(uncached, budget) per sequence, then subtract it from budget.",
        tests=(f"{G}::test_chunks_give_each_sequence_its_uncached_tokens_while_the_budget_lasts",),
        minutes=15,
    ),
    Exercise(
        id="08.2",
        title="ChunkedPrefillScheduler._schedule_running: decodes first, then a chunk of the prompt",
        task="Plan the running requests in two passes, oldest first, after setting self._chunk_waits = False. "
             "Pass 1: each decoding request (self._decoding) gets one token per sequence through the parent "
             "class's _plan, whatever the budget; when the policy cannot append them (can_append_all of "
             "self._appends(request)), preempt the newest running request "
             "(self._preempt(self.running.pop(), plan)) and try again. Pass 2, while self._budget_left(plan) > 0: "
             "each request part-way through its prompt gets its next chunk (self._chunks, then self._plan) if "
             "the policy can append it; if it cannot, then with "
             "other work in the plan set self._chunk_waits = True and stop (new requests must not jump ahead of "
             "it), and with none preempt the newest.",
        hint="A request planned in pass 1 has nothing left for _chunks, so pass 2 skips it; the newest request "
             "sits at or after index i, so popping it never removes a request you have planned.",
        tests=(f"{G}::test_decodes_come_first_and_the_prompt_gets_what_the_budget_has_left",
               f"{G}::test_a_long_prompt_is_cut_into_budget_sized_chunks",
               f"{G}::test_every_running_decode_is_planned_even_past_the_budget",
               f"{G}::test_a_chunk_that_must_wait_for_memory_holds_back_new_requests",
               f"{G}::test_a_lone_chunk_without_memory_is_preempted_as_in_chapter_06",
               N, P),
        minutes=40,
    ),
]
