"""Chapter 00's KV cache: every request keeps its own K and V tensors, grown by concatenation.

This is the simplest cache that works and what a first `generate` loop does: after the prompt's
forward pass, each layer's K and V are kept, and every decode step appends one row per layer. The
next token's query then attends over all rows without recomputing them.

What it does not handle, and what the later chapters fix: memory is not shared or bounded (each
`torch.cat` allocates a new, larger tensor and frees the old one, leaving the allocator to deal with
the holes), and nothing limits how many requests live at once.

`NoCache` is the oracle: it keeps nothing, so the caller must run the whole sequence every step.
"""

from __future__ import annotations

import torch

from minipaged.attention.reference import dense_attention


class PerRequestKVCache:
    """K and V of one sequence, one tensor pair per layer: [num_tokens, num_kv_heads, head_dim]."""

    def __init__(self, num_layers: int):
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    @property
    def num_tokens(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[0]

    def attend(self, layer: int, q, k, v):  # q [T, H, Dh]; k, v [T, KVH, Dh] for the T new tokens
        if self.k[layer] is None:  # prefill: the prompt's K and V
            self.k[layer], self.v[layer] = k, v
        else:  # decode: append the new rows
            self.k[layer] = torch.cat([self.k[layer], k])  # [cached + T, KVH, Dh]
            self.v[layer] = torch.cat([self.v[layer], v])
        cached = self.k[layer].shape[0]
        scale = q.shape[-1] ** -0.5
        return dense_attention(q, self.k[layer], self.v[layer], scale, causal_offset=cached - q.shape[0])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)


class NoCache:
    """Attention over the tokens of this forward pass only (causal); nothing is kept."""

    def attend(self, layer: int, q, k, v):
        return dense_attention(q, k, v, q.shape[-1] ** -0.5, causal_offset=0)


class BatchOfCaches:
    """Several sequences in one forward pass, each with its own PerRequestKVCache.

    The model sees one flat batch of T = sum(new_tokens) tokens; here we split q, k and v back
    into each sequence's rows, let its own cache attend, and glue the outputs together.
    """

    def __init__(self, caches: list[PerRequestKVCache], new_tokens: list[int]):
        self.caches, self.new_tokens = caches, new_tokens

    def attend(self, layer: int, q, k, v):
        outs = [cache.attend(layer, qi, ki, vi) for cache, qi, ki, vi in zip(
            self.caches, q.split(self.new_tokens), k.split(self.new_tokens), v.split(self.new_tokens))]
        return torch.cat(outs)
