"""Chapter 00: the tokenizers round-trip text, keep special tokens whole and render the chat template."""

import pytest

from minipaged.model.tokenizer import ByteTokenizer

TEXTS = ["Hello world", "Héllo 😀 naïve", "x = 12345 +  67\n\n\tend", "def f():\n    return 1"]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text.encode()) and tok.decode(ids) == text


def test_byte_tokenizer_special_tokens():
    tok = ByteTokenizer()
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert ids == [256, ord("h"), ord("i"), 257]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>hi<|im_end|>"


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_smollm_tokenizer_round_trip(real_llm, text):
    tok = real_llm.tokenizer
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.slow
def test_smollm_tokenizer_facts(real_llm):
    tok = real_llm.tokenizer
    assert tok.vocab_size == 49152
    assert tok.encode("<|im_start|>user\nHi<|im_end|>")[0] == 1 and tok.encode("<|im_end|>") == [2]
    # "smollm" pre-tokenizer: every digit is its own token
    assert [tok.decode([i]) for i in tok.encode("2024")] == ["2", "0", "2", "4"]
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat.startswith("<|im_start|>system\n") and chat.endswith("<|im_start|>user\nHi<|im_end|>\n"
                                                                      "<|im_start|>assistant\n")
