"""What changes a row's logits before a token is chosen: the logit bias, the penalties and min_tokens.

The sampler (sampling.py) calls these only for a request that asks for them. They follow vLLM's order
and change greedy picks too:

    logits[t] += logit_bias[t]
    logits[t] /= repetition_penalty if logits[t] > 0 else 1 / repetition_penalty   (t in prompt or output)
    logits[t] -= frequency_penalty * count(t in output) + presence_penalty * (t in output)
    logits[t] = -inf  for EOS and the stop token ids while the output is shorter than min_tokens

A scaled logit stays within ±LOGIT_LIMIT, so an extreme penalty cannot make the softmax NaN.

Not handled yet: penalties for the whole batch at once on the device (this is one row at a time), bad
words, allowed token ids.
"""
from __future__ import annotations

import torch

from minipaged.sampling_params import SamplingParams

# How far the repetition penalty may push a logit either way. Divided by the smallest temperature that
# samples (1e-5), it is still a finite float32 (the largest is about 3.4e38).
LOGIT_LIMIT = 1e30


def penalized_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int],
                     output_ids: list[int]) -> torch.Tensor:
    """logits [V] with params' logit bias and penalties applied (a new float32 tensor; see above)."""
    logits = logits.float().clone()  # [V]
    vocab = logits.shape[-1]
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        logits.index_add_(0, ids, torch.tensor(list(params.logit_bias.values()), dtype=torch.float32))
    counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab)  # [V]
    if params.repetition_penalty != 1:
        seen = counts > 0  # [V]
        if prompt_ids:
            seen[torch.tensor(prompt_ids, dtype=torch.long)] = True
        # in float64, then clamped: any penalty above 0 is allowed, and 1e-300 or 1e300 (or 1e-37 on
        # a biased logit of 100) would make a float32 logit infinite, and softmax over it NaN
        wide, p = logits.double(), params.repetition_penalty  # [V]
        scaled = torch.where(wide > 0, wide * (1 / p), wide * p).clamp(-LOGIT_LIMIT, LOGIT_LIMIT)  # [V]
        logits = torch.where(seen, scaled.float(), logits)
    logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return logits


def without_stop_tokens(logits: torch.Tensor, params: SamplingParams, eos_token_id: int | None) -> torch.Tensor:
    """logits [V] with EOS and params.stop_token_ids at -inf (a new tensor): while an output is
    shorter than min_tokens, vLLM's sampler never chooses a token that would end it (even with
    ignore_eos, EOS is masked). SamplingParams.validate_for keeps at least one other token."""
    ids = list(params.stop_token_ids) + ([] if eos_token_id is None or eos_token_id < 0 else [eos_token_id])
    return logits.index_fill(0, torch.tensor(ids, dtype=torch.long), float("-inf"))
