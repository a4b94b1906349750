"""Chapter 00: our SmolLM2 equals HF Transformers loading the same GGUF file.

Prompt token ids must be equal, and greedy outputs of 32 tokens equal token for token in fp32. If
the two ever part, the first differing step must be a near tie in both models (top-2 logit gap
under 1e-3): float sums in another order may then legitimately pick the other token. Anything
else fails.
"""

import pytest
import torch

from minipaged.kv.per_request import NoCache
from tests.conftest import PARITY_PROMPTS

transformers = pytest.importorskip("transformers", reason="HF Transformers is needed for the parity test")

pytestmark = pytest.mark.slow
NEW_TOKENS = 32
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def hf(real_llm):
    from minipaged.model.fetch import gguf_path

    path = gguf_path()
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    return tok, model.eval()


def prompt_text(llm, kind, text):
    if kind == "chat":
        return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return text


def hf_greedy(model, ids, new_tokens):
    """HF's own forward pass and KV cache, argmax at every step, EOS not special (like ignore_eos)."""
    out, tokens = [], torch.tensor([ids])
    past = None
    with torch.no_grad():
        for _ in range(new_tokens):
            result = model(tokens, past_key_values=past, use_cache=True)
            past = result.past_key_values
            out.append(int(result.logits[0, -1].argmax()))
            tokens = torch.tensor([[out[-1]]])
    return out


def top2_gap(logits):
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("kind,text", PARITY_PROMPTS)
def test_prompt_token_ids_equal(real_llm, hf, kind, text):
    hf_tok, _ = hf
    full = prompt_text(real_llm, kind, text)
    assert real_llm.tokenizer.encode(full) == hf_tok.encode(full, add_special_tokens=False)


def test_chat_template_equal(real_llm, hf):
    hf_tok, _ = hf
    messages = [{"role": "user", "content": "Hi there"}]
    ours = real_llm.tokenizer.apply_chat_template(messages)
    theirs = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs


@pytest.mark.parametrize("kind,text", PARITY_PROMPTS)
def test_greedy_outputs_equal(real_llm, hf, kind, text):
    from minipaged import SamplingParams

    _, hf_model = hf
    ids = real_llm.tokenizer.encode(prompt_text(real_llm, kind, text))
    ours = real_llm.generate([ids], SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0].token_ids
    theirs = hf_greedy(hf_model, ids, NEW_TOKENS)
    if ours == theirs:
        return
    step = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    context = torch.tensor([ids + ours[:step]])
    with torch.no_grad():
        hf_logits = hf_model(context).logits[0, -1]
    our_logits = real_llm.model(context[0], torch.arange(context.shape[1]), NoCache())[-1]
    gaps = top2_gap(our_logits), top2_gap(hf_logits)
    assert max(gaps) < NEAR_TIE, (
        f"outputs part at step {step} ({ours[step]} vs {theirs[step]}) without a near tie: top-2 gaps {gaps}"
    )


@pytest.mark.parametrize("kind,text,penalty", [(*PARITY_PROMPTS[1], 1.3), (*PARITY_PROMPTS[2], 0.8)])
def test_greedy_with_repetition_penalty_equals_hf_generate(real_llm, hf, kind, text, penalty):
    """HF's generate(repetition_penalty=...) counts the prompt and the output, as vLLM does. Both stop
    at the end-of-sequence token. The first difference, if any, must be a near tie of the penalized
    logits (the engine multiplies by 1 / penalty where HF divides: the last bit may differ)."""
    from minipaged import SamplingParams
    from minipaged.penalties import penalized_logits

    _, hf_model = hf
    ids = real_llm.tokenizer.encode(prompt_text(real_llm, kind, text))
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, repetition_penalty=penalty)
    ours = real_llm.generate([ids], params, use_tqdm=False)[0].outputs[0].token_ids
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=NEW_TOKENS, do_sample=False, repetition_penalty=penalty,
                                pad_token_id=real_llm.tokenizer.eos_token_id)
    theirs = out[0, len(ids):].tolist()
    plain = real_llm.generate([ids], SamplingParams(temperature=0, max_tokens=NEW_TOKENS), use_tqdm=False)
    assert ours != plain[0].outputs[0].token_ids, "the penalty changed nothing: pick a prompt where it does"
    if ours == theirs:
        return
    step = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    context = ids + ours[:step]
    our_logits = real_llm.model(torch.tensor(context), torch.arange(len(context)), NoCache())[-1]
    gap = top2_gap(penalized_logits(our_logits, params, ids, ours[:step]))
    assert gap < NEAR_TIE, (f"outputs part at step {step} without a near tie (gap {gap}); "
                            f"without the penalty the engine wrote {plain[0].outputs[0].token_ids[:step + 2]}")
