"""Chapter 09's graded exercises: checking a draft against the model, and prompt lookup."""

from minipaged.lab.exercises.catalog import Exercise

PARTS = "tests/ch09_speculative_decoding/test_parts.py"
GRADED = "tests/ch09_speculative_decoding/test_graded_exercises.py"

EXERCISES = [
    Exercise(
        id="09.1",
        title="verify: keep the agreeing guesses, then one token of the model's own",
        task="Walk the draft in order: for row j call emit(j), which appends the model's own token for that row "
             "and returns (token, finished). Go on while that token equals the guess draft[j] and the sequence "
             "is not finished; at the first disagreement, or as soon as it finishes, stop and return how many "
             "tokens were emitted. If every guess was right, emit row len(draft) too (the bonus token) and return "
             "len(draft) + 1. Never ask for a row past the first disagreement: it was computed on a wrong guess, "
             "and its token would differ from what plain greedy decoding gives.",
        hint="The token emitted at a disagreement is the correction: it counts. An empty draft is plain decoding: "
             "emit(0) once and return 1.",
        tests=(f"{GRADED}::test_verify_asks_for_the_rows_in_order_and_stops_at_the_first_disagreement",
               f"{GRADED}::test_verify_stops_as_soon_as_the_sequence_finishes",
               f"{GRADED}::test_accepted_tokens_are_the_longest_agreeing_prefix_and_one_more",
               f"{GRADED}::test_speculative_decoding_gives_the_tokens_of_plain_decoding",
               f"{PARTS}::test_greedy_acceptance_keeps_the_agreeing_prefix_and_one_more",
               f"{PARTS}::test_verify_stops_when_the_sequence_finishes",
               "tests/ch09_speculative_decoding/test_properties.py"),
        minutes=15,
    ),
    Exercise(
        id="09.2",
        title="propose_ngram: prompt lookup, longest match first, most recent place",
        task="Return up to k tokens copied from what followed an earlier occurrence of the sequence's last n "
             "tokens. Try n from max_n down to min_n, but never more than len(token_ids) - 1: an earlier "
             "occurrence starts before the tail does, so at least one token follows it. For the first n that "
             "matches anywhere, take the most recent earlier occurrence and return the tokens after it (at most "
             "k, fewer where the sequence ends). No match for any n: return []. Leave token_ids unchanged (it "
             "may be a tuple).",
        hint="Work on list(token_ids). Scan the start of a candidate from len(ids) - n - 1 down to 0 and compare "
             "slices with ids[-n:]: the first hit is the most recent.",
        tests=(f"{PARTS}::test_prompt_lookup_copies_what_followed_the_last_tokens_before",
               f"{PARTS}::test_prompt_lookup_prefers_longer_matches_then_the_most_recent",
               f"{GRADED}::test_prompt_lookup_edge_cases",
               f"{GRADED}::test_prompt_lookup_takes_any_sequence_and_leaves_it_alone",
               "tests/ch09_speculative_decoding/test_notebook.py::test_notebook_prompt_lookup_matches_the_package"),
        minutes=25,
    ),
]
