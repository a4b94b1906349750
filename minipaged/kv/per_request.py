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
        """Keep the new tokens' K and V for `layer`, then attend the new queries over every kept row."""
        # exercise 00.1: begin
        if self.k[layer] is None:  # prefill: the prompt's K and V
            self.k[layer], self.v[layer] = k, v
        else:  # decode: append the new rows
            self.k[layer] = torch.cat([self.k[layer], k])  # [cached + T, KVH, Dh]
            self.v[layer] = torch.cat([self.v[layer], v])
        cached = self.k[layer].shape[0]
        scale = q.shape[-1] ** -0.5
        return dense_attention(q, self.k[layer], self.v[layer], scale, causal_offset=cached - q.shape[0])
        # exercise 00.1: end

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


class UnboundedPolicy:
    """The books behind chapter 00's memory, so that its engine runs through the same core as every
    later one: it counts each sequence's tokens and hands out one "slot" per token (the token's
    position; PerRequestRunner keeps the K/V itself). Memory is unbounded: every append succeeds.

    ``fork(parent, child)`` (beam search) gives the child the parent's tokens; the copy to make,
    (parent, child), comes out of ``drain_copies`` into the step's plan (the scheduler drains it), and
    PerRequestRunner clones the parent's tensors:
    a private copy of everything, the unshared oracle for chapter 05's shared blocks.

    Plain Python, no torch. It has no blocks: block_size is 1 and a block table is empty."""

    name = label = "per_request"
    shares_blocks = False
    caches_prefixes = False
    can_fork = True  # every sequence's K/V is private: a fork copies it whole
    can_swap = False
    bounded = False  # nothing to outgrow
    watermark_blocks = 0
    block_size = 1

    def __init__(self, max_model_len: int):
        self.max_model_len = max_model_len
        self.num_blocks = 0
        self._tokens: dict = {}
        self._copies: list = []

    def seq_ids(self) -> list:
        return list(self._tokens)

    def num_tokens(self, seq_id) -> int:
        return self._tokens[seq_id]

    def can_allocate(self, prompt_len: int, max_new_tokens: int, final_len=None) -> bool:
        return True

    def allocate(self, seq_id, prompt_len: int, max_new_tokens: int, final_len=None, token_ids=None) -> None:
        if seq_id in self._tokens:
            raise ValueError(f"seq_id={seq_id!r} is already allocated; free it first")
        self._tokens[seq_id] = 0

    def append_slots(self, seq_id, n: int) -> list[int]:
        start = self._tokens[seq_id]
        self._tokens[seq_id] = start + n
        return list(range(start, start + n))

    def can_append_slots(self, seq_id, n: int = 1) -> bool:
        return True

    def can_append_all(self, appends) -> bool:
        return True

    def truncate(self, seq_id, num_tokens: int) -> None:
        self._tokens[seq_id] = num_tokens

    def fork(self, parent_id, child_id) -> None:
        if child_id in self._tokens:
            raise ValueError(f"seq_id={child_id!r} is already allocated; free it first")
        self._tokens[child_id] = self._tokens[parent_id]
        self._copies.append((parent_id, child_id))

    def free(self, seq_id) -> None:
        del self._tokens[seq_id]

    def block_table(self, seq_id) -> list[int]:
        return []

    def cached_prefix_tokens(self, token_ids) -> int:
        return 0

    def drain_copies(self) -> list:
        """(parent, child) of every fork since the last call: whole K/V to copy, oldest first."""
        copies, self._copies = self._copies, []
        return copies

    def commit_tokens(self, seq_id, token_ids) -> None:
        pass

    def usage(self, head=None):
        from minipaged.kv.base import Usage

        tokens = sum(self._tokens.values())  # every slot held holds a token: nothing is wasted or bounded
        return Usage(max(tokens, 1), tokens, 0, 0, 0, max(tokens, 1) - tokens, len(self._tokens))

    def check_invariants(self) -> None:
        assert all(n >= 0 for n in self._tokens.values()), f"negative token counts: {self._tokens}"
