"""Chapter 00's engine: generate for one sequence at a time, with or without a KV cache.

    for each sequence:
        logits = model(prompt)                      # prefill: every prompt token at once
        loop:
            token = sample(logits[-1])
            logits = model([token]) with the cache  # decode: one new token, reads cached K/V
            (or model(all tokens so far) without a cache: the full-recompute oracle)

This is the loop chapter 00 walks through, and the baseline of `bench cache`. ``LLM(model,
kv_policy="per_request")`` runs the same memory through the engine core (core.py, with
per_request_runner.py), the loop every later chapter shares; both agree token for token, and the
pooled engines must agree with them. Both sample with sampling.py's ``sample``.

Not handled here: batching several sequences in one forward pass, any memory limit.
"""

from __future__ import annotations

import time

import torch

from minipaged.kv.per_request import NoCache, PerRequestKVCache
from minipaged.request import Sequence
from minipaged.sampling import make_generator, sample, step_rows


def next_token(seq: Sequence, logits: torch.Tensor) -> None:
    """Sample seq's next token from logits [V] with its own generator (sampling.py), and append it."""
    token = sample(step_rows(logits[None])[0], seq)
    seq.append(token.token_id, token.logprob, token.top_logprobs)


class NaiveEngine:
    def __init__(self, model, tokenizer, use_cache: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.use_cache = use_cache
        self.stats = {"forward_passes": 0, "tokens_computed": 0, "decode_seconds": 0.0, "decode_tokens": 0}

    def _forward(self, ids: list[int], start_pos: int, kv):
        device = self.model.device
        tokens = torch.tensor(ids, dtype=torch.long, device=device)  # [T]
        positions = torch.arange(start_pos, start_pos + len(ids), device=device)  # [T]
        self.stats["forward_passes"] += 1
        self.stats["tokens_computed"] += len(ids)
        return self.model(tokens, positions, kv, logits_rows=[len(ids) - 1])[0]  # [V]

    def run_sequence(self, seq: Sequence, generator: torch.Generator | None = None) -> Sequence:
        seq.generator = generator or seq.generator or make_generator(seq.params.seed)
        seq.tokenizer = seq.tokenizer or self.tokenizer
        kv = PerRequestKVCache(self.model.config.num_layers) if self.use_cache else NoCache()
        logits = self._forward(seq.prompt_ids, 0, kv)  # prefill: the whole prompt
        next_token(seq, logits)
        t0 = seq.first_token_time = time.perf_counter()
        while not seq.finished:
            if self.use_cache:  # feed only the newest token; K/V of the others are cached
                logits = self._forward(seq.output_ids[-1:], seq.num_tokens - 1, kv)
            else:  # recompute everything from the first token
                logits = self._forward(seq.all_ids, 0, NoCache())
            next_token(seq, logits)
        seq.finished_time = time.perf_counter()
        self.stats["decode_seconds"] += seq.finished_time - t0
        self.stats["decode_tokens"] += len(seq.output_ids) - 1
        return seq
