"""The models minipaged can serve, by name.

    "smollm2-135m"          SmolLM2-135M-Instruct from its GGUF file (fetched when missing)
    "smollm2-135m-random"   the same shapes with seeded random weights (benchmarks without the file)
    "tiny"                  2 layers, 64 wide, byte tokenizer, seeded random weights (fast tests)
    a path to a .gguf file  any Llama-architecture GGUF with a byte-level BPE tokenizer
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minipaged.model.config import SMOLLM2_135M, TINY, ModelConfig
from minipaged.model.llama import LlamaModel
from minipaged.model.random import ByteTokenizer, random_model
from minipaged.model.tokenizer import GGUFTokenizer

MODEL_NAMES = ("smollm2-135m", "smollm2-135m-random", "tiny")
_ALIASES = {
    "smollm2-135m-instruct": "smollm2-135m",
    "huggingfacetb/smollm2-135m-instruct": "smollm2-135m",
    "smollm2": "smollm2-135m",
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: object
    config: ModelConfig


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype={dtype!r} is not supported; choose one of {list(DTYPES)}")


def load_model(name: str, dtype="float32", seed: int = 0, progress: bool = True, device="cpu") -> LoadedModel:
    torch_dtype = resolve_dtype(dtype)
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key == "tiny":
        model, tok = random_model(TINY, seed=seed, dtype=torch_dtype), ByteTokenizer()
    elif key == "smollm2-135m-random":
        model = random_model(SMOLLM2_135M, seed=seed, dtype=torch_dtype)
        tok = _real_tokenizer_if_on_disk() or ByteTokenizer()
    elif key == "smollm2-135m" or str(name).endswith(".gguf"):
        from minipaged.model.fetch import gguf_path
        from minipaged.model.gguf_loader import load_llama

        path = gguf_path(progress=progress) if key == "smollm2-135m" else name
        model, _, reader = load_llama(path, dtype=torch_dtype, progress=progress)
        tok = GGUFTokenizer(reader)
    else:
        raise ValueError(f"model={name!r} is not known; choose one of {list(MODEL_NAMES)} "
                         "or give a path to a .gguf file")
    model = model.to(device)
    return LoadedModel(model, tok, model.config)


def _real_tokenizer_if_on_disk():
    from minipaged.model.fetch import find_gguf
    from minipaged.model.gguf_loader import open_gguf

    path = find_gguf()
    return GGUFTokenizer(open_gguf(path)) if path else None
