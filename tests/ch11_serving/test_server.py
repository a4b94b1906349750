"""The server through the official ``openai`` client, against a real server in a child process
(conftest.py): the same answers as offline ``generate``, streaming, n and seeds, logprobs, the
prefix cache in ``usage``, errors, many clients at once, hang-ups, the API key and the shutdown."""

import asyncio
import json
import time

import pytest

from minipaged import SamplingParams
from minipaged.lab.server_process import ServerProcess

openai = pytest.importorskip("openai")

PROMPTS = ["The cat sat on", "Paging splits memory into blocks", "Once upon a time"]
GREEDY = dict(temperature=0, max_tokens=24)


def joined(stream):
    """{choice index: (text, [finish reasons])} of a completions or chat stream, and the usage chunk;
    asserts that every chunk carries text, a finish reason, or (chat) the assistant's role."""
    texts, reasons, usage = {}, {}, None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
        for c in chunk.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            opens_chat = not hasattr(c, "text") and c.delta.role == "assistant"
            assert piece or c.finish_reason is not None or opens_chat, f"a chunk with nothing in it: {chunk}"
            texts[c.index] = texts.get(c.index, "") + piece
            if c.finish_reason is not None:
                reasons.setdefault(c.index, []).append(c.finish_reason)
    return texts, reasons, usage


# ---------------------------------------------------------------- the same answers as offline


def test_completions_equal_offline_generate_at_temperature_0(client, offline):
    ids = offline.tokenizer.encode("A prompt given as token ids")
    out = client.completions.create(model="tiny", prompt=PROMPTS, **GREEDY)
    expected = offline.generate(PROMPTS, SamplingParams(**GREEDY), use_tqdm=False)
    assert [c.text for c in out.choices] == [o.outputs[0].text for o in expected]
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in expected)
    assert out.usage.completion_tokens == sum(len(o.outputs[0].token_ids) for o in expected)
    by_ids = client.completions.create(model="tiny", prompt=ids, **GREEDY)
    offline_ids = offline.generate([ids], SamplingParams(**GREEDY), use_tqdm=False)[0]
    assert by_ids.choices[0].text == offline_ids.outputs[0].text


def test_chat_equals_offline_chat(client, offline):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a KV cache?"}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=20, temperature=0)
    expected = offline.chat(messages, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0]
    assert out.choices[0].message.content == expected.outputs[0].text
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == expected.outputs[0].finish_reason
    assert out.usage.completion_tokens == len(expected.outputs[0].token_ids)


def test_streamed_deltas_join_to_the_whole_text_with_stop_strings(client):
    whole = client.completions.create(model="tiny", prompt=PROMPTS[1], temperature=0, max_tokens=40).choices[0].text
    stop = whole[12:14]  # a string the greedy output contains: the answer must end before it
    assert len(stop) == 2 and stop in whole
    cut = client.completions.create(model="tiny", prompt=PROMPTS[1], temperature=0, max_tokens=40, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and stop not in cut.choices[0].text
    for kwargs in ({}, {"stop": [stop]}):
        plain = client.completions.create(model="tiny", prompt=PROMPTS[1], temperature=0, max_tokens=40, **kwargs)
        texts, reasons, usage = joined(client.completions.create(
            model="tiny", prompt=PROMPTS[1], temperature=0, max_tokens=40, stream=True,
            stream_options={"include_usage": True}, **kwargs))
        assert texts[0] == plain.choices[0].text
        assert reasons == {0: [plain.choices[0].finish_reason]}  # exactly one chunk carries it
        assert usage.completion_tokens == plain.usage.completion_tokens
    chat = dict(model="tiny", messages=[{"role": "user", "content": "hello"}], temperature=0, max_tokens=30)
    texts, reasons, _ = joined(client.chat.completions.create(stream=True, **chat))
    assert texts[0] == client.chat.completions.create(**chat).choices[0].message.content
    assert len(reasons[0]) == 1


def test_n_and_seed_give_offline_samples_and_interleave_when_streamed(client, offline):
    params = dict(temperature=0.9, top_p=0.95, max_tokens=16, seed=7)
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], n=3, **params)
    expected = offline.generate(PROMPTS[0], SamplingParams(n=3, **params), use_tqdm=False)[0]
    assert [c.text for c in out.choices] == [c.text for c in expected.outputs]
    assert len({c.text for c in out.choices}) > 1, "three samples at temperature 0.9 should differ"
    again = client.completions.create(model="tiny", prompt=PROMPTS[0], n=3, **params)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # same seed, same text

    order = []
    texts, reasons = {}, {}
    for chunk in client.completions.create(model="tiny", prompt=PROMPTS[:2], n=2, stream=True, **params):
        for c in chunk.choices:
            order.append(c.index)
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                reasons.setdefault(c.index, []).append(c.finish_reason)
    assert sorted(set(order)) == [0, 1, 2, 3]  # prompt by prompt, n each
    assert order != sorted(order), "the choices should interleave as the engine steps them together"
    assert all(len(r) == 1 for r in reasons.values()) and len(reasons) == 4
    plain = client.completions.create(model="tiny", prompt=PROMPTS[:2], n=2, **params)
    assert [texts[i] for i in range(4)] == [c.text for c in plain.choices]


def test_penalties_and_logit_bias_give_offline_tokens_in_vllms_dialect(client, offline):
    """presence/frequency (OpenAI's), repetition (vLLM's extra field) and logit_bias with string keys,
    through the official client, equal the same SamplingParams offline; the bias really steers."""
    bias = {"5": 8.0, "9": 8.0, "12": 8.0}  # pushed up, then pushed down as each repeats
    params = dict(temperature=0.0, max_tokens=12, presence_penalty=0.2, frequency_penalty=0.3)
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], logit_bias=bias, **params,
                                    extra_body={"repetition_penalty": 1.1, "ignore_eos": True})
    expected = offline.generate(PROMPTS[0], SamplingParams(repetition_penalty=1.1, ignore_eos=True,
                                                           logit_bias={int(k): v for k, v in bias.items()}, **params),
                                use_tqdm=False)[0].outputs[0]
    assert out.choices[0].text == expected.text
    assert set(expected.token_ids) == {5, 9, 12}
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          logit_bias={"7": 100.0}, max_tokens=3)
    assert chat.choices[0].message.content == offline.tokenizer.decode([7, 7, 7])


def test_an_extreme_repetition_penalty_is_served_beside_the_others(client, async_client):
    """vLLM takes any repetition penalty above 0. 1e300 used to make a logit infinite and the sampler
    fail, which failed the engine step, and with it every request in flight (each got a 500)."""

    async def both():
        async with async_client() as c:
            long = c.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=40,
                                        extra_body={"ignore_eos": True})
            extreme = c.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, seed=1,
                                           extra_body={"repetition_penalty": 1e300, "ignore_eos": True})
            return await asyncio.gather(long, extreme)

    long, extreme = asyncio.run(both())
    assert [long.choices[0].finish_reason, extreme.choices[0].finish_reason] == ["length", "length"]
    assert long.usage.completion_tokens == 40 and extreme.usage.completion_tokens == 4


def test_logprobs_match_the_engine(client, offline):
    out = client.completions.create(model="tiny", prompt=PROMPTS[2], temperature=0, max_tokens=8, logprobs=3)
    expected = offline.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=8, logprobs=3),
                                use_tqdm=False)[0].outputs[0]
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == len(expected.token_ids) == 8
    for got, step, token in zip(lp.token_logprobs, expected.logprobs, expected.token_ids):
        assert got == pytest.approx(step[token], abs=1e-5)
    assert all(len(top) <= 3 for top in lp.top_logprobs)
    assert all(max(top.values()) >= got - 1e-6 for top, got in zip(lp.top_logprobs, lp.token_logprobs))

    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)  # greedy: the top one


def test_usage_reports_prefix_cache_hits(client):
    prompt = "A long shared system prompt that fills several KV blocks of sixteen tokens each, " * 2
    first = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=2)
    second = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16 * (first.usage.prompt_tokens // 16 - 1) and cached % 16 == 0


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("fields, param, words", [
    ({"top_p": 2}, "top_p", "(0, 1]"),
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"temperature": -1}, "temperature", ">= 0"),
    ({"n": 0}, "n", ">= 1"),
    ({"n": 65}, "n", "max_num_seqs"),
    ({"stop": [""]}, "stop", "non-empty"),
    ({"logprobs": -1}, "logprobs", ">= 0"),
    ({"logprobs": 21}, "logprobs", "[0, 20]"),
    ({"max_tokens": 10_000_000}, "max_tokens", "leaves room for at most 510 new ones"),
    ({"max_tokens": "many"}, "max_tokens", "integer"),
    ({"prompt": ""}, "prompt", "empty"),
    ({"prompt": [1, 2, 999999]}, "prompt", "vocabulary"),
    ({"prompt": "x" * 600}, "prompt", "max_model_len"),
    ({"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
    ({"frequency_penalty": -3.0}, "frequency_penalty", "[-2, 2]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", "> 0"),
    ({"logit_bias": {"abc": 1.0}}, "logit_bias", "token ids"),
    ({"logit_bias": {"999999": 1.0}}, "logit_bias", "[0, 259)"),
    ({"logit_bias": {"5": 1.0, "05": -1.0}}, "logit_bias", "token 5 is named more than once"),
    ({"logit_bias": {str(i): 1.0 for i in range(10_000)}}, "logit_bias", "... 9733 more} is not allowed"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids", "[0, 259)"),
    ({"seed": -5}, "seed", "greater than or equal to 0"),
])
def test_a_bad_field_is_a_400_naming_it(client, fields, param, words):
    body = {"model": "tiny", "prompt": "hi", **fields}
    extra = {k: body.pop(k) for k in ("stop_token_ids", "repetition_penalty") if k in body}
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**body, extra_body=extra)
    error = e.value.body
    assert e.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"], error


def test_chat_errors(client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       logprobs=True, top_logprobs=21)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny", messages=[])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.body["param"] == "messages[0].role" and "'user'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="disagree"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                       max_completion_tokens=4)


def test_unknown_model_oversized_body_and_bad_json(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="hi")
    assert e.value.body["code"] == "model_not_found" and "tiny" in e.value.body["message"]
    # an oversized body is refused on its Content-Length, before the server reads it
    import http.client
    from urllib.parse import urlparse

    address = urlparse(server.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    connection.putrequest("POST", "/v1/completions")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(5 * 2**20))
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and json.loads(response.read())["error"]["code"] == "request_too_large"
    connection.close()
    # and one sent in chunks with no Content-Length: counted as it arrives
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    pieces = (b"x" * 2**20 for _ in range(5))
    connection.request("POST", "/v1/completions", body=pieces, headers={"Content-Type": "application/json"},
                       encode_chunked=True)
    assert connection.getresponse().status == 413
    connection.close()
    status, body = server.post("/v1/completions", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"], body
    status, body = server.post("/v1/completions", b"[1, 2]")
    assert status == 400 and "must be a JSON object" in body["error"]["message"], body
    status, models = server.get("/v1/models")
    card = json.loads(models)["data"][0]
    assert status == 200 and card["id"] == "tiny"
    assert 1_700_000_000 < card["created"] <= time.time(), card  # when it was served, in seconds (vLLM's field)
    assert client.completions.create(model="tiny", prompt="still serving", max_tokens=2).choices[0].text is not None
    assert server.wait_idle()


def test_tokenize_and_detokenize_speak_vllms_shapes(server, client, offline):
    tokenizer = offline.get_tokenizer()
    status, body = server.post("/tokenize", {"model": "tiny", "prompt": "Paging splits memory"})
    assert status == 200 and body["tokens"] == tokenizer.encode("Paging splits memory")
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 512 and body["token_strs"] is None
    status, strs = server.post("/tokenize", {"prompt": "Hi", "return_token_strs": True})
    assert strs["token_strs"] == ["H", "i"]
    # the chat form counts exactly the prompt tokens a chat completion is billed for
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a block?"}]
    status, chat = server.post("/tokenize", {"model": "tiny", "messages": messages})
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert status == 200 and chat["count"] == reply.usage.prompt_tokens
    status, back = server.post("/detokenize", {"model": "tiny", "tokens": chat["tokens"]})
    assert status == 200 and back["prompt"] == tokenizer.apply_chat_template(messages, True)
    for route, bad, param in (("/tokenize", {"prompt": 5}, "prompt"),
                              ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
                              ("/tokenize", {"prompt": "x", "model": "gpt-4"}, "model"),
                              ("/detokenize", {"tokens": [72, 10**6]}, "tokens"),
                              ("/detokenize", {"tokens": "72"}, "tokens")):
        status, error = server.post(route, bad)
        assert status in (400, 404) and error["error"]["param"] == param, (route, bad, error)


# ---------------------------------------------------------------- many clients, hang-ups, metrics


def test_32_concurrent_streaming_clients_all_finish(server, async_client):
    async def one(client, i):
        texts, reasons, tokens = "", [], 0
        stream = await client.completions.create(model="tiny", prompt=f"client {i} says", max_tokens=20 + i,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                texts += c.text
                if c.finish_reason:
                    reasons.append(c.finish_reason)
        return reasons, tokens

    async def main():
        client = async_client()
        try:
            return await asyncio.gather(*(one(client, i) for i in range(32)))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert [r for r, _ in results] == [["length"]] * 32
    assert [t for _, t in results] == [20 + i for i in range(32)]
    assert server.wait_idle()


def test_hang_ups_abort_their_requests_and_free_their_blocks(server, async_client):
    async def leave(client, i, after):
        stream = await client.completions.create(model="tiny", prompt=f"leaving {i}", max_tokens=400,
                                                 stream=True, extra_body={"ignore_eos": True})
        got = 0
        async for _ in stream:
            got += 1
            if got >= after:
                break
        await stream.close()  # hang up mid-stream
        return got

    async def main():
        client = async_client()
        try:
            streamed = await asyncio.gather(*(leave(client, i, 3 + i) for i in range(8)))
            # and a non-streaming request whose client gives up once the server is working on it (not
            # after a fixed time: the tiny model can make its 450 tokens in a fifth of a second)
            assert await asyncio.to_thread(server.wait_idle)
            waiting = asyncio.create_task(client.completions.create(
                model="tiny", prompt="waiting", max_tokens=450, extra_body={"ignore_eos": True}))
            while server.metric("num_requests_running") < 1:
                assert not waiting.done(), "the request ended before the server reported it running"
                await asyncio.sleep(0.002)
            waiting.cancel()  # the client hangs up
            with pytest.raises(asyncio.CancelledError):
                await waiting
            return streamed
        finally:
            await client.close()

    aborted_before = server.metric("num_requests_aborted_total")
    assert asyncio.run(main()) == [3 + i for i in range(8)]
    assert server.wait_idle(), "a hang-up left a request running or blocks held"
    assert server.metric("num_requests_aborted_total") - aborted_before == 9


def test_metrics_use_vllm_names_with_a_model_label(server, client):
    client.completions.create(model="tiny", prompt="count me", max_tokens=3)
    _, text = server.get("/metrics")
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "request_success_total", "num_preemptions_total",
                 "time_to_first_token_seconds_count", "inter_token_latency_seconds_bucket",
                 "e2e_request_latency_seconds_sum", "prefix_cache_queries_total", "prefix_cache_hits_total"):
        assert f'minipaged:{name}{{' in text, name
    assert 'model_name="tiny"' in text and '# TYPE minipaged:time_to_first_token_seconds histogram' in text
    assert server.metric("generation_tokens_total") >= 3
    assert server.get("/health")[0] == 200


# ---------------------------------------------------------------- the API key and the shutdown


def test_the_api_key_is_required_when_given():
    with ServerProcess("tiny", "--api-key", "sesame") as server:
        with pytest.raises(openai.AuthenticationError) as e:
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
        assert e.value.status_code == 401
        status, body = server.post("/v1/completions", {"model": "tiny", "prompt": "hi"})
        assert status == 401 and body["error"]["type"] == "authentication_error"
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
        assert good.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
        # as vLLM's: health checks and Prometheus scrapers need no key; the dashboard's data and
        # the tokenizer routes do
        assert server.get("/metrics")[0] == 200 and server.get("/health")[0] == 200
        assert server.get("/dashboard/state")[0] == 401
        assert server.get("/dashboard/state", {"Authorization": "Bearer sesame"})[0] == 200
        assert server.post("/tokenize", {"prompt": "hi"})[0] == 401
    assert server.returncode == 0


def test_sigterm_aborts_what_runs_frees_everything_and_exits_0():
    import threading

    server = ServerProcess("smollm2-135m-random", "--max-model-len", "512").start()  # real shapes: ~50 ms a step
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    seen, done = [], threading.Event()

    def stream():
        for chunk in client.completions.create(model="smollm2-135m-random", prompt="a long answer", max_tokens=480,
                                               stream=True,
                                               extra_body={"ignore_eos": True}):
            seen.extend(c.finish_reason for c in chunk.choices if c.finish_reason)
            if not done.is_set():
                done.set()
        done.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert done.wait(30), "the stream never started"
    assert server.stop() == 0, server.log
    reader.join(30)
    assert seen == ["abort"], seen  # 480 tokens take half a minute: the signal came first
    assert "every KV block is back in the pool" in server.log
