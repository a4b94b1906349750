"""Chapter 00: the front end keeps vLLM's names, defaults and behaviour, and rejects bad input clearly."""

import pytest

from minipaged import LLM, CompletionOutput, RequestOutput, SamplingParams
from minipaged.metrics_reader import find


def test_sampling_params_defaults_are_vllms():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens, p.seed) == (1, 1.0, 1.0, 0, 16, None)
    assert (p.stop, p.stop_token_ids, p.ignore_eos, p.min_tokens) == (None, [], False, 0)


@pytest.mark.parametrize("field,value", [
    ("n", 0), ("n", 1.5), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.01), ("top_k", -2),
    ("min_p", 1.5), ("max_tokens", 0), ("max_tokens", -5), ("min_tokens", -1), ("seed", "x"),
    ("stop", ""), ("stop", ["ok", ""]), ("stop_token_ids", [-1]), ("logprobs", -1),
])
def test_bad_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}="):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_rejected():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=4, min_tokens=5)


@pytest.mark.parametrize("prompts,match", [
    ("", r"prompts\[0\] is empty"),
    ([[]], r"prompts\[0\]"),
    ([], "prompts is empty"),
    ([[1, 2, 999999]], r"prompts\[0\] has token ids outside the vocabulary"),
    ([[-1]], "outside the vocabulary"),
    (["ok", 3.5], r"prompts\[1\] must be a string, a list of token ids"),
    ([{"text": "x"}], r"prompts\[0\] is a dict without"),
])
def test_bad_prompts_name_the_prompt(tiny_llm, prompts, match):
    with pytest.raises(ValueError, match=match):
        tiny_llm.generate(prompts, SamplingParams(max_tokens=2), use_tqdm=False)


def test_prompt_longer_than_context_rejected(tiny_llm):
    too_long = [1] * tiny_llm.max_model_len
    with pytest.raises(ValueError, match="max_model_len"):
        tiny_llm.generate([too_long], SamplingParams(max_tokens=1), use_tqdm=False)


def test_unknown_model_and_options_rejected():
    with pytest.raises(ValueError, match="model='gpt-17' is not known"):
        LLM("gpt-17")
    with pytest.raises(ValueError, match="kv_policy="):
        LLM("tiny", kv_policy="nonsense")
    with pytest.raises(ValueError, match="dtype="):
        LLM("tiny", dtype="int3")


def test_sampling_params_list_must_match_prompts(tiny_llm):
    with pytest.raises(ValueError, match="sampling_params has 1 entries for 2 prompts"):
        tiny_llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)


def test_stop_token_ids_outside_vocab_rejected(tiny_llm):
    with pytest.raises(ValueError, match="stop_token_ids"):
        tiny_llm.generate("a", SamplingParams(stop_token_ids=[10**6]), use_tqdm=False)


def test_a_rejected_batch_does_no_work(tiny_llm):
    def passes():
        return find(tiny_llm.get_metrics(), "forward_passes").value

    before = passes()
    with pytest.raises(ValueError):
        tiny_llm.generate(["fine", ""], SamplingParams(max_tokens=3), use_tqdm=False)
    assert passes() == before
    assert tiny_llm.generate("fine", SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids


def test_prompt_forms(tiny_llm):
    greedy = SamplingParams(temperature=0, max_tokens=5)
    one = tiny_llm.generate("hello", greedy, use_tqdm=False)
    many = tiny_llm.generate(["hello", "world"], greedy, use_tqdm=False)
    ids = tiny_llm.generate([tiny_llm.tokenizer.encode("hello")], greedy, use_tqdm=False)
    flat_ids = tiny_llm.generate(tiny_llm.tokenizer.encode("hello"), greedy, use_tqdm=False)
    as_dict = tiny_llm.generate({"prompt": "hello"}, greedy, use_tqdm=False)
    assert isinstance(one[0], RequestOutput) and isinstance(one[0].outputs[0], CompletionOutput)
    assert len(many) == 2 and one[0].prompt == "hello" and ids[0].prompt is None
    tokens = [r[0].outputs[0].token_ids for r in (one, many, ids, flat_ids, as_dict)]
    assert all(t == tokens[0] for t in tokens)
    assert one[0].outputs[0].text == tiny_llm.tokenizer.decode(tokens[0])


def test_one_sampling_params_per_prompt(tiny_llm):
    # ignore_eos: the default temperature samples, and the tiny model can draw its end token early
    outs = tiny_llm.generate(["a", "b"], [SamplingParams(max_tokens=2, ignore_eos=True),
                                          SamplingParams(max_tokens=7, ignore_eos=True)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 7]


def test_max_tokens_gives_length(tiny_llm):
    out = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=9, ignore_eos=True), use_tqdm=False)
    c = out[0].outputs[0]
    assert len(c.token_ids) == 9 and c.finish_reason == "length" and c.stop_reason is None


def test_same_seed_same_text_different_seed_different_text(tiny_llm):
    def sample(seed):
        p = SamplingParams(temperature=1.0, max_tokens=20, seed=seed, ignore_eos=True)
        return tiny_llm.generate("xyz", p, use_tqdm=False)[0].outputs[0].token_ids

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_n_samples_differ_and_are_reproducible(tiny_llm):
    p = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=1, ignore_eos=True)
    a = tiny_llm.generate("q", p, use_tqdm=False)[0].outputs
    b = tiny_llm.generate("q", p, use_tqdm=False)[0].outputs
    assert [c.index for c in a] == [0, 1, 2]
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert len({tuple(c.token_ids) for c in a}) == 3


def test_stop_token_ids_end_the_output(tiny_llm):
    free = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    ids = free[0].outputs[0].token_ids
    stopper = ids[4]
    first = ids.index(stopper)
    out = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stopper]),
                            use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stopper


def test_stop_strings_cut_the_text(tiny_llm):
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    text = tiny_llm.generate("abc", greedy, use_tqdm=False)[0].outputs[0].text
    stop = text[6:8]
    out = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]),
                            use_tqdm=False)[0].outputs[0]
    assert out.text == text[: text.index(stop)] and out.finish_reason == "stop" and out.stop_reason == stop
    kept = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=stop,
                                                   include_stop_str_in_output=True), use_tqdm=False)
    assert kept[0].outputs[0].text == text[: text.index(stop) + len(stop)]


def test_eos_ends_unless_ignored(tiny_llm):
    eos = tiny_llm.tokenizer.eos_token_id
    # Find a greedy continuation long enough, then make its 3rd token the "EOS" of a copy of the tokenizer.
    ids = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0].token_ids
    tiny_llm.tokenizer.eos_token_id = ids[2]
    try:
        stopped = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)
        ignored = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                                    use_tqdm=False)
    finally:
        tiny_llm.tokenizer.eos_token_id = eos
    first = ids.index(ids[2])
    assert stopped[0].outputs[0].token_ids == ids[: first + 1]
    assert stopped[0].outputs[0].finish_reason == "stop"
    assert ignored[0].outputs[0].token_ids == ids and ignored[0].outputs[0].finish_reason == "length"


def test_logprobs(tiny_llm):
    out = tiny_llm.generate("abc", SamplingParams(temperature=0, max_tokens=4, logprobs=3, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 4
    for token, step in zip(out.token_ids, out.logprobs):
        assert token in step and step[token] == max(step.values())  # greedy picks the top token
    assert out.cumulative_logprob == pytest.approx(sum(s[t] for t, s in zip(out.token_ids, out.logprobs)))


def test_chat_applies_the_template(tiny_llm):
    messages = [{"role": "user", "content": "hi"}]
    out = tiny_llm.chat(messages, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    expected = tiny_llm.tokenizer.apply_chat_template(messages)
    assert out[0].prompt == expected and expected.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="messages must be a non-empty list"):
        tiny_llm.chat([], SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        tiny_llm.chat([{"content": "no role"}], SamplingParams(max_tokens=3))


@pytest.mark.slow
def test_real_model_answers_a_chat_question(real_llm):
    out = real_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                        SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"  # it ends with <|im_end|> rather than running out of tokens
