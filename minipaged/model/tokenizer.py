"""The tokenizer: SmolLM2's byte-level BPE rebuilt from GGUF metadata (random.py has a byte tokenizer for tests).

The GGUF file carries everything a tokenizer needs: the 49,152 token strings, the 48,900 merges in
priority order, the special tokens and the chat template (a Jinja2 string). We rebuild the tokenizer
with the `tokenizers` library:

- pre-tokenizer "smollm": every digit becomes its own piece, then GPT-2's byte-level split (words,
  numbers, punctuation runs, whitespace runs);
- the model: byte-level BPE with the file's merges;
- special tokens (<|im_start|>, <|im_end|>, <|endoftext|> ...) are matched whole, never split.

Both tokenizers share one small interface: encode(text) -> ids, decode(ids) -> text,
id_to_token(id) -> the token's own string, apply_chat_template(messages) -> text, eos_token_id,
vocab_size.

Not handled: other GGUF tokenizer types (SentencePiece "llama", unigram), added-token normalization.
"""

from __future__ import annotations

import jinja2

# The template vLLM and HF fall back to when a model has none: ChatML, like SmolLM2's own.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateMixin:
    chat_template: str = CHATML_TEMPLATE

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r}")
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        template = env.from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt)


class GGUFTokenizer(ChatTemplateMixin):
    def __init__(self, reader):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        def field(key, default=None):
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        if field("tokenizer.ggml.model") != "gpt2":
            raise ValueError(f"tokenizer.ggml.model={field('tokenizer.ggml.model')!r}: only 'gpt2' "
                             "(byte-level BPE) is supported")
        tokens = field("tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
        types = field("tokenizer.ggml.token_type")
        vocab = {tok: i for i, tok in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        pre = field("tokenizer.ggml.pre", "gpt2")
        splits = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        if pre == "smollm":
            splits.insert(0, pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"))
        tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
        tok.decoder = decoders.ByteLevel()
        # token_type 3 = CONTROL: special tokens, matched whole in the text and hidden when decoding.
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind in zip(tokens, types) if kind == 3])
        self._tok = tok
        self.vocab_size = len(tokens)
        self.bos_token_id = int(field("tokenizer.ggml.bos_token_id", 1))
        self.eos_token_id = int(field("tokenizer.ggml.eos_token_id", 2))
        self.chat_template = field("tokenizer.chat_template") or CHATML_TEMPLATE

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str):
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        """The token as the vocabulary spells it (byte-level: a leading space shows as 'Ġ')."""
        return self._tok.id_to_token(token_id)
