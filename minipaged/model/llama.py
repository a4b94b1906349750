"""A Llama-architecture decoder in plain PyTorch, small enough to read in one sitting.

SmolLM2-135M is a Llama: RMSNorm before each sub-layer, rotary position embeddings (RoPE),
grouped-query attention (9 query heads share 3 K/V heads) and a SwiGLU feed-forward.

The model knows nothing about where K and V are stored. Each attention layer computes q, k, v for
the new tokens and hands them to a `kv` object:

    out = kv.attend(layer_index, q, k, v)

The `kv` object stores k and v wherever its policy says (a tensor per request, a contiguous slab,
paged blocks...) and returns attention over everything the sequence has cached so far. That is the
seam where every chapter plugs in a new memory policy without touching this file.

Four things here are for speed, each measured (docs/pages/speed.md): q, k and v come from one stacked
projection and gate and up from another; RoPE's cos and sin are computed once per forward pass;
`Linear` splits a thin product over the CPU's threads; and inside the engine (``kernels.enabled()``)
RMSNorm, RoPE, SwiGLU's middle and the products of up to 512 rows each run as one compiled call
(model/kernels.py), the products on a copy of the weight laid out for them (``Linear.packed``).
Each of those is marked `if kernels.use(x):`, and the PyTorch lines under it are the math it
computes and the oracle it is tested against.

Shapes: T = number of new tokens in this forward pass (all sequences flattened together),
D = hidden_size, H = num_heads, KVH = num_kv_heads, Dh = head_dim, V = vocab_size.

Not handled: rope scaling variants, attention biases, sliding windows, bf16 fast paths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minipaged.model import kernels
from minipaged.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # x [T, D]
        if kernels.use(x):  # the lines below in one compiled call
            return kernels.ops().rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Linear(nn.Linear):
    """nn.Linear (no bias) that, for inputs of up to SPLIT_ROWS rows, runs as one batched matmul over
    the weight's row blocks, one block per thread.

    Why this is here: a decode step multiplies every weight matrix by a handful of rows, and on this
    course's CPU MKL runs such a thin product on one core even when two are there, at about half the
    memory bandwidth the machine has. Viewing the weight [out, in] as P blocks [P, out / P, in] costs
    no copy, and `torch.bmm` gives each block to its own thread: the same dot products, on every core
    (docs/pages/speed.md has the measurements). From a few hundred rows on (prefill) MKL's own
    threading is as fast or faster, so larger inputs take the plain path.

    Inside the engine, up to PACKED_ROWS rows go to a compiled product (model/kernels.py) that reads
    the weight laid out in panels of 16 rows (``packed``): a second copy of the weight, in the order
    that product reads it, made when the engine is built (or else on first use).
    """

    SPLIT_ROWS = 128  # inputs with at most this many rows use the blocked product
    PACKED_ROWS = 512  # inputs with at most this many rows use the compiled product, when it is on (at
    #                    512 rows it is still ahead of MKL here, at 1024 about even: scripts/thin_matmul.py)
    PANEL = 16  # output columns per panel of the packed weight

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x):  # x [T, in] -> [T, out]
        T, (out, inp) = x.shape[0], self.weight.shape
        if T <= self.PACKED_ROWS and kernels.use(x):  # y = x Wᵀ compiled, on the weight in panels
            return kernels.ops().packed_linear(x, self.packed(), out)
        parts = torch.get_num_threads()
        if T > self.SPLIT_ROWS or parts < 2 or out % parts:
            return F.linear(x, self.weight)
        blocks = self.weight.view(parts, out // parts, inp).transpose(1, 2)  # [P, in, out / P], a view
        y = torch.bmm(x.expand(parts, T, inp), blocks)  # [P, T, out / P]
        return y.transpose(0, 1).reshape(T, out)

    def packed(self):  # W [out, in] -> [ceil(out / 16), in, 16]: packed[p, k, c] = W[16 p + c, k]
        """The weight in panels of 16 rows, each stored input by input. Rows past ``out`` are zero.
        Kept, and made again when the weight is another tensor or PyTorch counts an in-place edit of
        it; a write it does not count (through ``.data``, or a NumPy view) is not seen."""
        w = self.weight
        key = (w.data_ptr(), 0 if w.is_inference() else w._version, w.shape)  # inference tensors keep no count
        if getattr(self, "_packed_key", None) != key:
            out, inp = w.shape
            padded = F.pad(w.detach(), (0, 0, 0, -out % self.PANEL))  # [P * 16, in]
            self._packed = padded.view(-1, self.PANEL, inp).transpose(1, 2).contiguous()  # [P, in, 16]
            self._packed_key = key
        return self._packed


class Rotary(nn.Module):
    """RoPE: rotate each (i, i + Dh/2) pair of q and k by an angle proportional to the position.

    The "rotate half" layout pairs dimension i with i + Dh/2. llama.cpp's GGUF files store q and k
    permuted for a layout that pairs adjacent dimensions; the loader undoes that permutation.
    The angles depend on the positions only, so the model computes cos and sin once per forward
    pass (``angles``) and every layer reuses them (``rotate``).
    """

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [Dh/2]

    def angles(self, positions):  # positions [T] -> cos, sin [T, 1, Dh]
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, Dh/2]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, Dh]
        return angles.cos(), angles.sin()

    @staticmethod
    def rotate(x, cos, sin):  # x [T, heads, Dh]
        if kernels.use(x):  # the lines below in one compiled call
            return kernels.ops().rotary(x, cos, sin)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v projections stacked into one matrix, [(H + 2 KVH) * Dh, D]: one matmul reads x once
        # and runs at a better rate than three thin ones (the loader stacks the checkpoint's three)
        self.qkv_proj = Linear(cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim)
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size)

    def forward(self, x, cos, sin, kv):  # x [T, D]; cos, sin [T, 1, Dh]
        T, H, KVH = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(T, H + 2 * KVH, self.head_dim)  # [T, H + 2 KVH, Dh]
        qk = Rotary.rotate(qkv[:, :H + KVH], cos, sin)  # q and k rotated together: [T, H + KVH, Dh]
        q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KVH:]  # [T, H, Dh], [T, KVH, Dh], [T, KVH, Dh]
        out = kv.attend(self.layer_index, q, k, v)  # [T, H, Dh]: the only line that touches the cache
        return self.o_proj(out.reshape(T, H * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        # gate and up stacked, [2F, D]: one matmul instead of two, for the same reason as qkv_proj
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x):  # SwiGLU: down(silu(gate(x)) * up(x))
        if kernels.use(x):  # silu(gate) * up in one compiled call
            return self.down_proj(kernels.ops().silu_and_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # [T, F] each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_index)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, token_ids, positions, kv, logits_rows=None):
        """token_ids [T], positions [T] -> logits [len(logits_rows) or T, V].

        `logits_rows` picks the rows whose next-token logits are wanted (usually the last token of
        each sequence); the vocabulary projection is the single largest matmul, so skipping the
        other rows saves real time during prefill.
        """
        x = self.embed_tokens(token_ids)  # [T, D]
        cos, sin = self.rotary.angles(positions)  # [T, 1, Dh] each, shared by every layer
        for layer in self.layers:
            x = layer(x, cos, sin, kv)
        if logits_rows is not None:
            x = x[logits_rows]
        return self.lm_head(self.norm(x)).float()

    @property
    def device(self):
        return self.embed_tokens.weight.device

    @property
    def dtype(self):
        return self.embed_tokens.weight.dtype
