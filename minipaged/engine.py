"""Chapter 00's engine: generate for one sequence at a time, with or without a KV cache.

    for each sequence:
        logits = model(prompt)                      # prefill: every prompt token at once
        loop:
            token = sample(logits[-1])
            logits = model([token]) with the cache  # decode: one new token, reads cached K/V
            (or model(all tokens so far) without a cache: the full-recompute oracle)

This is the loop chapter 00 walks through, and the baseline of `bench cache`. ``LLM(model,
kv_policy="per_request")`` runs the same memory through the engine core (core.py, with
runner.PerRequestRunner), the loop every later chapter shares; both agree token for token, and the
pooled engines must agree with them. ``next_token`` (sampling one token and appending it) is what
every engine uses.

Not handled here: batching several sequences in one forward pass, any memory limit.
"""

from __future__ import annotations

import time

import torch

from minipaged.kv.per_request import NoCache, PerRequestKVCache
from minipaged.sampling import make_generator, penalized_logits, sample_token, without_stop_tokens
from minipaged.sequence import Sequence


def next_token(seq: Sequence, logits: torch.Tensor, generator, tokenizer, logprobs: torch.Tensor | None = None,
               greedy_token: int | None = None) -> None:
    """Sample from logits [V], then append to seq with its log-probability (and top-k if asked).

    A batched caller may pass what it computed for all rows at once: ``logprobs`` (log_softmax of
    the logits) and ``greedy_token`` (their argmax). Penalties and a logit bias (sampling.py) change
    which token is chosen, from the sequence's own prompt and output so far, and so does min_tokens
    (EOS and the stop token ids are masked until the output has that many tokens); the reported
    log-probabilities stay those of the raw logits."""
    logp = torch.log_softmax(logits.float(), dim=-1) if logprobs is None else logprobs
    if seq.params.penalized:
        logits = penalized_logits(logits, seq.params, seq.prompt_ids, seq.output_ids)  # [V]
        greedy_token = None  # the raw argmax no longer decides
    if len(seq.output_ids) < seq.params.min_tokens:  # EOS and the stop token ids cannot be chosen yet
        logits = without_stop_tokens(logits, seq.params, seq.eos_token_id)  # [V]
        greedy_token = None
    if seq.params.greedy:
        token = int(torch.argmax(logits)) if greedy_token is None else greedy_token
    else:
        token = sample_token(logits, seq.params, generator)
    top = None
    if seq.params.logprobs is not None:
        values, ids = torch.topk(logp, max(seq.params.logprobs, 1))
        top = {int(i): float(v) for i, v in zip(ids, values)}
        top[token] = float(logp[token])
    seq.append(token, tokenizer, float(logp[token]), top)


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
        generator = generator or make_generator(seq.params.seed)
        kv = PerRequestKVCache(self.model.config.num_layers) if self.use_cache else NoCache()
        logits = self._forward(seq.prompt_ids, 0, kv)  # prefill: the whole prompt
        next_token(seq, logits, generator, self.tokenizer)
        t0 = seq.first_token_time = time.perf_counter()
        while not seq.finished:
            if self.use_cache:  # feed only the newest token; K/V of the others are cached
                logits = self._forward(seq.output_ids[-1:], seq.num_tokens - 1, kv)
            else:  # recompute everything from the first token
                logits = self._forward(seq.all_ids, 0, NoCache())
            next_token(seq, logits, generator, self.tokenizer)
        seq.finished_time = time.perf_counter()
        self.stats["decode_seconds"] += seq.finished_time - t0
        self.stats["decode_tokens"] += len(seq.output_ids) - 1
        return seq
