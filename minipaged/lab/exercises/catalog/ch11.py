"""Chapter 11's graded exercises: the serving mechanism itself, what a stream may show and how it is
framed. The stream's tests run a real server in a child process (tests/ch11_serving/conftest.py)."""

from minipaged.lab.exercises.catalog import Exercise

DETOK = "tests/ch06_continuous_batching/test_detokenizer.py"
ONLINE = "tests/ch06_continuous_batching/test_online_engine.py"
SERVER = "tests/ch11_serving/test_server.py"

EXERCISES = [
    Exercise(
        id="11.1",
        title="IncrementalDetokenizer: what a stream may show, and the deltas",
        task="Write IncrementalDetokenizer._stream_len and delta. _stream_len says how many characters of "
             "self.text a client may see now: all of them once the sequence is finished; before that, the "
             "committed text (self._committed: never a trailing partial character) less the last "
             "self.hold_back characters, which a stop string found later could still cut away (never below "
             "0). delta() returns the streamable text added since its last call (self._sent counts what was "
             "returned) and must never take back text it returned: joined, the deltas equal the final text.",
        hint="delta() reads from self.text once finished (the final cut) and from self._committed before. "
             "An assertion that the new end is not below self._sent catches a rule that shrinks.",
        tests=(f"{DETOK}::test_hold_back_and_partial_characters",
               f"{DETOK}::test_random_bytes_text_matches_full_decode",
               f"{DETOK}::test_random_stop_strings_never_stream_past_the_cut",
               f"{ONLINE}::test_streamed_deltas_join_to_the_final_text_with_stop_strings"),
        minutes=25,
    ),
    Exercise(
        id="11.2",
        title="The server's stream: one event per choice that has something new",
        task="In _stream's events(), for each choice c of prompt i in an engine output, send at most one "
             "server-sent event (yield sse(chunk(i, c))). Its index in the reply is i * n + c.index. A choice "
             "whose finish_reason was sent gets nothing more. Count len(c.token_ids) into completion_tokens "
             "(the usage chunk reports it). A choice with a finish_reason is sent, and remembered in "
             "`finished`; a choice with no new text is skipped, unless logprobs were asked for and it has "
             "new tokens. So every chunk shows something, and each choice carries exactly one finish_reason.",
        hint="The deltas come from the engine (RequestOutputKind.DELTA): this loop only decides which become "
             "events. `finished` is a set of reply indices.",
        tests=(f"{SERVER}::test_streamed_deltas_join_to_the_whole_text_with_stop_strings",
               f"{SERVER}::test_n_and_seed_give_offline_samples_and_interleave_when_streamed",
               f"{SERVER}::test_32_concurrent_streaming_clients_all_finish"),
        minutes=25,
    ),
]
