"""What `generate` returns, with vLLM's names: a RequestOutput per prompt, a CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int  # which of the n samples this is
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None  # sum of the chosen tokens' log-probabilities
    logprobs: list[dict[int, float]] | None = None  # per step, when SamplingParams.logprobs is set
    finish_reason: str | None = None  # "stop" (EOS, stop string or stop token) or "length"
    stop_reason: int | str | None = None  # the stop string or token id that ended it, if any

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True
    metrics: dict | None = None  # engine-side counters (steps, KV bytes...), for the chapters
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (chapter 07)
