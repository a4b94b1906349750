"""Prompt lookup ("ngram" in vLLM): draft tokens copied from earlier in the sequence itself.

Text repeats itself. An answer quotes its question, code reuses the names it defined, a summary
copies phrases from the document. So when the last few tokens of a sequence appeared before, the
tokens that followed them then are a good guess for what follows now:

    ... the block table maps logical blocks to ... | the block table  ->  maps logical blocks

``propose_ngram`` looks for the last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) at an
earlier place in the sequence, takes the most recent such place, and proposes the ``k`` tokens that
came after it (fewer if the sequence ends sooner). No match, no draft. It costs a scan of the
sequence in Python and no model at all, which is why its guesses may be poor: a wrong guess only
costs the slots it was computed in.

Not handled: a second, smaller draft model (vLLM's ``"draft_model"`` method), tree-shaped drafts
of several guesses at once, suffix structures that make the lookup faster than a scan.
"""

from __future__ import annotations


def propose_ngram(token_ids, k: int, max_n: int = 4, min_n: int = 1) -> list[int]:
    """Up to ``k`` draft tokens for what follows ``token_ids``, copied from earlier in ``token_ids``."""
    # exercise 09.2: begin
    ids = list(token_ids)
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        tail = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):  # the most recent earlier occurrence first
            if ids[start:start + n] == tail:
                return ids[start + n:start + n + k]
    return []
    # exercise 09.2: end
