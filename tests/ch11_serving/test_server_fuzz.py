"""Random request bodies, good and bad, at the real server (completions, chat, tokenize, detokenize):
every answer is a 200 or an OpenAI-shaped 400/404 (never a 500, never a hang), a bad one names a
field, and afterwards the engine holds nothing and still serves. Derandomized, so a failure
reproduces."""

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(-2**70, 2**70),
                st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.lists(st.integers(-1, 300),
                                                                                              max_size=3))
FIELDS = {
    "max_tokens": st.one_of(st.integers(1, 6), ODD),
    "temperature": st.one_of(st.floats(0, 2), ODD),
    "top_p": st.one_of(st.floats(0.01, 1), ODD),
    "top_k": st.one_of(st.integers(-1, 50), ODD),
    "n": st.one_of(st.integers(1, 3), ODD),
    "seed": st.one_of(st.integers(0, 2**32), ODD),
    "stop": st.one_of(st.text(min_size=1, max_size=3), st.lists(st.text(max_size=3), max_size=2), ODD),
    "logprobs": st.one_of(st.integers(0, 5), ODD),
    "min_tokens": st.one_of(st.integers(0, 3), ODD),
    "ignore_eos": st.one_of(st.booleans(), ODD),
    "stop_token_ids": st.one_of(st.lists(st.integers(0, 300), max_size=2), ODD),
    "stream": st.one_of(st.booleans(), ODD),
    "presence_penalty": st.one_of(st.just(0), st.floats(-3, 3), ODD),
    "logit_bias": st.one_of(st.dictionaries(st.sampled_from(["1", "258", "259", "x", "-1"]), st.floats(-200, 200),
                                            max_size=2), ODD),
    "model": st.one_of(st.just("tiny"), st.just("other"), ODD),
}
PROMPTS = st.one_of(st.text(max_size=12), st.lists(st.text(max_size=6), max_size=3),
                    st.lists(st.integers(-2, 300), max_size=6), st.lists(st.lists(st.integers(0, 258), max_size=4),
                                                                         max_size=2), ODD)


@pytest.mark.slow
def test_random_bodies_get_a_200_or_a_clear_error_and_leak_nothing(server):
    @settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(prompt=PROMPTS, fields=st.fixed_dictionaries({}, optional=FIELDS))
    def completions(prompt, fields):
        _check(server, {"prompt": prompt, **fields}, "/v1/completions")

    message = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), ODD)},
                                    optional={"content": st.one_of(st.text(max_size=8), ODD)})
    chat_fields = {**{k: v for k, v in FIELDS.items() if k != "logprobs"},
                   "logprobs": st.one_of(st.booleans(), ODD), "top_logprobs": st.one_of(st.integers(0, 3), ODD),
                   "max_completion_tokens": st.one_of(st.integers(1, 6), ODD)}

    @settings(max_examples=100, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(messages=st.one_of(st.lists(message, max_size=3), ODD),
           fields=st.fixed_dictionaries({}, optional=chat_fields))
    def chat(messages, fields):
        _check(server, {"messages": messages, **fields}, "/v1/chat/completions")

    @settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(body=st.one_of(
        st.fixed_dictionaries({"prompt": PROMPTS}, optional={"model": FIELDS["model"], "return_token_strs": ODD,
                                                             "add_special_tokens": ODD}),
        st.fixed_dictionaries({"messages": st.one_of(st.lists(message, max_size=2), ODD)},
                              optional={"add_generation_prompt": ODD, "continue_final_message": ODD}),
        st.fixed_dictionaries({"tokens": st.one_of(st.lists(st.integers(-2, 300), max_size=5), ODD)}),
    ))
    def tokenizer_routes(body):
        _check(server, body, "/detokenize" if "tokens" in body else "/tokenize")

    completions()
    chat()
    tokenizer_routes()
    assert server.wait_idle(), "a request was left running or blocks held"
    status, _ = server.post("/v1/completions", {"model": "tiny", "prompt": "still here", "max_tokens": 2})
    assert status == 200


def _check(server, body, path):
    status, answer = server.post(path, body)
    assert status in (200, 400, 404), (status, body, answer)
    if status != 200:
        error = answer["error"]
        assert error["type"] == "invalid_request_error" and error["message"], error
        if status == 404:
            assert error["param"] == "model"
    elif path == "/tokenize":
        assert answer["count"] == len(answer["tokens"]), answer
    elif path == "/detokenize":
        assert isinstance(answer["prompt"], str), answer
    elif body.get("stream") is True:
        assert answer["text"].rstrip().endswith("data: [DONE]"), answer["text"][-200:]
    else:
        assert answer["usage"]["completion_tokens"] >= 1
