"""Inputs at the edges: each is served, or refused with a ValueError that names the field before any
work starts, and the engine goes on serving the others with no KV block left behind.

One test per way an engine used to break (a swap that never came back, samples refused that fit one
by one, an unbounded n, a pool bigger than the machine, parameters that crashed inside torch, ...).
The random search over the whole public API is tests/test_fuzz_api.py.
"""

import pytest

from minipaged import LLM, BeamSearchParams, SamplingParams
from minipaged.request import Sequence

GREEDY = dict(temperature=0, ignore_eos=True)


def tokens(outputs):
    return [[c.token_ids for c in o.outputs] for o in outputs]


# ---- liveness: every request is served or refused ------------------------------------------------

@pytest.mark.parametrize("options", [
    dict(kv_policy="shared"), dict(kv_policy="prefix_caching"), dict(kv_policy="on_demand"),
    dict(kv_policy="shared", scheduler="static"), dict(kv_policy="shared", enable_chunked_prefill=True,
                                                       max_num_batched_tokens=64),
    dict(kv_policy="shared", swap_space_tokens=256),
])
def test_a_swapped_request_of_several_samples_comes_back(options):
    """A swapped-out request of 3 samples used to wait forever for a free block per sample (the
    pool then had them, but swap-in asked for more), and the call lost every output."""
    llm = LLM("tiny", block_size=4, kv_capacity_tokens=32, preemption_mode="swap", watermark=0.0, progress=False,
              **options)
    outs = llm.generate([[65] * 3, [66]], [SamplingParams(max_tokens=8, **GREEDY),
                                            SamplingParams(n=3, max_tokens=7, **GREEDY)], use_tqdm=False)
    assert [len(t) for t in tokens(outs)[0]] == [8] and [len(t) for t in tokens(outs)[1]] == [7, 7, 7]
    big = LLM("tiny", progress=False)
    assert tokens(outs) == tokens(big.generate([[65] * 3, [66]], [SamplingParams(max_tokens=8, **GREEDY),
                                                                   SamplingParams(n=3, max_tokens=7, **GREEDY)],
                                               use_tqdm=False))
    llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("policy", ["shared", "prefix_caching", "on_demand"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_samples_that_fit_one_by_one_are_served(policy, mode):
    """3 samples of 17 tokens need 5 blocks each, and the pool has 5: they cannot grow side by side,
    but each fits alone, so each is served (split into one request per sample, as a recompute does)."""
    params = SamplingParams(n=3, max_tokens=14, seed=7, ignore_eos=True)
    llm = LLM("tiny", kv_policy=policy, block_size=4, kv_capacity_tokens=20, preemption_mode=mode, progress=False)
    out = llm.generate([[65] * 3], params, use_tqdm=False)[0]
    assert [(c.finish_reason, len(c.token_ids)) for c in out.outputs] == [("length", 14)] * 3
    roomy = LLM("tiny", kv_policy=policy, progress=False).generate([[65] * 3], params, use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in roomy.outputs]  # seeded: same samples
    llm.engine.check_invariants(idle=True)


def test_a_sample_longer_than_the_pool_is_still_refused():
    llm = LLM("tiny", kv_policy="shared", block_size=4, kv_capacity_tokens=20, progress=False)
    out = llm.generate([[65] * 3], SamplingParams(n=2, max_tokens=20, ignore_eos=True), use_tqdm=False)[0]
    assert all(c.finish_reason == "abort" and c.stop_reason.startswith("refused") for c in out.outputs)
    llm.engine.check_invariants(idle=True)


# ---- n: bounded up front, finished in linear work ------------------------------------------------

def test_more_samples_than_the_engine_holds_is_refused_before_any_sequence_exists(tiny_llm):
    before = len(tiny_llm.engine.core.requests)
    with pytest.raises(ValueError, match=r"SamplingParams\.n=1000000000000 .*max_num_seqs=64"):
        tiny_llm.generate(["a"], SamplingParams(n=10**12), use_tqdm=False)
    assert len(tiny_llm.engine.core.requests) == before
    with pytest.raises(ValueError, match=r"beam_width=65"):
        tiny_llm.beam_search([[65]], BeamSearchParams(beam_width=65, max_tokens=2))


def test_finishing_a_request_is_linear_in_its_samples(monkeypatch):
    """How often a Sequence is asked whether it finished, for n = 32 and n = 128 samples: 4x the
    samples must cost about 4x, not 16x (a request used to scan all its samples at each finish)."""
    calls = {"n": 0}
    finished = Sequence.finished

    def counted(self):
        calls["n"] += 1
        return finished.fget(self)

    monkeypatch.setattr(Sequence, "finished", property(counted))
    counts = []
    for n in (32, 128):
        llm = LLM("tiny", max_num_seqs=n, kv_capacity_tokens=4096, progress=False)
        calls["n"] = 0
        llm.generate(["a"], SamplingParams(n=n, max_tokens=2, ignore_eos=True), use_tqdm=False)
        counts.append(calls["n"])
    assert counts[1] <= 5 * counts[0], counts


# ---- memory the machine does not have --------------------------------------------------------------

@pytest.mark.parametrize("options,match", [
    (dict(kv_capacity_tokens=10**12), r"kv_capacity_tokens=1000000000000 need .* GiB .* at most \d+ tokens"),
    (dict(preemption_mode="swap", swap_space_tokens=10**12), r"swap_space_tokens.* GiB"),
    (dict(kv_policy="block_table", kv_capacity_tokens=64, block_size=4), r"cannot hold one reservation of 512"),
    (dict(kv_policy="contiguous", kv_capacity_tokens=100), r"cannot hold one reservation"),
])
def test_a_pool_that_cannot_work_is_refused_at_construction(options, match):
    with pytest.raises(ValueError, match=match):
        LLM("tiny", progress=False, **options)


# ---- parameters that used to crash inside torch, taking the other prompts with them -------------

def test_a_temperature_too_small_to_sample_with_is_greedy(tiny_llm):
    prompts = ["hello", "there"]
    want = tokens(tiny_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False))
    for tiny in (1e-40, 1e-6):
        got = tokens(tiny_llm.generate(prompts, SamplingParams(temperature=tiny, max_tokens=6), use_tqdm=False))
        assert got == want, tiny


def test_a_top_p_below_float32_keeps_the_most_likely_token(tiny_llm):
    prompts = ["hello", "there"]
    want = tokens(tiny_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False))
    got = tokens(tiny_llm.generate(prompts, SamplingParams(top_p=1e-46, max_tokens=6, seed=1), use_tqdm=False))
    assert got == want
    tiny_llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("value,match", [(10**6, r"logprobs=1000000 .*\[0, 259\]"), (True, "logprobs=True")])
def test_logprobs_beyond_the_vocabulary_are_refused_up_front(value, match):
    from minipaged import LLM

    llm = LLM("tiny", progress=False, max_logprobs=-1)  # no cap but the vocabulary
    with pytest.raises(ValueError, match=match):
        llm.generate(["a", "b"], SamplingParams(logprobs=value, max_tokens=2), use_tqdm=False)
    out = llm.generate(["a"], SamplingParams(logprobs=259, max_tokens=2), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs[0]) == 259  # the whole vocabulary is allowed
    llm.engine.check_invariants(idle=True)


def test_logprobs_stop_at_max_logprobs_as_in_vllm(tiny_llm):
    assert tiny_llm.engine.args.max_logprobs == 20  # vLLM's default
    with pytest.raises(ValueError, match=r"SamplingParams.logprobs=21 .*\[0, 20\] \(max_logprobs=20"):
        tiny_llm.generate(["a"], SamplingParams(logprobs=21, max_tokens=2), use_tqdm=False)
    out = tiny_llm.generate(["a"], SamplingParams(logprobs=20, max_tokens=2, temperature=0), use_tqdm=False)
    assert len(out[0].outputs[0].logprobs[0]) == 20  # greedy: the sampled token is among the 20
    tiny_llm.engine.check_invariants(idle=True)


def test_a_sampling_params_changed_after_construction_is_checked_again(tiny_llm):
    params = SamplingParams(max_tokens=4)
    params.temperature = -1.0
    with pytest.raises(ValueError, match="SamplingParams.temperature=-1.0"):
        tiny_llm.generate(["a"], params, use_tqdm=False)
    params = SamplingParams(max_tokens=4)
    params.stop = 5
    with pytest.raises(ValueError, match="SamplingParams.stop=5"):
        tiny_llm.generate(["a"], params, use_tqdm=False)


# ---- min_tokens and stop strings ---------------------------------------------------------------------

def test_a_stop_string_inside_the_first_min_tokens_does_not_cut_them():
    """A stop string that begins in the text of the first min_tokens tokens and ends in the next one
    used to cut the output back to fewer than min_tokens tokens' text."""
    llm = LLM("tiny", progress=False)
    free = llm.generate(["abc"], SamplingParams(max_tokens=24, **GREEDY), use_tqdm=False)[0].outputs[0]
    early = llm.tokenizer.decode(free.token_ids[:9])  # the first min_tokens tokens' text
    stop = early[-1] + llm.tokenizer.decode(free.token_ids[9:10])  # spans tokens 9 and 10
    assert early[-1] != "\ufffd" and free.text.find(stop) == len(early) - 1, "pick another prompt"
    cut = llm.generate(["abc"], SamplingParams(max_tokens=24, stop=stop, **GREEDY), use_tqdm=False)[0].outputs[0]
    assert cut.text == early[:-1]  # without min_tokens the stop string cuts inside them
    out = llm.generate(["abc"], SamplingParams(max_tokens=24, min_tokens=9, stop=stop, **GREEDY),
                       use_tqdm=False)[0].outputs[0]
    assert out.text.startswith(early) and len(out.token_ids) >= 9, out.text


# ---- dtypes every configuration runs ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("options", [dict(kv_policy="per_request"), dict(kv_policy="per_request", use_cache=False),
                                     dict(), dict(attention_backend="torch")])
def test_every_dtype_runs_where_it_is_accepted(dtype, options):
    llm = LLM("tiny", dtype=dtype, progress=False, **options)
    out = llm.generate(["hi there"], SamplingParams(max_tokens=4, logprobs=2, **GREEDY), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4


def test_numba_kernels_refuse_bfloat16_at_construction():
    with pytest.raises(ValueError, match="attention_backend='numba' runs dtype"):
        LLM("tiny", dtype="bfloat16", attention_backend="numba", progress=False)


# ---- beam search parameters --------------------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("length_penalty", -1e308), ("length_penalty", float("nan")),
                                         ("length_penalty", float("inf")), ("ignore_eos", "no"),
                                         ("temperature", float("nan")), ("beam_width", True)])
def test_bad_beam_search_params_name_the_field(field, value):
    options = dict(beam_width=2, max_tokens=4)
    options[field] = value
    with pytest.raises(ValueError, match=f"BeamSearchParams.{field}="):
        BeamSearchParams(**options)


def test_a_beam_temperature_too_small_scores_as_raw_logits(tiny_llm):
    raw = tiny_llm.beam_search([[65, 66]], BeamSearchParams(beam_width=2, max_tokens=4))[0].sequences
    tiny = tiny_llm.beam_search([[65, 66]], BeamSearchParams(beam_width=2, max_tokens=4, temperature=1e-40))[0]
    assert [(b.tokens, b.cum_logprob) for b in tiny.sequences] == [(b.tokens, b.cum_logprob) for b in raw]


# ---- the wrong kind of value: a ValueError naming it ---------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda llm: llm.generate(None), "prompts must be a string"),
    (lambda llm: llm.generate(5), "prompts must be a string.* got int"),
    (lambda llm: llm.generate({"prompt_token_ids": None}), r"\['prompt_token_ids'\] must be a list.* got NoneType"),
    (lambda llm: llm.generate(["a"], 5), "sampling_params must be a SamplingParams.* got int"),
    (lambda llm: llm.generate(["a"], {"max_tokens": 3}), r"got dict; build one with SamplingParams\(\*\*fields\)"),
    (lambda llm: llm.generate(b"hello"), "is bytes; decode it"),
    (lambda llm: llm.generate([[1, 2.0]]), r"prompts\[0\]\[1\]=2.0 is a float"),
    (lambda llm: llm.generate([[1, True]]), r"prompts\[0\]\[1\]=True is a bool"),
    (lambda llm: llm.generate(["ok", "a\ud800"]), r"prompts\[1\] is not valid text.*surrogate"),
    (lambda llm: llm.chat(None), "messages must be a non-empty list"),
    (lambda llm: llm.chat([{"role": 5, "content": "x"}]), r"messages\[0\]=.* 'role' and 'content' are strings"),
    (lambda llm: llm.chat([{"role": "user", "content": 5}]), r"'role' and 'content' are strings"),
    (lambda llm: llm.chat([[{"role": "user", "content": "hi"}], [None]]), r"messages\[1\]\[0\]=None"),
])
def test_wrong_inputs_are_value_errors_that_say_what(tiny_llm, call, match):
    with pytest.raises(ValueError, match=match):
        call(tiny_llm)
    tiny_llm.engine.check_invariants(idle=True)


def test_numpy_token_ids_are_token_ids(tiny_llm):
    np = pytest.importorskip("numpy")
    want = tokens(tiny_llm.generate([[65, 66, 67]], SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False))
    got = tokens(tiny_llm.generate([list(np.array([65, 66, 67]))], SamplingParams(max_tokens=3, **GREEDY),
                                   use_tqdm=False))
    assert got == want


@pytest.mark.parametrize("field,value", [
    ("stop", 5), ("stop", [""]), ("stop_token_ids", 0), ("stop_token_ids", [True]), ("temperature", True),
    ("temperature", float("inf")), ("ignore_eos", "no"), ("skip_special_tokens", 1),
    ("include_stop_str_in_output", None), ("min_tokens", True), ("min_p", True), ("seed", 2**64), ("logprobs", True),
])
def test_values_of_the_wrong_kind_are_refused(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}="):
        SamplingParams(**{field: value})


def test_unknown_sampling_fields_say_which_vllm_fields_are_not_supported():
    with pytest.raises(ValueError, match=r"\['allowed_token_ids'\] exist in vLLM but are not supported"):
        SamplingParams(allowed_token_ids=[1, 2])
    with pytest.raises(ValueError, match=r"unknown fields \['temprature'\]. The known fields are"):
        SamplingParams(temprature=0.5)


@pytest.mark.parametrize("options,match", [
    (dict(max_model_len="100"), "max_model_len='100'"), (dict(max_model_len=2.5), "max_model_len=2.5"),
    (dict(seed="x"), "seed='x'"), (dict(seed=10**30), r"seed=10+ is not allowed: an integer in \[0, 2\*\*63\)"),
    (dict(device="bogus"), "device='bogus'"), (dict(device="cuda"), "device='cuda' needs CUDA"),
    (dict(max_num_seqs=True), "max_num_seqs=True"), (dict(attention_backend="bogus"), "attention_backend='bogus'"),
    (dict(kv_policy="per_request", block_size=8), "block_size=8 has no effect with kv_policy='per_request'"),
    (dict(kv_policy="on_demand", reservation="oracle"), "reservation='oracle' has no effect"),
    (dict(kv_policy="block_table", watermark=0.2), "watermark=0.2 has no effect"),
    (dict(swap_space_tokens=512), "swap_space_tokens=512 has no effect .* preemption_mode='recompute'"),
])
def test_engine_options_are_checked_before_the_weights_load(options, match):
    from minipaged import EngineArgs

    if "CUDA" in match:
        torch = pytest.importorskip("torch")
        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA, so device='cuda' is valid here")
    with pytest.raises(ValueError, match=match):
        EngineArgs(model="tiny", **options).validate()
