"""Every numeric field at the edges of its range and one step past them: the edge is served, one past is
refused before any work starts, with a ValueError (offline) or a 400 (the server) that names the field.

A step past a float edge is the next float (math.nextafter), so a check written with < where <= was
meant fails here. The ranges are vLLM's; where this server keeps a tighter one it says so (a seed is
non-negative, as OpenAI's API has it; logprobs stop at vLLM's max_logprobs, 20).
"""

import math

import pytest

from minipaged import SamplingParams
from minipaged.sampling_params import BeamSearchParams

TINY = 5e-324  # the smallest positive float
BIG = 2**63

# field: (values that must be accepted, values that must be refused), each list at and past the edges
SAMPLING = {
    "n": ([1, 64], [0, -1]),
    "temperature": ([0.0, TINY, 1e300], [-TINY, math.inf, math.nan]),
    "top_p": ([TINY, 1.0], [0.0, math.nextafter(1.0, 2.0), -1.0]),
    "top_k": ([-1, 0, 1, 10**9], [-2]),
    "min_p": ([0.0, 1.0], [-TINY, math.nextafter(1.0, 2.0)]),
    "seed": ([-BIG, BIG - 1, 0], [-BIG - 1, BIG]),
    "max_tokens": ([1, 10**9], [0, -1]),
    "min_tokens": ([0, 5], [-1, 6]),  # with max_tokens=5: at most max_tokens
    "logprobs": ([0, 20], [-1]),
    "presence_penalty": ([-2.0, 2.0], [math.nextafter(-2.0, -3.0), math.nextafter(2.0, 3.0)]),
    "frequency_penalty": ([-2.0, 2.0], [math.nextafter(-2.0, -3.0), math.nextafter(2.0, 3.0)]),
    "repetition_penalty": ([TINY, 1.0, 1e300], [0.0, -1.0, math.inf]),
}
BEAM = {
    "beam_width": ([1, 8], [0]),
    "max_tokens": ([1, 10**9], [0]),
    "temperature": ([0.0, 1e300], [-TINY, math.inf]),
    "length_penalty": ([-10.0, 10.0], [math.nextafter(-10.0, -11.0), math.nextafter(10.0, 11.0)]),
}


def cases(table):
    for name, (good, bad) in table.items():
        yield from (pytest.param(name, v, True, id=f"{name}={v!r}") for v in good)
        yield from (pytest.param(name, v, False, id=f"{name}={v!r}") for v in bad)


def _sampling(name, value):
    extra = {"max_tokens": 5} if name == "min_tokens" else {}
    return SamplingParams(**{name: value}, **extra)


@pytest.mark.parametrize("name,value,ok", list(cases(SAMPLING)))
def test_sampling_params_edges(name, value, ok):
    if ok:
        assert getattr(_sampling(name, value), name) == value
    else:
        with pytest.raises(ValueError, match=rf"SamplingParams\.{name}="):
            _sampling(name, value)


@pytest.mark.parametrize("name,value,ok", list(cases(BEAM)))
def test_beam_search_params_edges(name, value, ok):
    if ok:
        assert getattr(BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, name: value}), name) == value
    else:
        with pytest.raises(ValueError, match=rf"BeamSearchParams\.{name}="):
            BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, name: value})


def test_offline_engine_refuses_one_past_its_own_limits_before_any_work(tiny_llm):
    """Limits that only the engine knows: n within max_num_seqs, logprobs within max_logprobs (20). A
    max_tokens past the context is not an error offline, as in vLLM's LLM: the output stops at
    max_model_len with finish_reason "length" (the server refuses it: test_server_edges)."""
    engine = tiny_llm.engine
    seqs, context, vocab = engine.args.max_num_seqs, tiny_llm.max_model_len, tiny_llm.config.vocab_size
    for params, field in [(SamplingParams(n=seqs + 1, max_tokens=2), "n"),
                          (SamplingParams(logprobs=engine.args.max_logprobs + 1, max_tokens=2), "logprobs")]:
        with pytest.raises(ValueError, match=rf"SamplingParams\.{field}="):
            tiny_llm.generate(["a"], params, use_tqdm=False)
        engine.check_invariants(idle=True)
    most = engine.args.max_logprobs
    served = tiny_llm.generate(["a"], [SamplingParams(n=seqs, max_tokens=1, logprobs=most)], use_tqdm=False)[0]
    assert len(served.outputs) == seqs and most < vocab
    # each step's dict: the `logprobs` most likely tokens, and the sampled one too when it is not among them
    assert all(len(o.logprobs[0]) - (o.token_ids[0] not in sorted(o.logprobs[0], key=o.logprobs[0].get)[-most:])
               == most for o in served.outputs)
    room = context - len(served.prompt_token_ids)
    out = tiny_llm.generate(["a"], SamplingParams(max_tokens=context, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (room, "length")
    engine.check_invariants(idle=True)


# The server's names for the same fields (completions), with its own limits where it has them.
SERVER = {
    "n": ([1, 64], [0, 65]),  # the test server's max_num_seqs is 64
    "temperature": ([0.0, 1e300], [-TINY]),  # JSON has no inf or nan
    "top_p": ([TINY, 1.0], [0.0, math.nextafter(1.0, 2.0)]),
    "top_k": ([-1, 0, 1], [-2]),
    "min_p": ([0.0, 1.0], [-TINY, math.nextafter(1.0, 2.0)]),
    "seed": ([0, BIG - 1], [-1, BIG]),
    "max_tokens": ([1, 510], [0, 511]),  # prompt "hi": 2 tokens of the tiny model's 512
    "min_tokens": ([0, 1], [-1, 2]),  # with max_tokens=1
    "logprobs": ([0, 20], [-1, 21]),
    "presence_penalty": ([-2.0, 2.0], [math.nextafter(-2.0, -3.0), math.nextafter(2.0, 3.0)]),
    "frequency_penalty": ([-2.0, 2.0], [math.nextafter(-2.0, -3.0), math.nextafter(2.0, 3.0)]),
    "repetition_penalty": ([TINY, 1e300], [0.0, -TINY]),
}


@pytest.mark.parametrize("name,value,ok", list(cases(SERVER)))
def test_server_edges(server, name, value, ok):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, name: value}
    if name == "max_tokens" and ok:
        body["ignore_eos"] = True
    status, reply = server.post("/v1/completions", body)
    if ok:
        assert status == 200, reply
        assert len(reply["choices"]) == body.get("n", 1)
    else:
        assert status == 400 and reply["error"]["param"] == name and name in reply["error"]["message"], reply


def test_server_edges_of_chat_only_fields(server):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "logprobs": True}
    assert server.post("/v1/chat/completions", {**chat, "top_logprobs": 20})[0] == 200
    status, reply = server.post("/v1/chat/completions", {**chat, "top_logprobs": 21})
    assert status == 400 and "top_logprobs" in reply["error"]["message"] and "[0, 20]" in reply["error"]["message"]
    status, reply = server.post("/v1/chat/completions", {**chat, "top_logprobs": -1})
    assert status == 400 and "top_logprobs" in reply["error"]["message"], reply
    assert server.wait_idle()  # nothing refused was queued: the engine is idle, no block held
