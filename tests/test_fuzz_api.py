"""A random search over the public API: engine options, prompts and SamplingParams, good and bad.

Every case must end one of two ways:
  - complete outputs: one RequestOutput per prompt, finished, every sample with a finish reason
    ("length", "stop", or "abort" with the reason it was refused), and no KV block held after; or
  - a ValueError raised before any work: no engine step was taken, nothing is queued, nothing held.
Any other exception fails the test, and so does a case that runs past its deadline. After a refused
call the same engine must still serve a plain request (the bad input left nothing behind).

    python -m pytest tests/test_fuzz_api.py --hypothesis-show-statistics
"""

import math
import numbers
import re

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minipaged import LLM, BeamSearchParams, SamplingParams  # noqa: E402

VOCAB = 259  # the tiny model's byte vocabulary
FUZZ = settings(max_examples=80, deadline=30_000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

# junk of every kind: what a client might send by mistake
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                 st.text(max_size=4), st.lists(st.integers(-3, 300), max_size=3), st.dictionaries(st.text(max_size=2),
                                                                                            st.integers(), max_size=1))


def maybe(good, junk=JUNK, percent_junk=8):
    """Mostly a good value, sometimes (percent_junk in 100) junk."""
    return st.integers(0, 99).flatmap(lambda r: junk if r >= 100 - percent_junk else good)  # 0 (simplest): good


def field_values():
    return {
        "n": maybe(st.integers(1, 4)),
        "temperature": maybe(st.one_of(st.sampled_from([0, 0.0, 1e-40, 1e-6, 0.5, 1.0, 2.0]), st.floats(0, 5))),
        "top_p": maybe(st.sampled_from([1.0, 0.9, 0.5, 1e-46])),
        "top_k": maybe(st.sampled_from([0, -1, 1, 5, 300])),
        "min_p": maybe(st.sampled_from([0.0, 0.1, 1.0])),
        "seed": maybe(st.one_of(st.none(), st.integers(0, 2**64))),
        "stop": maybe(st.one_of(st.none(), st.text(min_size=1, max_size=3), st.lists(st.text(max_size=2), max_size=2))),
        "stop_token_ids": maybe(st.one_of(st.none(), st.lists(st.integers(0, VOCAB + 5), max_size=3))),
        "ignore_eos": maybe(st.booleans()),
        "max_tokens": maybe(st.one_of(st.none(), st.integers(1, 12))),
        "min_tokens": maybe(st.integers(0, 6)),
        "include_stop_str_in_output": maybe(st.booleans()),
        "skip_special_tokens": maybe(st.booleans()),
        "logprobs": maybe(st.one_of(st.none(), st.integers(0, VOCAB + 2))),
        "presence_penalty": maybe(st.floats(-2.5, 2.5)),
        "frequency_penalty": maybe(st.sampled_from([0.0, -2.0, 1.5, 2.0001])),
        "repetition_penalty": maybe(st.sampled_from([1.0, 1.3, 0.5, 0.0, -1.0])),
        "logit_bias": maybe(st.one_of(st.none(), st.dictionaries(st.integers(0, VOCAB + 2), st.floats(-150, 150),
                                                                 max_size=2))),
    }


@st.composite
def sampling_params(draw):
    fields = field_values()
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True))
    values = {name: draw(fields[name]) for name in chosen}
    if draw(st.integers(0, 30)) == 0:
        values[draw(st.sampled_from(["allowed_token_ids", "best_of", "temprature"]))] = 1
    if values.get("max_tokens", 16) is None:  # up to the context length: keep the case short
        values["max_tokens"] = 8
    return values


TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=12)
TOKEN_LIST = st.lists(maybe(st.integers(0, VOCAB - 1), junk=st.sampled_from([-1, VOCAB, 2.0, True, None, "a"]),
                            percent_junk=3), max_size=10)
PROMPT = maybe(st.one_of(TEXT, TOKEN_LIST, st.builds(lambda t: {"prompt": t}, TEXT),
                         st.builds(lambda t: {"prompt_token_ids": t}, TOKEN_LIST)),
               junk=st.one_of(JUNK, st.just(b"bytes"), st.just({"text": "x"})), percent_junk=5)


def rarely_junk(good):
    return maybe(good, percent_junk=3)


@st.composite
def engine_options(draw):
    """Options of every configuration; about one engine in five gets a wrong value somewhere."""
    options = {}
    policy = draw(st.sampled_from([None, "per_request", "contiguous", "block_table", "on_demand", "shared",
                                   "prefix_caching"]))
    if policy is not None:
        options["kv_policy"] = policy
    if policy != "per_request":
        if policy != "contiguous":
            options["block_size"] = draw(rarely_junk(st.sampled_from([1, 4, 16])))
        options["kv_capacity_tokens"] = draw(rarely_junk(st.sampled_from([64, 16, 48, 128, 1024])))
        if policy in ("contiguous", "block_table"):
            options["reservation"] = draw(rarely_junk(st.sampled_from(["oracle", "pow2", "max"])))
            if options["reservation"] == "max":  # each request reserves max_model_len: keep it small
                options["max_model_len"] = draw(st.sampled_from([24, 64]))
        if policy in (None, "block_table", "on_demand", "shared", "prefix_caching"):
            options["preemption_mode"] = draw(rarely_junk(st.sampled_from(["recompute", "swap"])))
        if policy in (None, "on_demand", "shared", "prefix_caching"):
            options["watermark"] = draw(rarely_junk(st.sampled_from([0.0, 0.01, 0.2])))
        kind = draw(st.integers(0, 5))
        if kind == 1:
            options["enable_chunked_prefill"] = True
            options["max_num_batched_tokens"] = draw(rarely_junk(st.sampled_from([8, 16, 64])))
        elif kind == 2:
            options["speculative_config"] = {"method": "ngram", "num_speculative_tokens": draw(st.integers(1, 4))}
        elif kind == 3:
            options["scheduler"] = "static"
    options["max_num_seqs"] = draw(rarely_junk(st.sampled_from([1, 2, 8])))
    options.setdefault("max_model_len", draw(rarely_junk(st.sampled_from([None, 24, 64]))))
    if draw(st.integers(0, 10)) == 0:  # an option that does not exist, or a wrong kind of value
        options[draw(st.sampled_from(["bogus", "dtype", "attention_backend", "device", "seed"]))] = draw(JUNK)
    return options


def assert_idle(llm, steps_before):
    assert llm.engine.core.num_steps == steps_before, "a ValueError came after the engine had done work"
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_invariants(idle=True)


def num_prompts(prompts) -> int:
    """How many prompts the API sees: a string, a dict or a list of ints is one."""
    if not isinstance(prompts, (list, tuple)) or (prompts and isinstance(prompts[0], numbers.Integral)):
        return 1
    return len(prompts)


def assert_complete(outs, prompts):
    assert len(outs) == num_prompts(prompts)
    for out in outs:
        assert out.finished and out.outputs
        for c in out.outputs:
            assert c.finish_reason in ("length", "stop", "abort"), c
            if c.finish_reason == "abort":
                assert str(c.stop_reason).startswith("refused"), c
            assert all(0 <= t < VOCAB for t in c.token_ids) and math.isfinite(c.cumulative_logprob)


def still_serves(llm):
    out = llm.generate([[65, 66]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2
    llm.engine.check_invariants(idle=True)


@settings(FUZZ, max_examples=200)
@given(options=engine_options(), prompts=maybe(st.lists(PROMPT, min_size=1, max_size=4), junk=st.just([]),
                                                percent_junk=3), data=st.data())
def test_generate_serves_or_refuses_up_front(options, prompts, data):
    try:
        llm = LLM("tiny", progress=False, **options)
    except ValueError:
        event("engine options refused")
        return
    params = []
    for _ in prompts or [None]:
        try:
            params.append(SamplingParams(**data.draw(sampling_params())))
        except ValueError:
            params.append(None)
    single = data.draw(st.booleans()) and prompts  # one prompt, not in a list
    call = prompts[0] if single else prompts
    sp = params[0] if data.draw(st.booleans()) else params[:num_prompts(call)]  # one for all, or one each
    steps = llm.engine.core.num_steps
    try:
        outs = llm.generate(call, sp, use_tqdm=False)
    except ValueError as e:
        event("request refused up front: " + re.sub(r"\[\d+\]", "[i]", str(e).split("=")[0].split(" ")[0][:30]))
        assert_idle(llm, steps)
    else:
        event("served" + (" (a sample refused: it can never fit)" if any(
            c.finish_reason == "abort" for o in outs for c in o.outputs) else ""))
        assert_complete(outs, call)
        llm.engine.check_invariants(idle=True)
    still_serves(llm)


@FUZZ
@given(prompts=st.lists(PROMPT, min_size=0, max_size=3),
       fields=st.fixed_dictionaries({}, optional={
           "beam_width": maybe(st.integers(1, 4)), "max_tokens": maybe(st.integers(1, 6)),
           "ignore_eos": maybe(st.booleans()), "temperature": maybe(st.one_of(st.floats(0, 2))),
           "length_penalty": maybe(st.one_of(st.floats(-12, 12)))}),
       policy=st.sampled_from(["shared", "prefix_caching", "per_request", "on_demand"]),
       capacity=st.sampled_from([32, 256]))
def test_beam_search_serves_or_refuses_up_front(prompts, fields, policy, capacity):
    options = {} if policy == "per_request" else {"kv_capacity_tokens": capacity, "block_size": 4}
    llm = LLM("tiny", kv_policy=policy, progress=False, **options)
    steps = llm.engine.core.num_steps
    try:
        params = BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **fields})
        outs = llm.beam_search(prompts, params)
    except ValueError:
        event("refused up front")
        assert_idle(llm, steps)
    else:
        event("searched")
        assert len(outs) == num_prompts(prompts)
        for out in outs:
            assert (out.refused is not None) != bool(out.sequences)
            assert all(math.isfinite(s.cum_logprob) for s in out.sequences)
        llm.engine.check_invariants(idle=True)
    still_serves(llm)


MESSAGE = maybe(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": TEXT}),
                junk=st.one_of(st.fixed_dictionaries({"role": JUNK, "content": maybe(TEXT)}), JUNK), percent_junk=10)


@FUZZ
@given(messages=maybe(st.one_of(st.lists(MESSAGE, max_size=3), st.lists(st.lists(MESSAGE, max_size=2), max_size=2))))
def test_chat_serves_or_refuses_up_front(tiny_llm, messages):
    steps = tiny_llm.engine.core.num_steps
    try:
        outs = tiny_llm.chat(messages, SamplingParams(max_tokens=2), use_tqdm=False)
    except ValueError:
        event("refused up front")
        assert_idle(tiny_llm, steps)
    else:
        event("served")
        assert outs and all(o.finished for o in outs)
        tiny_llm.engine.check_invariants(idle=True)
