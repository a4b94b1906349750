"""The sampler: each row of a step's logits becomes a token here (the runner calls it).

    step_rows(logits)              [rows, V] -> one StepRow each (log_softmax and argmax, batched)
    sample(row, seq, before)       seq's next token from one row (``before``: tokens it drew earlier
                                   in this step, from a draft's earlier rows)
    step_outputs(work, draw, rank) one SeqOutput per planned sequence: its tokens (a draft checked row
                                   by row, spec/verify.py), its forks' first tokens, or a beam's candidates

A row gives a token through logit bias, penalties and the min_tokens mask (penalties.py), then
greedy, temperature, top-k, min-p and top-p. Log-probabilities come from the raw logits, as vLLM V1
reports them. Each sample draws from its own torch.Generator, seeded from SamplingParams.seed, so its
tokens do not depend on the batch.

Not handled yet: sampling the whole batch at once on the device (this is one row at a time).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from minipaged.penalties import penalized_logits, without_stop_tokens
from minipaged.sampling_params import SamplingParams
from minipaged.spec.verify import verify
from minipaged.step import Sampled, SeqOutput


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return g


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a request with SamplingParams.seed = seed (n > 1).

    Sample 0 keeps the request's seed, so n=1 and the first of n agree. The others get seeds spread
    far apart by a large odd multiplier, so their streams do not overlap.
    """
    if seed is None:
        return None
    return (seed + index * 0x9E3779B97F4A7C15) % (2**63)


def processed_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k, min-p and top-p to logits [V]; masked tokens get -inf."""
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop_sorted[0] = False  # even when top_p is below float32's smallest number (it rounds to 0)
        logits = logits.masked_fill(drop_sorted.scatter(0, order, drop_sorted), float("-inf"))
    return logits


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """logits [V] -> token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(processed_logits(logits, params), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


class StepRow(NamedTuple):
    """One row of a step's logits, with what sampling needs from it computed for every row at once:
    one log_softmax and one argmax over [rows, V] cost far less than one of each per row."""

    logits: torch.Tensor  # [V]
    logprobs: torch.Tensor  # [V]: log_softmax(logits)
    greedy_token: int  # argmax(logits)


def step_rows(logits: torch.Tensor) -> list[StepRow]:
    """logits [rows, V] -> one StepRow per row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [rows, V]
    greedy = logits.argmax(dim=-1).tolist()  # [rows]
    return [StepRow(row, lp, g) for row, lp, g in zip(logits, logprobs, greedy)]


def sample(row: StepRow, seq, before: list[int] = ()) -> Sampled:
    """seq's next token from ``row``, after its output and then ``before``. Penalties, a logit bias and
    min_tokens (EOS and the stop token ids masked until the output has that many tokens) change which
    token is chosen; the log-probabilities reported are those of the raw logits."""
    params, output = seq.params, seq.output_ids + list(before)
    logits, greedy_token = row.logits, row.greedy_token
    if params.penalized:
        logits = penalized_logits(logits, params, seq.prompt_ids, output)  # [V]
        greedy_token = None  # the raw argmax no longer decides
    if len(output) < params.min_tokens:  # EOS and the stop token ids cannot be chosen yet
        logits = without_stop_tokens(logits, params, seq.eos_token_id)  # [V]
        greedy_token = None
    if params.greedy:
        token = int(torch.argmax(logits)) if greedy_token is None else greedy_token
    else:
        token = sample_token(logits, params, seq.generator)
    top = None
    if params.logprobs is not None:
        values, ids = torch.topk(row.logprobs, max(params.logprobs, 1))
        top = {int(i): float(v) for i, v in zip(ids, values)}
        top[token] = float(row.logprobs[token])
    return Sampled(token, float(row.logprobs[token]), top)


def ends(seq, tokens: list[int]) -> bool:
    """Whether seq would end at the last of ``tokens`` (drawn after its output) by EOS, a stop token id
    or its length. Stop strings need the text; the scheduler finds those when it appends."""
    n, p, token = len(seq.output_ids) + len(tokens), seq.params, tokens[-1]
    stops = n > p.min_tokens and ((token == seq.eos_token_id and not p.ignore_eos) or token in p.stop_token_ids)
    return stops or n >= seq.max_new_tokens


def step_outputs(work: list, draw, rank) -> list[SeqOutput]:
    """One SeqOutput per planned sequence (step.py's ScheduledSeq), in order. ``draw(i, j, seq, before)``
    gives seq's token from row j of planned sequence i; ``rank(i, work)`` a beam's candidates.

    A prompt chunk with more to come gets nothing. A sequence gets its token from row 0, or, with a
    draft, row by row while the model agrees with the guesses (spec/verify.py): one draw per token it
    keeps, as plain decoding makes. The samples waiting to fork from it draw their first token from
    row 0 too, each with its own generator."""
    outputs = []
    for i, w in enumerate(work):
        if not w.completes:
            outputs.append(SeqOutput())
            continue
        if w.beam_width:
            outputs.append(SeqOutput(candidates=rank(i, w)))
            continue
        forks = [draw(i, 0, child, []) for child in w.forks]  # each with its own generator
        if not w.draft:  # one row, one token
            outputs.append(SeqOutput([draw(i, 0, w.seq, [])], forks))
            continue
        sampled: list[Sampled] = []

        def emit(j, i=i, w=w, sampled=sampled):
            sampled.append(draw(i, j, w.seq, [s.token_id for s in sampled]))
            return sampled[-1].token_id, ends(w.seq, [s.token_id for s in sampled])

        verify(w.draft, emit)
        outputs.append(SeqOutput(sampled, forks))
    return outputs
