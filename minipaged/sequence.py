"""A Sequence: one sample being generated, and the rules that decide when it ends.

It holds the prompt's token ids, the tokens generated so far, the text decoded from them, and the
request's SamplingParams. `append(token)` adds a token and checks, in vLLM's order, whether the
sequence is finished: max_tokens reached ("length"), EOS or a stop token id ("stop"), a stop string
in the text ("stop", and the text is cut before it, or after it with include_stop_str_in_output).
The text is decoded incrementally (detokenizer.py), so a long output costs linear work, and
``stream_text()`` is the part of it that a streaming client may already be shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minipaged.detokenizer import IncrementalDetokenizer
from minipaged.outputs import CompletionOutput
from minipaged.sampling_params import SamplingParams


@dataclass(eq=False)  # two sequences are the same only if they are one object
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    eos_token_id: int
    max_model_len: int
    index: int = 0  # which of the request's n samples
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    cumulative_logprob: float = 0.0
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # when it arrived, got its first token and finished (time.perf_counter(); set by the engines)
    arrival_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served at its first prefill (chapter 07)
    token_times: list[float] = field(default_factory=list)  # when each output token was sampled
    generator: object = field(default=None, repr=False)  # the random generator this sample draws from
    _detok: IncrementalDetokenizer | None = field(default=None, repr=False, compare=False)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def max_new_tokens(self) -> int:
        room = self.max_model_len - len(self.prompt_ids)
        return room if self.params.max_tokens is None else min(self.params.max_tokens, room)

    def append(self, token: int, tokenizer, logprob: float | None = None, top: dict | None = None) -> None:
        self.output_ids.append(token)
        if logprob is not None:
            self.cumulative_logprob += logprob
        if top is not None:
            self.logprobs.append(top)
        p = self.params
        past_min = len(self.output_ids) > p.min_tokens
        if past_min and not p.ignore_eos and token == self.eos_token_id:
            self.finish_reason, self.stop_reason = "stop", None
        elif past_min and token in p.stop_token_ids:
            self.finish_reason, self.stop_reason = "stop", token
        if tokenizer is not None:  # (a synthetic runner's tokens have no text)
            if self._detok is None:
                self._detok = IncrementalDetokenizer(tokenizer, p.skip_special_tokens, p.stop_strings,
                                                     p.include_stop_str_in_output)
            stop = self._detok.add(token, check_stop=past_min and self.finish_reason is None)
            self.text = self._detok.text
            if stop is not None:
                self.finish_reason, self.stop_reason = "stop", stop
        if self.finish_reason is None and len(self.output_ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None and self._detok is not None:
            self._detok.finish()

    def fork(self, seq_id: int) -> Sequence:
        """A new sequence with this one's tokens so far (a beam that branches, chapter 05)."""
        return Sequence(seq_id=seq_id, prompt_ids=self.prompt_ids, params=self.params, eos_token_id=self.eos_token_id,
                        max_model_len=self.max_model_len, output_ids=list(self.output_ids),
                        arrival_time=self.arrival_time, num_cached_tokens=self.num_cached_tokens)

    def restart(self, seq_id: int) -> Sequence:
        """A new sequence with this one's prompt alone (a beam search that starts over)."""
        return Sequence(seq_id=seq_id, prompt_ids=list(self.prompt_ids), params=self.params,
                        eos_token_id=self.eos_token_id, max_model_len=self.max_model_len,
                        arrival_time=self.arrival_time)

    def stream_text(self) -> str:
        """The part of the text that may be shown while the sequence is still going: never a final
        half-decoded character (U+FFFD, the start of a multi-byte character), and never the last
        characters that a stop string could still take back. Once finished, the whole text."""
        if self.finished or self._detok is None:
            return self.text
        return self._detok.stream_text

    def to_output(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.text,
            token_ids=list(self.output_ids),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=self.logprobs if self.params.logprobs is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )
