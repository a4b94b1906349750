"""Verification: which draft tokens the model itself would have produced.

The forward pass computed the sequence's last token followed by its draft ``d_1 .. d_k``, so it
has logits at every one of those positions. Row 0 gives the token that comes after the last token:
greedy decoding would emit ``t_0 = argmax(row 0)``. If ``t_0 == d_1``, the K/V computed for ``d_1``
is exactly what the next step would have computed, so row 1 is valid too and gives ``t_1``; and so on
until the first disagreement:

    accepted = the longest prefix of the draft with d_(j+1) == argmax(row j)
    emitted  = the accepted drafts, then argmax of the row after them (a correction or a bonus)

So a step emits between 1 and k + 1 tokens, and they are the tokens plain greedy decoding gives, one
by one. ``verify`` runs that loop with the engine's own sampler, so that everything plain decoding
does per token (EOS, stop tokens, max_tokens, min_tokens, logprobs) happens here too, and stops
early if the sequence ends (a stop string, which needs the text, is found where the scheduler
appends the tokens, and the ones after it are dropped); ``accept_greedy`` is the same loop on a
list of argmaxes. The engine then gives back the slots of the rejected drafts.

Sampling (temperature > 0) works the same way: sample row 0 with the request's own generator; if
the sample equals the first guess, row 1 is valid and is sampled next, and so on. Every emitted token
is drawn from exactly the distribution plain decoding would draw it from (the rows it was drawn
from are conditioned on the tokens really emitted before it), with one draw of the generator per
emitted token, as in plain decoding: a seeded request gets the same tokens. This is rejection
sampling for a proposer that puts all its probability on one guess: the guess d is accepted with
probability p(d).

Not handled: a proposer with a real distribution q over its guesses (a draft model). Then a guess
must be accepted with probability min(1, p(d) / q(d)), and a rejection resampled from the leftover
of p, which keeps the distribution exact but not a seeded run's tokens.
"""

from __future__ import annotations


def verify(draft: list[int], emit) -> int:
    """The loop above. ``emit(j)`` draws the model's own token from row j (after the ones emitted
    before it) and returns (that token, whether the sequence ends with it). Returns how many tokens
    it emitted."""
    # exercise 09.1: begin
    for j, guess in enumerate(draft):
        token, finished = emit(j)
        if finished or token != guess:
            return j + 1
    emit(len(draft))  # every guess was right: the last row gives one more token, for free
    return len(draft) + 1
    # exercise 09.1: end


def accept_greedy(argmaxes: list[int], draft: list[int]) -> list[int]:
    """argmaxes: the greedy token of each of the len(draft) + 1 rows. Returns the tokens to emit."""
    if len(argmaxes) != len(draft) + 1:
        raise ValueError(f"argmaxes has {len(argmaxes)} entries; a draft of {len(draft)} needs len(draft) + 1 = "
                         f"{len(draft) + 1} (one row per draft token plus one)")
    emitted = []

    def emit(j):
        emitted.append(argmaxes[j])
        return argmaxes[j], False

    verify(draft, emit)
    return emitted
