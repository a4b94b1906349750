"""Penalties and logit bias (minipaged/sampling.py), with vLLM's meanings: each checked against a
straightforward loop over the vocabulary written here, the repetition penalty also against HF
Transformers' own processor, and the whole engine's choices against the same rule applied by hand.
Then they compose: n, seeds, prefix caching, chunked prefill, speculation and preemption (by recompute
or swap) change no token."""

import math

import pytest
import torch

from minipaged import LLM, SamplingParams
from minipaged.penalties import penalized_logits


def naive_penalties(logits, prompt, output, presence=0.0, frequency=0.0, repetition=1.0, bias=None):
    """The definitions, one token at a time."""
    out = [float(x) for x in logits]
    for t, b in (bias or {}).items():
        out[t] += max(-100.0, min(100.0, b))
    for t in range(len(out)):
        if t in prompt or t in output:
            out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
        out[t] -= frequency * output.count(t) + presence * (1 if t in output else 0)
    return torch.tensor(out)


@pytest.mark.parametrize("seed", range(6))
def test_each_rule_equals_its_definition(seed):
    g = torch.Generator().manual_seed(seed)
    vocab = 40
    logits = torch.randn(vocab, generator=g) * 3
    prompt = torch.randint(0, vocab, (7,), generator=g).tolist()
    output = torch.randint(0, vocab, (12,), generator=g).tolist()  # repeats: counts above 1
    kw = dict(presence=[0.0, 0.7, -1.5][seed % 3], frequency=[0.4, 0.0, 2.0][seed % 3],
              repetition=[1.0, 1.3, 0.6][seed % 3], bias={3: 2.5, 11: -250.0} if seed % 2 else None)
    params = SamplingParams(presence_penalty=kw["presence"], frequency_penalty=kw["frequency"],
                            repetition_penalty=kw["repetition"], logit_bias=kw["bias"])
    ours = penalized_logits(logits, params, prompt, output)
    assert torch.allclose(ours, naive_penalties(logits, prompt, output, **kw), atol=1e-5)
    assert torch.equal(logits, logits.clone())  # the input row is left alone


def test_repetition_penalty_equals_hf_transformers_processor():
    transformers = pytest.importorskip("transformers", reason="HF Transformers is the oracle here")
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 50, generator=g) * 4
    history = torch.randint(0, 50, (1, 20), generator=g)  # HF sees prompt and output as one sequence
    theirs = transformers.RepetitionPenaltyLogitsProcessor(1.7)(history, logits.clone())
    ids = history[0].tolist()
    ours = penalized_logits(logits[0], SamplingParams(repetition_penalty=1.7), ids[:8], ids[8:])
    assert torch.allclose(ours, theirs[0], atol=1e-6)


def test_presence_and_frequency_ignore_the_prompt_repetition_does_not():
    logits = torch.full((10,), 2.0)
    prompt, output = [1, 1, 2], [2, 3, 3]
    freq = penalized_logits(logits, SamplingParams(frequency_penalty=0.5), prompt, output)
    assert freq.tolist() == [2.0, 2.0, 1.5, 1.0] + [2.0] * 6  # token 1 is only in the prompt
    pres = penalized_logits(logits, SamplingParams(presence_penalty=0.5), prompt, output)
    assert pres.tolist() == [2.0, 2.0, 1.5, 1.5] + [2.0] * 6
    rep = penalized_logits(torch.tensor([2.0, 2.0, -2.0, 2.0, 2.0]), SamplingParams(repetition_penalty=2.0),
                           prompt, output)
    assert rep.tolist() == [2.0, 1.0, -4.0, 1.0, 2.0]  # positive divided, negative multiplied


@pytest.mark.parametrize("field,value", [
    ("presence_penalty", 2.5), ("presence_penalty", float("nan")), ("presence_penalty", "high"),
    ("frequency_penalty", -2.01), ("frequency_penalty", True), ("repetition_penalty", 0),
    ("repetition_penalty", -1.0), ("repetition_penalty", float("inf")), ("logit_bias", [1, 2]),
    ("logit_bias", {"x": 1.0}), ("logit_bias", {-1: 1.0}), ("logit_bias", {3: float("nan")}),
    ("logit_bias", {3: "up"}),
])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}=.*not allowed"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("bias", [{"5": 1.0, 5: -1.0}, {"5": 1.0, "05": -1.0}, {"05": 1.0, 5: 2.0}])
def test_a_token_named_twice_in_logit_bias_is_refused(bias):
    """Both keys mean token 5: which bias was meant? (Before, the last one won, silently.)"""
    with pytest.raises(ValueError, match=r"SamplingParams.logit_bias=.*not allowed: .*token 5 is named more than once"):
        SamplingParams(logit_bias=bias)
    assert SamplingParams(logit_bias={"05": 1.0}).logit_bias == {5: 1.0}  # alone, it is token 5, as int() reads it


def test_ten_thousand_bad_token_ids_give_a_short_message(tiny_llm):
    """Every out-of-vocabulary key used to be echoed back: a 100 kB error for a 10,000-key bias."""
    for params in (SamplingParams(logit_bias={i: 1.0 for i in range(10_000)}),
                   SamplingParams(stop_token_ids=list(range(10_000)))):
        with pytest.raises(ValueError) as e:
            tiny_llm.generate(["hi"], params, use_tqdm=False)
        assert len(str(e.value)) < 300 and "not allowed: token ids in [0, 259)" in str(e.value)
        assert "259" in str(e.value) and "... 9733 more" in str(e.value)  # 9,741 bad ones: the first 8 shown
    tiny_llm.engine.check_invariants(idle=True)


def test_logit_bias_is_clamped_like_vllm_and_checked_against_the_vocabulary(tiny_llm):
    assert SamplingParams(logit_bias={"7": 300, 9: -1e6}).logit_bias == {7: 100.0, 9: -100.0}
    vocab = tiny_llm.model.config.vocab_size
    with pytest.raises(ValueError, match="logit_bias"):
        tiny_llm.generate(["hi"], SamplingParams(logit_bias={vocab: 1.0}), use_tqdm=False)
    tiny_llm.engine.check_invariants(idle=True)  # refused before any block was taken


# ---------------------------------------------------------------- the engine chooses by the same rule

def engine_tokens(llm, prompts, params, **kw):
    outs = llm.generate(prompts, params, use_tqdm=False, **kw)
    return [[c.token_ids for c in o.outputs] for o in outs]


# Tokens 5, 9 and 12 are pushed up by the bias, and each one written is pushed down by the penalties
# until the others are ahead: the output cycles through them in an order set by its own history at
# every step (a penalty applied to the wrong history changes the tokens), and the cycle gives the
# n-gram proposer of chapter 09 drafts to get right.
PUSHED = dict(logit_bias={5: 8.0, 9: 8.0, 12: 8.0}, frequency_penalty=0.3, presence_penalty=0.2,
              repetition_penalty=1.1)


def by_hand_greedy(llm, prompt_ids, params, steps):
    """Greedy decoding with the penalties applied here, from the full model's logits each step."""
    from minipaged.kv.per_request import NoCache

    out = []
    for _ in range(steps):
        ids = prompt_ids + out
        logits = llm.model(torch.tensor(ids), torch.arange(len(ids)), NoCache())[-1]
        out.append(int(naive_penalties(logits, prompt_ids, out, presence=params.presence_penalty,
                                       frequency=params.frequency_penalty,
                                       repetition=params.repetition_penalty,
                                       bias=params.logit_bias).argmax()))
    return out


def test_greedy_engine_equals_penalties_by_hand(tiny_llm):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, **PUSHED)
    prompt = tiny_llm.tokenizer.encode("a b c d e f")
    ours = engine_tokens(tiny_llm, [prompt], params)[0][0]
    assert ours == by_hand_greedy(tiny_llm, prompt, params, 20)
    plain = engine_tokens(tiny_llm, [prompt], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0][0]
    assert ours != plain and ours.count(5) >= 2  # the penalties did something, and the bias did too


@pytest.fixture(scope="module")
def engines():
    """The same tiny model under every feature the penalties must compose with."""
    common = dict(progress=False, max_model_len=256)
    return {
        "plain": LLM("tiny", enable_prefix_caching=False, **common),
        "prefix": LLM("tiny", enable_prefix_caching=True, **common),
        "chunked": LLM("tiny", enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=8, **common),
        "spec": LLM("tiny", speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                "prompt_lookup_max": 2, "prompt_lookup_min": 1}, **common),
    }


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_penalties_compose_with_every_engine_feature(engines, temperature):
    shared = "one two three four five six seven eight nine ten eleven twelve " * 2
    prompts = [shared + "alpha", shared + "beta", "short one"]
    # the first prompt's 3 samples share its blocks; the others run alone, so they get drafts (chapter 09)
    params = [SamplingParams(temperature=temperature, seed=11 + i, n=n, max_tokens=24, ignore_eos=True, **PUSHED)
              for i, n in enumerate((3, 1, 1))]
    want = engine_tokens(engines["plain"], prompts, params)
    for name in ("prefix", "chunked", "spec"):
        assert engine_tokens(engines[name], prompts, params) == want, name
    again = engine_tokens(engines["prefix"], prompts, params)  # now the shared prefix is a cache hit
    assert again == want
    assert engines["prefix"].engine.policy.stats["hit_tokens"] > 0
    assert engines["spec"].engine.stats["spec_accepted_tokens"] > 0, "no draft accepted: speculation not exercised"
    for llm in engines.values():
        llm.engine.check_invariants(idle=True)
    # each of the n samples penalizes its own history: with sampling they part, greedy they agree
    assert (len({tuple(s) for s in want[0]}) > 1) == (temperature > 0)


def test_seeded_sampling_with_penalties_repeats_alone_or_in_a_batch(tiny_llm):
    params = SamplingParams(temperature=1.0, seed=4, max_tokens=16, ignore_eos=True, **PUSHED)
    alone = engine_tokens(tiny_llm, ["x y z"], params)[0][0]
    crowd = engine_tokens(tiny_llm, ["other prompt", "x y z", "more"],
                          [SamplingParams(temperature=1.0, max_tokens=9), params,
                           SamplingParams(temperature=0.5, max_tokens=20, presence_penalty=1.0)])[1][0]
    assert alone == crowd


def test_logprobs_stay_the_raw_models(tiny_llm):
    prompt = tiny_llm.tokenizer.encode("p q r")
    base = SamplingParams(temperature=0, max_tokens=1, logprobs=3)
    raw = tiny_llm.generate([prompt], base, use_tqdm=False)[0].outputs[0].logprobs[0]
    pushed = tiny_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=3,
                                                        logit_bias={5: 100.0}), use_tqdm=False)[0].outputs[0]
    assert pushed.token_ids == [5]
    for token, lp in raw.items():
        assert math.isclose(pushed.logprobs[0][token], lp, abs_tol=1e-6)


# ---------------------------------------------------------------- extreme penalties stay finite

@pytest.mark.parametrize("penalty", [5e-324, 1e-300, 1e-37, 1e37, 1e300])
def test_an_extreme_repetition_penalty_keeps_every_logit_finite(penalty):
    """vLLM takes any repetition penalty above 0. In float32, 1e300 (or 1e-37 on a biased logit of
    100) is an infinite logit, and a softmax over it NaN: the sampler failed, and with it the whole
    engine step of every request in the batch. The scaled logits stay within ±LOGIT_LIMIT instead,
    in the order the penalty puts them."""
    from minipaged.penalties import LOGIT_LIMIT
    from minipaged.sampling import sample_token

    logits = torch.tensor([3.0, -2.0, 0.0, 5.0, -7.0, 1.0])
    params = SamplingParams(repetition_penalty=penalty, logit_bias={0: 100.0, 3: 100.0}, temperature=1e-5)
    out = penalized_logits(logits, params, [0, 1, 2, 3], [4])  # token 5 alone is unseen
    assert torch.isfinite(out).all() and out.abs().max() <= LOGIT_LIMIT
    assert out[5] == 1.0 and out[2] == 0.0  # unseen, and a zero logit, are left alone
    if penalty < 1:  # seen positives pushed up, seen negatives pulled toward 0
        assert out[0] >= out[3] > out[5] > out[1] >= out[4] > -1e-30
    else:  # seen positives pulled toward 0, seen negatives pushed down
        assert out[5] > out[3] >= out[0] >= 0 >= out[1] >= out[4]
    g = torch.Generator().manual_seed(0)
    for temperature in (1e-5, 1.0):  # the smallest temperature that samples divides by 1e-5
        token = sample_token(out, SamplingParams(temperature=temperature), g)
        assert token in ((0, 3) if penalty < 1 else (5,))


def test_an_extreme_repetition_penalty_fails_no_step(tiny_llm):
    """Sampled beside an ordinary request: both finish, and every block is back."""
    prompt = [5, 9] * 20  # the biased tokens are in the prompt: the penalty scales them
    params = [SamplingParams(temperature=1.0, seed=1, max_tokens=6, ignore_eos=True, repetition_penalty=penalty,
                             logit_bias={5: 100.0, 9: 100.0}) for penalty in (1e-37, 1e300)]
    outs = tiny_llm.generate([prompt, prompt, "beside them"], [*params, SamplingParams(max_tokens=6)], use_tqdm=False)
    assert set(outs[0].outputs[0].token_ids) <= {5, 9}  # pushed up as far as they go
    assert 5 not in outs[1].outputs[0].token_ids and 9 not in outs[1].outputs[0].token_ids
    assert all(o.finished and o.outputs[0].finish_reason == "length" for o in outs)
    tiny_llm.engine.check_invariants(idle=True)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_preempted_sequence_keeps_penalizing_its_history(mode, temperature):
    """A pool of 12 blocks of 4 tokens cannot hold 5 samples of 30 tokens: the newest are preempted
    and come back (prefilled again, or swapped in). Each must go on penalizing the tokens it wrote
    before it left, so its tokens are those of a pool where nothing is preempted."""
    prompts = [[65 + i] * 6 for i in range(4)]
    params = [SamplingParams(temperature=temperature, seed=3 + i, n=n, max_tokens=24, ignore_eos=True, **PUSHED)
              for i, n in enumerate((1, 2, 1, 1))]
    swap = dict(swap_space_tokens=256) if mode == "swap" else {}
    small = LLM("tiny", block_size=4, kv_capacity_tokens=48, preemption_mode=mode, watermark=0.0, progress=False,
                **swap)
    got = engine_tokens(small, prompts, params)
    assert small.engine.stats["preempted_" + mode] > 0, "nothing was preempted: the test proves nothing"
    roomy = LLM("tiny", progress=False)
    assert got == engine_tokens(roomy, prompts, params)
    plain = [SamplingParams(temperature=temperature, seed=3 + i, n=n, max_tokens=24, ignore_eos=True)
             for i, n in enumerate((1, 2, 1, 1))]
    assert got != engine_tokens(roomy, prompts, plain)  # the penalties mattered
    small.engine.check_invariants(idle=True)


# ---------------------------------------------------------------- min_tokens masks the stop tokens

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_masks_eos_and_stop_token_ids_as_vllm_does(tiny_llm, temperature):
    """vLLM's sampler sets EOS and the stop token ids to -inf until the output has min_tokens tokens,
    so none of them is written before then (even with ignore_eos). They used to be chosen and merely
    not obeyed: a bias of 100 on EOS gave [EOS, EOS, EOS, EOS] for min_tokens=3."""
    eos = tiny_llm.engine.core.eos_token_id
    prompt = tiny_llm.tokenizer.encode("hi")
    for stop_ids, favoured in (([], eos), ([7, 8], 7)):
        params = SamplingParams(temperature=temperature, seed=2, min_tokens=3, max_tokens=8, stop_token_ids=stop_ids,
                                logit_bias={favoured: 100.0}, logprobs=1)
        out = tiny_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        assert len(out.token_ids) == 4 and out.token_ids[3] == favoured and out.finish_reason == "stop"
        assert not {eos, *stop_ids} & set(out.token_ids[:3])
        if temperature == 0:  # the first three are the argmax over the other tokens
            assert out.token_ids[:3] == by_hand_greedy_masked(tiny_llm, prompt, params, {eos, *stop_ids}, 3)
        raw = tiny_llm.model(torch.tensor(prompt), torch.arange(len(prompt)), _no_cache())[-1]
        assert math.isclose(out.logprobs[0][out.token_ids[0]],
                            float(torch.log_softmax(raw.float(), -1)[out.token_ids[0]]), abs_tol=1e-5)  # raw
    ignoring = SamplingParams(temperature=0, min_tokens=3, max_tokens=5, ignore_eos=True, logit_bias={eos: 100.0})
    assert tiny_llm.generate([prompt], ignoring, use_tqdm=False)[0].outputs[0].token_ids[:4] == [
        *by_hand_greedy_masked(tiny_llm, prompt, ignoring, {eos}, 3), eos]
    with pytest.raises(ValueError, match=r"SamplingParams.stop_token_ids=.*some token must be left"):
        tiny_llm.generate([prompt], SamplingParams(min_tokens=1, stop_token_ids=list(range(258))), use_tqdm=False)
    tiny_llm.engine.check_invariants(idle=True)


def _no_cache():
    from minipaged.kv.per_request import NoCache

    return NoCache()


def by_hand_greedy_masked(llm, prompt_ids, params, masked, steps):
    out = []
    for _ in range(steps):
        ids = prompt_ids + out
        logits = naive_penalties(llm.model(torch.tensor(ids), torch.arange(len(ids)), _no_cache())[-1], prompt_ids,
                                 out, bias=params.logit_bias)
        logits[sorted(masked)] = float("-inf")
        out.append(int(logits.argmax()))
    return out
