"""Read a Llama model out of a GGUF file: its shapes, its weights and its tokenizer's metadata.

GGUF is llama.cpp's single-file format: a header of key/value metadata, then tensors, many of them
quantized (SmolLM2's file uses Q4_1 for the linear layers and Q8_0 for the embedding). The `gguf`
package reads the file and dequantizes each tensor to fp32; we only rename tensors, stack the
ones the model fuses (q, k, v; gate, up), and undo one llama.cpp quirk:

    llama.cpp's converter permutes the rows of attn_q and attn_k so that its RoPE kernel can rotate
    *adjacent* pairs (0,1), (2,3)... Our model rotates pairs (i, i + Dh/2) like the original
    checkpoint, so we permute the rows back.

Not handled: architectures other than llama, files split into several parts, rope scaling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from minipaged.model.config import ModelConfig
from minipaged.model.llama import LlamaModel

# GGUF tensor name (inside blk.N.) -> (our weight inside layers.N., which of its stacked parts). The
# model stacks q, k, v into one qkv_proj and gate, up into one gate_up_proj (llama.py says why).
_LAYER_NAMES = {
    "attn_norm": ("input_layernorm", 0),
    "attn_q": ("self_attn.qkv_proj", 0),
    "attn_k": ("self_attn.qkv_proj", 1),
    "attn_v": ("self_attn.qkv_proj", 2),
    "attn_output": ("self_attn.o_proj", 0),
    "ffn_norm": ("post_attention_layernorm", 0),
    "ffn_gate": ("mlp.gate_up_proj", 0),
    "ffn_up": ("mlp.gate_up_proj", 1),
    "ffn_down": ("mlp.down_proj", 0),
}


def open_gguf(path: str | Path):
    from gguf import GGUFReader

    return GGUFReader(str(path))


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_config(reader, name: str = "smollm2-135m") -> ModelConfig:
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"general.architecture={arch!r}: only 'llama' GGUF files are supported")
    p = f"{arch}."
    hidden = int(field(reader, p + "embedding_length"))
    heads = int(field(reader, p + "attention.head_count"))
    vocab = field(reader, p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    return ModelConfig(
        name=name,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(field(reader, p + "feed_forward_length")),
        num_layers=int(field(reader, p + "block_count")),
        num_heads=heads,
        num_kv_heads=int(field(reader, p + "attention.head_count_kv", heads)),
        head_dim=int(field(reader, p + "rope.dimension_count", hidden // heads)),
        rope_theta=float(field(reader, p + "rope.freq_base", 10000.0)),
        rms_norm_eps=float(field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        max_model_len=int(field(reader, p + "context_length", 2048)),
        bos_token_id=int(field(reader, "tokenizer.ggml.bos_token_id", 1)),
        eos_token_id=int(field(reader, "tokenizer.ggml.eos_token_id", 2)),
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
    )


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of attn_q / attn_k.

    w [num_heads * Dh, D]. Inside each head, llama.cpp interleaved the two halves of the rows
    (row order 0, Dh/2, 1, Dh/2+1, ...); this puts them back in order 0, 1, ..., Dh-1.
    """
    rows, cols = w.shape
    half = rows // num_heads // 2
    return w.reshape(num_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def dequantized_tensors(reader):
    """Yield (name, fp32 numpy array in PyTorch's [out, in] layout) for every tensor in the file."""
    from gguf import dequantize

    for t in reader.tensors:
        # GGUF lists shapes fastest-dimension first; dequantize returns numpy's (row-major) order.
        array = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        yield t.name, array.astype(np.float32, copy=False)


_READ: dict = {}  # (path, size, mtime) -> (config, reader, fp32 weights by our names): the last file read


def read_llama(path: str | Path, progress: bool = True):
    """Parse a GGUF file and dequantize its weights to fp32 numpy arrays under the model's names.
    Returns (config, reader, state). Parsing SmolLM2's file takes seconds (most of it the tokenizer's
    49,152 strings), so the last file read is kept for the process: a second engine, a test or a
    benchmark that builds several, gets it at once."""
    from tqdm import tqdm

    stat = Path(path).stat()
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _READ:
        return _READ[key]
    reader = open_gguf(path)
    cfg = read_config(reader)
    state, parts = {}, {}
    for name, array in tqdm(dequantized_tensors(reader), total=len(reader.tensors), desc="loading weights",
                            unit="tensor", disable=not progress):
        if name == "token_embd.weight":
            state["embed_tokens.weight"] = array
        elif name == "output_norm.weight":
            state["norm.weight"] = array
        elif name == "output.weight":
            state["lm_head.weight"] = array
        elif name.startswith("blk."):
            _, layer, kind, _ = name.split(".")
            if kind == "attn_q":
                array = unpermute_rope_rows(array, cfg.num_heads)
            elif kind == "attn_k":
                array = unpermute_rope_rows(array, cfg.num_kv_heads)
            target, part = _LAYER_NAMES[kind]
            parts.setdefault(f"layers.{layer}.{target}.weight", {})[part] = array
    for name, pieces in parts.items():  # stack the parts in order (one piece: the tensor itself)
        state[name] = np.concatenate([pieces[i] for i in sorted(pieces)], axis=0)
    _READ.clear()
    _READ[key] = cfg, reader, state
    return _READ[key]


def load_llama(path: str | Path, dtype=torch.float32, progress: bool = True):
    """Build a LlamaModel from a GGUF file. Returns (model, config, reader). Every model gets weights
    of its own (copies of what read_llama keeps), so nothing one engine does reaches another."""
    cfg, reader, state = read_llama(path, progress)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    # np.array copies: F32 tensors come memory-mapped and read-only straight from the file, and the
    # arrays read_llama keeps must stay as they are.
    tensors = {k: torch.from_numpy(np.array(v, dtype=np.float32)).to(dtype) for k, v in state.items()}
    if cfg.tie_word_embeddings:
        tensors["lm_head.weight"] = tensors["embed_tokens.weight"]
    model.load_state_dict(tensors, assign=True, strict=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary = type(model.rotary)(cfg.head_dim, cfg.rope_theta)  # rebuild buffers off the meta device
    return model.eval(), cfg, reader
