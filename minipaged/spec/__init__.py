"""Chapter 09: speculative decoding. Guess a few tokens cheaply, check them all in one forward pass.

    ngram.py     the proposer: prompt lookup, the next tokens after the last earlier occurrence of
                 the sequence's final n tokens (no second model)
    verify.py    verification: keep the draft tokens the model agrees with, plus one token of
                 its own
    config.py    vLLM's ``speculative_config`` dict, checked

The scheduler (scheduler/speculative.py) asks the proposer for each decoding sequence's draft and
plans slots for it; the model runner (runner.py) computes the sequence's next token and its draft in
one pass, and the engine core (core.py) verifies them and gives back the K/V slots of the rejected
tokens (``policy.truncate``).
"""

from minipaged.spec.config import SpeculativeConfig
from minipaged.spec.ngram import propose_ngram
from minipaged.spec.verify import accept_greedy, verify

__all__ = ["SpeculativeConfig", "propose_ngram", "accept_greedy", "verify"]
