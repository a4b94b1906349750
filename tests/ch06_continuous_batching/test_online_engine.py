"""The online engine (LLMEngine, vLLM's names): requests arrive while others decode, can be aborted,
and stream out. Its oracle is the offline call: the same greedy tokens, whatever arrived when."""

import pytest

from minipaged import EngineArgs, LLMEngine, SamplingParams
from minipaged.metrics_reader import find
from minipaged.sampling_params import RequestOutputKind

PROMPTS = ["The cat sat on", "Paging splits memory into", "Once upon a time there", "KV blocks of sixteen",
           "A short one", "Beam search keeps the", "Why is the sky", "Continuous batching lets"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

# Each configuration turns on one of the mechanisms the core runs; the small pools force preemption.
CONFIGS = {
    "default": {},
    "recompute": dict(kv_policy="on_demand", block_size=4, kv_capacity_tokens=64, watermark=0.0),
    "swap": dict(kv_policy="on_demand", block_size=4, kv_capacity_tokens=64, watermark=0.0, preemption_mode="swap"),
    "prefix_caching": dict(enable_prefix_caching=True, block_size=4),
    "chunked": dict(kv_policy="on_demand", enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=4),
    "speculation": dict(kv_policy="on_demand", speculative_config={"method": "ngram", "num_speculative_tokens": 3}),
    "static": dict(kv_policy="block_table", scheduler="static", block_size=4, kv_capacity_tokens=256, max_model_len=64),
}


def engine(**options) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(model="tiny", progress=False, **options))


def offline(options, prompts, params=GREEDY):
    from minipaged import LLM

    return [o.outputs[0].token_ids for o in LLM("tiny", progress=False, **options).generate(prompts, params,
                                                                                              use_tqdm=False)]


def assert_empty(e: LLMEngine):
    """Nothing is held: no request, no block (cached blocks nobody holds count as free), books intact."""
    assert not e.has_unfinished_requests()
    assert find(e.get_metrics(), "kv_cache_usage_perc").value == 0
    assert find(e.get_metrics(), "num_requests_running").value == 0
    assert not e.policy.seq_ids(), f"blocks still held by {e.policy.seq_ids()}"
    e.policy.check_invariants()
    if e.swap_space is not None:
        assert not e.swap_space.seq_ids()
        e.swap_space.check_invariants()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_staggered_arrivals_and_an_abort_give_the_offline_tokens(name):
    options = CONFIGS[name]
    e = engine(**options)
    finals, seen, step, aborted_at = {}, {}, 0, None
    arrivals = {0: [0, 1], 1: [2], 3: [3, 4], 4: [5], 6: [6, 7]}  # step -> prompts that arrive before it
    victim = "r5"
    while step <= max(arrivals) or e.has_unfinished_requests():
        for i in arrivals.get(step, []):
            e.add_request(f"r{i}", PROMPTS[i], GREEDY)
        for out in e.step():
            seen.setdefault(out.request_id, []).append(len(out.outputs[0].token_ids))
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
        if victim in seen and aborted_at is None and 0 < seen[victim][-1] < GREEDY.max_tokens:
            e.abort_request([victim])  # mid-decode
            aborted_at = step
            assert victim not in e.core.requests
        step += 1
    assert aborted_at is not None, "the victim never decoded: the test proves nothing"
    assert victim not in finals, "an aborted request finished"
    expected = offline(options, PROMPTS)
    for i, ids in enumerate(expected):
        if f"r{i}" != victim:
            assert finals[f"r{i}"] == ids, f"{name}: request r{i} differs from the offline run"
    assert find(e.get_metrics(), "num_requests_aborted").value == 1
    assert find(e.get_metrics(), "request_success").value == len(PROMPTS) - 1
    if name in ("recompute", "swap"):
        assert find(e.get_metrics(), "num_preemptions").value > 0, "the pool was meant to run dry"
    assert_empty(e)


@pytest.mark.parametrize("where", ["waiting", "running", "swapped"])
def test_abort_wherever_the_request_is(where):
    e = engine(kv_policy="on_demand", block_size=4, kv_capacity_tokens=48, watermark=0.0, preemption_mode="swap",
               max_num_seqs=8)
    for i in range(6):
        e.add_request(f"r{i}", PROMPTS[i], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for _ in range(40):
        e.step()
        queue = {"waiting": e.scheduler.waiting, "running": e.scheduler.running, "swapped": e.scheduler.swapped}[where]
        if queue:
            break
    assert queue, f"no request reached {where}: the test proves nothing"
    group = queue[-1]
    request_id = group.request_id
    e.abort_request(request_id)
    assert all(not any(g is group for g in q) for q in (e.scheduler.waiting, e.scheduler.running,
                                                        e.scheduler.swapped))
    e.policy.check_invariants()
    finished = set()
    while e.has_unfinished_requests():
        finished |= {o.request_id for o in e.step() if o.finished}
    assert request_id not in finished and len(finished) == 5
    assert_empty(e)


@pytest.mark.parametrize("name", ["default", "recompute", "chunked", "speculation"])
def test_streamed_deltas_join_to_the_final_text_with_stop_strings(name):
    full = offline(CONFIGS[name], PROMPTS[:4], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    from minipaged import LLM

    tok = LLM("tiny", progress=False, kv_policy="per_request").tokenizer
    # a stop string taken from the middle of each greedy text, so that every request stops on it
    stops = [tok.decode(ids)[5:8] or "zz" for ids in full]
    e = engine(**CONFIGS[name])
    for i, stop in enumerate(stops):
        e.add_request(f"r{i}", PROMPTS[i], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop],
                                                          output_kind=RequestOutputKind.DELTA))
    joined, finals, shown = {}, {}, {}
    while e.has_unfinished_requests():
        for out in e.step():
            c = out.outputs[0] if out.outputs else None
            if c is not None:
                joined[out.request_id] = joined.get(out.request_id, "") + c.text
                shown.setdefault(out.request_id, []).append(joined[out.request_id])
            if out.finished:
                finals[out.request_id] = c
    for i, stop in enumerate(stops):
        text = tok.decode(full[i])
        expected = text[:text.find(stop)] if stop in text else text
        rid = f"r{i}"
        assert joined[rid] == expected, f"{name}: the deltas of {rid} do not join to the final text"
        assert all(expected.startswith(s) for s in shown[rid]), "a streamed character was taken back"
        if stop in text:
            assert finals[rid].finish_reason == "stop" and finals[rid].stop_reason == stop
    assert_empty(e)


def test_delta_token_ids_join_to_the_cumulative_ones():
    e = engine()
    e.add_request("d", PROMPTS[0], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, n=2, seed=1,
                                                  output_kind=RequestOutputKind.DELTA))
    e.add_request("c", PROMPTS[0], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, n=2, seed=1))
    deltas, cumulative, cumulative_steps = {0: [], 1: []}, None, 0
    while e.has_unfinished_requests():
        for out in e.step():
            if out.request_id == "d":
                for c in out.outputs:
                    deltas[c.index] += c.token_ids
            else:
                cumulative, cumulative_steps = out, cumulative_steps + 1
    assert cumulative.finished and cumulative_steps == 10, "a cumulative output after every step"
    assert [deltas[i] for i in (0, 1)] == [c.token_ids for c in cumulative.outputs]


def test_final_only_outputs_come_once():
    e = engine()
    e.add_request("f", PROMPTS[1], SamplingParams(temperature=0, max_tokens=6,
                                                  output_kind=RequestOutputKind.FINAL_ONLY))
    outs = []
    while e.has_unfinished_requests():
        outs += e.step()
    assert len(outs) == 1 and outs[0].finished and len(outs[0].outputs[0].token_ids) == 6


def test_prompt_forms_and_bad_requests_are_refused_before_any_work():
    e = engine()
    e.add_request("a", "Hello", GREEDY)
    e.add_request("b", {"prompt": "Hello"}, GREEDY)
    e.add_request("c", {"prompt_token_ids": e.tokenizer.encode("Hello")}, GREEDY)
    passes = find(e.get_metrics(), "forward_passes").value
    bad = [("d", {"prompt_tokens": [1]}, GREEDY, "prompt_token_ids"), ("d", "", GREEDY, "empty"),
           ("d", [10 ** 9], GREEDY, "vocabulary"), ("a", "again", GREEDY, "already in the engine"),
           ("", "x", GREEDY, "request_id"), ("d", "x", "greedy", "SamplingParams")]
    for request_id, prompt, params, message in bad:
        with pytest.raises(ValueError, match=message):
            e.add_request(request_id, prompt, params)
    assert find(e.get_metrics(), "forward_passes").value == passes
    assert find(e.get_metrics(), "num_requests_waiting").value == 3
    outs = {}
    while e.has_unfinished_requests():
        outs.update({o.request_id: o for o in e.step() if o.finished})
    assert outs["a"].outputs[0].token_ids == outs["b"].outputs[0].token_ids == outs["c"].outputs[0].token_ids
    assert outs["b"].prompt == "Hello" and outs["c"].prompt is None
    assert_empty(e)


def test_metrics_while_running_and_after():
    e = engine(kv_policy="on_demand", max_num_seqs=2)
    for i in range(4):
        e.add_request(f"r{i}", PROMPTS[i], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    e.step()
    m = {x.name.split(":")[1]: x for x in e.get_metrics()}
    assert m["num_requests_running"].value == 2 and m["num_requests_waiting"].value == 2
    assert 0 < m["kv_cache_usage_perc"].value <= 1
    while e.has_unfinished_requests():
        e.step()
    m = {x.name.split(":")[1]: x for x in e.get_metrics()}
    prompt_tokens = sum(len(e.tokenizer.encode(p)) for p in PROMPTS[:4])
    assert m["prompt_tokens"].value == prompt_tokens and m["generation_tokens"].value == 20
    assert m["time_to_first_token_seconds"].count == 4 and m["e2e_request_latency_seconds"].count == 4
    assert m["inter_token_latency_seconds"].count == 4 * 4
    assert m["tokens_computed"].value == prompt_tokens + 4 * 4
    assert_empty(e)


def test_prefix_cache_metrics_count_tokens():
    e = engine(block_size=4)  # the default: prefix caching on
    system = "You are a helpful assistant who answers in one line. "
    for i in range(3):
        e.add_request(f"r{i}", system + PROMPTS[i], SamplingParams(temperature=0, max_tokens=3))
        while e.has_unfinished_requests():
            e.step()
    m = {x.name.split(":")[1]: x.value for x in e.get_metrics()}
    prompts = [len(e.tokenizer.encode(system + p)) for p in PROMPTS[:3]]
    assert m["prefix_cache_queries"] == sum(prompts)
    assert m["prefix_cache_hits"] >= 2 * (len(e.tokenizer.encode(system)) // 4 * 4), "later requests hit the cache"
    assert_empty(e)


def test_engine_args_are_checked_in_one_place():
    for options, message in [(dict(kv_policy="paged"), "kv_policy"), (dict(block_size=0), "block_size"),
                             (dict(scheduler="fifo"), "scheduler"), (dict(watermark=1.5), "watermark"),
                             (dict(kv_policy="on_demand", enable_prefix_caching=True), "enable_prefix_caching"),
                             (dict(enable_chunked_prefill=True, max_num_batched_tokens=4), "max_num_batched_tokens"),
                             (dict(kv_policy="contiguous", preemption_mode="swap"), "preemption_mode"),
                             (dict(use_cache=False), "use_cache")]:
        with pytest.raises(ValueError, match=message):
            EngineArgs(model="tiny", **options).validate()
    with pytest.raises(ValueError, match="unknown options"):
        from minipaged import LLM

        LLM("tiny", kv_polcy="shared")
    assert EngineArgs().validate().kv_policy == "prefix_caching", "the default is the finished engine"
    assert EngineArgs(enable_prefix_caching=False).validate().kv_policy == "shared"


def test_beam_search_runs_in_the_core_with_every_mechanism():
    """Beam search is a client of the core: it gains the prefix cache, chunked prefill and speculation
    (which leaves its beams alone) without a loop of its own, with the same beams."""
    from minipaged import LLM
    from minipaged.sampling_params import BeamSearchParams

    params = BeamSearchParams(beam_width=1, max_tokens=8)
    prompt = "You are a helpful assistant. The sea is"
    ref = LLM("tiny", progress=False, kv_policy="shared").beam_search([prompt], params)[0].sequences
    for options in (dict(enable_prefix_caching=True, block_size=4),
                    dict(kv_policy="shared", enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=2),
                    dict(kv_policy="shared", speculative_config={"method": "ngram", "num_speculative_tokens": 2})):
        llm = LLM("tiny", progress=False, **options)
        for _ in range(2):  # the second search finds the prompt's blocks cached, when the cache is on
            got = llm.beam_search([prompt], params)[0].sequences
            assert [b.tokens for b in got] == [b.tokens for b in ref], options
        m = {x.name.split(":")[1]: x.value for x in llm.get_metrics()}
        if options.get("enable_prefix_caching"):
            assert m["prefix_cache_queries"] == 2 * len(llm.tokenizer.encode(prompt)) and m["prefix_cache_hits"] > 0
        assert_empty(llm.engine)
