"""SamplingParams: how one request wants its tokens chosen, with vLLM's field names and defaults.

Every field is checked when the object is made, and again when the request reaches an engine, so a
bad value fails with a ValueError that names the field and what is allowed before the engine has
touched any memory for the request. An unknown field is a ValueError too (it names the vLLM fields
not supported yet).

The penalties and the logit bias mean what they mean in vLLM (``minipaged/sampling.py`` applies them):
presence and frequency penalties count the output's tokens, the repetition penalty looks at prompt
and output, and a logit bias is added to a token's logit before either.

Not handled yet: allowed or bad token lists, guided decoding, logits processors.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import Enum


class RequestOutputKind(Enum):
    """What each RequestOutput of a request carries while it runs, as in vLLM."""

    CUMULATIVE = 0  # everything so far (the default)
    DELTA = 1  # only what is new since the last output: for streaming
    FINAL_ONLY = 2  # nothing until the request is finished


# A temperature below this samples as greedy decoding: logits / 1e-40 overflow float32 to inf, and
# long before that the softmax is one-hot anyway (vLLM uses the same threshold).
SAMPLING_EPS = 1e-5

# vLLM SamplingParams fields this engine does not implement yet: naming one is a ValueError that says so.
UNSUPPORTED_VLLM_FIELDS = ("allowed_token_ids", "bad_words", "prompt_logprobs", "best_of", "guided_decoding",
                           "structured_outputs", "truncate_prompt_tokens", "detokenize",
                           "spaces_between_special_tokens", "logits_processors", "extra_args")


def _fail(name, value, allowed, owner="SamplingParams"):
    raise ValueError(f"{owner}.{name}={value!r} is not allowed: {allowed}")


def _is_int(value) -> bool:
    """A real int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """A real int or float (not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _known_fields_only(cls):
    """Make an unknown keyword a ValueError that lists the known fields (and says which vLLM fields
    are not supported yet), instead of dataclass's TypeError."""
    init = cls.__init__
    known = [f for f in cls.__dataclass_fields__ if not f.startswith("_")]

    def __init__(self, *args, **kwargs):
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            later = [u for u in unknown if u in UNSUPPORTED_VLLM_FIELDS]
            note = f"; {later} exist in vLLM but are not supported here yet" if later else ""
            raise ValueError(f"{cls.__name__}() got unknown fields {unknown}{note}. The known fields are {known}")
        if len(args) > len(known):
            raise ValueError(f"{cls.__name__}() takes at most {len(known)} positional values, got {len(args)}; "
                             "name them (e.g. max_tokens=32)")
        init(self, *args, **kwargs)

    __init__.__doc__ = init.__doc__
    cls.__init__ = __init__
    return cls


def _same_token(key, token: int) -> bool:
    return isinstance(key, str) and key.isascii() and key.isdigit() and int(key) == token


class _Few:
    """A list or dict shown in an error message by its first few items and how many more, so that
    a request with ten thousand bad token ids does not get them all back."""

    LIMIT = 8

    def __init__(self, items):
        self.items = items

    def __repr__(self) -> str:
        if len(self.items) <= self.LIMIT:
            return repr(self.items)
        more = f", ... {len(self.items) - self.LIMIT} more"
        if isinstance(self.items, dict):
            head = ", ".join(f"{k!r}: {v!r}" for k, v in list(self.items.items())[:self.LIMIT])
            return "{" + head + more + "}"
        return "[" + ", ".join(repr(i) for i in self.items[:self.LIMIT]) + more + "]"


def _checked_bias(bias) -> dict[int, float] | None:
    """logit_bias as {token id: bias}, each bias clamped to [-100, 100] as vLLM's server does (a bias of
    100 all but forces a token, -100 all but bans it). Keys may be integer strings, as JSON sends them."""
    if bias is None:
        return None
    allowed = "a dict {token id: a number}, token ids as integers >= 0 (or their decimal strings)"
    if not isinstance(bias, dict):
        _fail("logit_bias", bias, allowed)
    checked = {}
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else key
        if not _is_int(token) or token < 0 or not _is_number(value) or abs(value) == float("inf"):
            _fail("logit_bias", {key: value}, allowed + ", each number finite")
        if token in checked:  # 5 and "5", or "5" and "05": which bias was meant?
            _fail("logit_bias", {k: v for k, v in bias.items() if k == token or _same_token(k, token)},
                  allowed + f"; token {token} is named more than once")
        checked[int(token)] = float(min(100.0, max(-100.0, value)))
    return checked or None


@_known_fields_only
@dataclass
class SamplingParams:
    """How one request's tokens are chosen. Every field is checked at construction and again when
    the request reaches an engine (``validate``), so a field changed in between is checked too.

    A temperature below SAMPLING_EPS (1e-5) is greedy decoding, as 0 is.
    """

    n: int = 1  # how many completions to sample for the prompt (at most the engine's max_num_seqs)
    temperature: float = 1.0  # 0 (or anything below 1e-5) means greedy (always the most likely token)
    top_p: float = 1.0  # keep the smallest set of tokens whose probabilities sum to top_p
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 keeps all
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one
    seed: int | None = None  # same seed, same text (each request draws from its own generator)
    stop: str | list[str] | None = None  # strings that end the output (not included in it)
    stop_token_ids: list[int] | None = None  # token ids that end the output
    ignore_eos: bool = False  # keep going past the end-of-sequence token
    max_tokens: int | None = 16  # at most this many new tokens; None: up to the context length
    min_tokens: int = 0  # EOS and stop token ids are not chosen, and stop strings ignored, until this many tokens exist
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # also return the log-probabilities of this many top tokens per step
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # in [-2, 2]: subtracted once per time a token is already in the output
    repetition_penalty: float = 1.0  # > 0: divides a positive logit (multiplies a negative one) of every
    #                                  token in the prompt or the output; 1 leaves them alone
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (clamped to [-100, 100])
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # what the online engine's outputs carry
    _stop_list: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        self.validate()

    def validate(self) -> SamplingParams:
        """Check every field (the engine calls this again when the request arrives). Returns self."""
        if not _is_int(self.n) or self.n < 1:
            _fail("n", self.n, "an integer >= 1")
        if not _is_number(self.temperature) or not 0 <= self.temperature < float("inf"):
            _fail("temperature", self.temperature, "a finite number >= 0 (below 1e-5 means greedy)")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            _fail("top_p", self.top_p, "a number in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < -1:
            _fail("top_k", self.top_k, "an integer >= 1, or 0 / -1 to keep every token")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            _fail("min_p", self.min_p, "a number in [0, 1]")
        if self.seed is not None and (not _is_int(self.seed) or not -2**63 <= self.seed < 2**63):
            _fail("seed", self.seed, "an integer in [-2**63, 2**63), or None")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            _fail("max_tokens", self.max_tokens, "an integer >= 1, or None for 'up to the context length'")
        if not _is_int(self.min_tokens) or self.min_tokens < 0 or (
            self.max_tokens is not None and self.min_tokens > self.max_tokens
        ):
            _fail("min_tokens", self.min_tokens, "an integer >= 0 and <= max_tokens")
        if self.stop is not None and not isinstance(self.stop, (str, list, tuple)):
            _fail("stop", self.stop, "a non-empty string, a list of non-empty strings, or None")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not isinstance(s, str) or s == "" for s in stops):
            _fail("stop", self.stop, "a non-empty string, a list of non-empty strings, or None")
        self._stop_list = stops
        ids = self.stop_token_ids
        if ids is not None and (not isinstance(ids, (list, tuple)) or any(not _is_int(i) or i < 0 for i in ids)):
            _fail("stop_token_ids", ids, "a list of non-negative integer token ids, or None")
        self.stop_token_ids = list(ids or [])
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "True or False")
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            _fail("logprobs", self.logprobs, "an integer >= 0 (how many top tokens per step), or None")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                _fail(name, value, "a number in [-2, 2] (0 turns it off)")
        if not _is_number(self.repetition_penalty) or not 0 < self.repetition_penalty < float("inf"):
            _fail("repetition_penalty", self.repetition_penalty, "a finite number > 0 (1 turns it off)")
        self.logit_bias = _checked_bias(self.logit_bias)
        if not isinstance(self.output_kind, RequestOutputKind):
            _fail("output_kind", self.output_kind, f"one of {[k.name for k in RequestOutputKind]} (RequestOutputKind)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        """Whether a penalty or a logit bias changes the logits (then sampling needs the token history)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or self.logit_bias)

    @property
    def stop_strings(self) -> list[str]:
        return self._stop_list

    def validate_for(self, vocab_size: int, max_num_seqs: int | None = None, max_logprobs: int = -1) -> None:
        """Checks that need the engine: token ids inside the model's vocabulary, logprobs at most
        max_logprobs (-1: the vocabulary), and no more samples than the engine runs at once."""
        self.validate()
        bad = [i for i in self.stop_token_ids if i >= vocab_size]
        if bad:
            _fail("stop_token_ids", _Few(bad), f"token ids in [0, {vocab_size})")
        if self.min_tokens and len(set(self.stop_token_ids)) >= vocab_size - 1:  # with EOS: every token
            _fail("stop_token_ids", _Few(self.stop_token_ids), f"at most {vocab_size - 2} distinct ids with "
                  "min_tokens > 0: until then they and EOS are masked, and some token must be left to choose")
        bad = [i for i in (self.logit_bias or {}) if i >= vocab_size]
        if bad:
            _fail("logit_bias", _Few({i: self.logit_bias[i] for i in bad}), f"token ids in [0, {vocab_size}) as keys")
        most = vocab_size if max_logprobs < 0 else min(max_logprobs, vocab_size)
        if self.logprobs is not None and self.logprobs > most:
            _fail("logprobs", self.logprobs, f"an integer in [0, {most}] (max_logprobs={max_logprobs}; -1: the "
                  f"vocabulary, {vocab_size}), or None")
        if max_num_seqs is not None and self.n > max_num_seqs:
            _fail("n", self.n, f"an integer in [1, {max_num_seqs}]: the engine runs at most max_num_seqs="
                               f"{max_num_seqs} sequences at once; lower n or raise max_num_seqs")


@_known_fields_only
@dataclass
class BeamSearchParams:
    """How ``LLM.beam_search`` searches (minipaged/beam_search.py), with vLLM's field names.

    length_penalty is bounded to [-10, 10] so that length ** length_penalty stays a finite float for
    every length a model allows (vLLM's default is 1.0). A temperature below 1e-5 uses the raw logits.
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0  # 0: log-probabilities of the raw logits
    length_penalty: float = 1.0  # score = cum_logprob / len(tokens) ** length_penalty

    def __post_init__(self):
        self.validate()

    def validate(self) -> BeamSearchParams:
        fail = functools.partial(_fail, owner="BeamSearchParams")
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                fail(name, value, "an integer >= 1")
        if not isinstance(self.ignore_eos, bool):
            fail("ignore_eos", self.ignore_eos, "True or False")
        if not _is_number(self.temperature) or not 0 <= self.temperature < float("inf"):
            fail("temperature", self.temperature, "a finite number >= 0")
        if not _is_number(self.length_penalty) or not -10 <= self.length_penalty <= 10:
            fail("length_penalty", self.length_penalty, "a number in [-10, 10] (1.0 is vLLM's default)")
        return self
