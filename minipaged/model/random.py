"""Models without the model file: seeded random weights of any shapes, and a tokenizer of bytes.

    random_model(TINY, seed=0)     "tiny" (2 layers, 64 wide) and "smollm2-135m-random" are these
    ByteTokenizer()                one token per UTF-8 byte, plus the chat template's special tokens

For tests and benchmarks: the engine's math on them is the same as on the real model, only the text
is noise. Not handled: anything but the Llama architecture of llama.py.
"""

from __future__ import annotations

import torch

from minipaged.model.config import ModelConfig
from minipaged.model.llama import LlamaModel
from minipaged.model.tokenizer import ChatTemplateMixin


def random_model(cfg: ModelConfig, seed: int = 0, dtype=torch.float32) -> LlamaModel:
    """A model of `cfg`'s shapes with seeded random weights (for tests and benchmarks).

    Embeddings are N(0, 1) and each linear layer N(0, 1/fan_in), so activations keep their scale
    through the layers. With an untied output matrix (as "tiny" has), greedy decoding then walks
    through many different tokens instead of repeating one, which keeps output-equality tests honest.
    """
    gen = torch.Generator().manual_seed(seed)
    model = LlamaModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm gains
                p.fill_(1.0)
            elif name == "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    return model.to(dtype).eval()


class ByteTokenizer(ChatTemplateMixin):
    """One token per UTF-8 byte (ids 0..255), plus three special tokens. For the tiny test model.

    <|im_start|> = 256 (also BOS), <|im_end|> = 257 (EOS), <|endoftext|> = 258.
    """

    SPECIAL = {"<|im_start|>": 256, "<|im_end|>": 257, "<|endoftext|>": 258}

    def __init__(self):
        self.vocab_size = 259
        self.bos_token_id = 256
        self.eos_token_id = 257

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for name, sid in self.SPECIAL.items():
                if text.startswith(name, i):
                    ids.append(sid)
                    i += len(name)
                    break
            else:
                ids.extend(text[i].encode("utf-8"))
                i += 1
        return ids

    def id_to_token(self, token_id: int) -> str:
        """A printable ASCII byte as itself, any other byte as <0xNN>, a special token by its name."""
        for name, sid in self.SPECIAL.items():
            if sid == token_id:
                return name
        return chr(token_id) if 32 <= token_id < 127 else f"<0x{token_id:02X}>"

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        names = {v: k for k, v in self.SPECIAL.items()}
        out, pending = [], bytearray()
        for i in ids:
            if i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            if not skip_special_tokens:
                out.append(names.get(i, ""))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)
