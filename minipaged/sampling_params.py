"""SamplingParams: how one request wants its tokens chosen, with vLLM's field names and defaults.

Every field is checked when the object is made, so a bad value fails at once with a ValueError that
names the field and what is allowed, before the engine has touched any memory for the request.

Not handled yet: presence/frequency/repetition penalties, logit bias, guided decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class RequestOutputKind(Enum):
    """What each RequestOutput of a request carries while it runs, as in vLLM."""

    CUMULATIVE = 0  # everything so far (the default)
    DELTA = 1  # only what is new since the last output: for streaming
    FINAL_ONLY = 2  # nothing until the request is finished


def _fail(name, value, allowed):
    raise ValueError(f"SamplingParams.{name}={value!r} is not allowed: {allowed}")


def _fail_beam(name, value, allowed):
    raise ValueError(f"BeamSearchParams.{name}={value!r} is not allowed: {allowed}")


@dataclass
class SamplingParams:
    n: int = 1  # how many completions to sample for the prompt
    temperature: float = 1.0  # 0 means greedy (always the most likely token)
    top_p: float = 1.0  # keep the smallest set of tokens whose probabilities sum to top_p
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 keeps all
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one
    seed: int | None = None  # same seed, same text (each request draws from its own generator)
    stop: str | list[str] | None = None  # strings that end the output (not included in it)
    stop_token_ids: list[int] | None = None  # token ids that end the output
    ignore_eos: bool = False  # keep going past the end-of-sequence token
    max_tokens: int | None = 16  # at most this many new tokens; None: up to the context length
    min_tokens: int = 0  # EOS and stop token ids are ignored until this many tokens exist
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # also return the log-probabilities of this many top tokens per step
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # what the online engine's outputs carry
    _stop_list: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            _fail("n", self.n, "an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            _fail("temperature", self.temperature, "a number >= 0 (0 means greedy)")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            _fail("top_p", self.top_p, "a number in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            _fail("top_k", self.top_k, "an integer >= 1, or 0 / -1 to keep every token")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            _fail("min_p", self.min_p, "a number in [0, 1]")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            _fail("seed", self.seed, "an integer or None")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1
        ):
            _fail("max_tokens", self.max_tokens, "an integer >= 1, or None for 'up to the context length'")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0 or (
            self.max_tokens is not None and self.min_tokens > self.max_tokens
        ):
            _fail("min_tokens", self.min_tokens, "an integer >= 0 and <= max_tokens")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or s == "" for s in stops):
            _fail("stop", self.stop, "a non-empty string or a list of non-empty strings")
        self._stop_list = stops
        ids = self.stop_token_ids or []
        if not isinstance(ids, (list, tuple)) or any(not isinstance(i, int) or i < 0 for i in ids):
            _fail("stop_token_ids", self.stop_token_ids, "a list of non-negative token ids")
        self.stop_token_ids = list(ids)
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            _fail("logprobs", self.logprobs, "an integer >= 0 or None")
        if not isinstance(self.output_kind, RequestOutputKind):
            _fail("output_kind", self.output_kind, f"one of {[k.name for k in RequestOutputKind]} (RequestOutputKind)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def stop_strings(self) -> list[str]:
        return self._stop_list

    def validate_for(self, vocab_size: int) -> None:
        """Checks that need the model: token ids must lie inside its vocabulary."""
        bad = [i for i in self.stop_token_ids if i >= vocab_size]
        if bad:
            _fail("stop_token_ids", bad, f"token ids in [0, {vocab_size})")


@dataclass
class BeamSearchParams:
    """How ``LLM.beam_search`` searches (minipaged/beam_search.py), with vLLM's field names."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # 0: log-probabilities of the raw logits
    length_penalty: float = 1.0  # score = cum_logprob / len(tokens) ** length_penalty

    def __post_init__(self):
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                _fail_beam(name, value, "an integer >= 1")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) \
                or not self.temperature >= 0:
            _fail_beam("temperature", self.temperature, "a number >= 0")
        if isinstance(self.length_penalty, bool) or not isinstance(self.length_penalty, (int, float)):
            _fail_beam("length_penalty", self.length_penalty, "a number")
