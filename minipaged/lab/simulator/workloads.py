"""Seeded synthetic request traces shaped like the two datasets the vLLM paper used.

Only the published means are known (ShareGPT: 161.31 input and 337.99 output tokens on average;
Alpaca: 19.31 and 58.45), so each length is drawn from a lognormal distribution (heavy right tail:
most requests are short, a few are very long), clipped to what the model allows, then the whole
sample is rescaled so its mean matches the published one. The spreads (sigma) are plausible
choices, not fitted to the real datasets.

Clipping: a prompt gets at most max_model_len // 2 tokens, and prompt + output at most max_model_len
(a server refuses longer ones outright, so a trace of served requests has none). With a small
max_model_len the published means may be out of reach; ``describe`` reports the means actually drawn.

Arrivals are a Poisson process: exponential gaps with mean 1 / arrival_rate steps. An infinite rate
puts every request at step 0.

Each request's ``max_tokens`` (what the client asked for) equals its real output length: the paper's
"Pow2" variant assumes a reservation within 2x of the true length, which is what rounding
prompt + max_tokens up to a power of two gives. Not modelled: real prompts' content, shared prefixes,
requests that end early on a stop token.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    request_id: int
    arrival_step: int
    prompt_len: int
    output_len: int  # tokens it really generates (known to the simulator, not to a real server)
    max_tokens: int  # tokens the client asked for at most
    prompt_ids: tuple[int, ...] | None = None  # the prompt's tokens, when they matter (prefix caching, ch07)

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class WorkloadShape:
    mean_input: float
    mean_output: float
    sigma_input: float  # spread of log(length); larger means a heavier tail
    sigma_output: float


WORKLOADS = {
    "sharegpt": WorkloadShape(mean_input=161.31, mean_output=337.99, sigma_input=1.0, sigma_output=0.9),
    "alpaca": WorkloadShape(mean_input=19.31, mean_output=58.45, sigma_input=0.6, sigma_output=0.8),
}


def _scaled_to_mean(raw: list[float], target_mean: float, caps: list[int]) -> list[int]:
    """round(scale * raw[i]) clipped to [1, caps[i]], with scale found by bisection so that the mean
    is as close to target_mean as the rounding and clipping allow."""
    def lengths(scale: float) -> list[int]:
        return [min(max(1, round(scale * r)), cap) for r, cap in zip(raw, caps)]

    low, high = 1e-6, 1e6  # the clipped mean grows monotonically with the scale
    for _ in range(100):
        mid = math.sqrt(low * high)
        if sum(lengths(mid)) / len(raw) < target_mean:
            low = mid
        else:
            high = mid
    best = min((low, high), key=lambda s: abs(sum(lengths(s)) / len(raw) - target_mean))
    return lengths(best)


def make_workload(name: str = "sharegpt", num_requests: int = 1000, *, arrival_rate: float = math.inf,
                  max_model_len: int = 2048, seed: int = 0) -> list[Request]:
    """A list of requests sorted by arrival step; the same arguments always give the same trace."""
    if name not in WORKLOADS:
        raise ValueError(f"workload={name!r} is not known; choose one of {sorted(WORKLOADS)}")
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be an integer >= 1, got {num_requests!r}")
    if not arrival_rate > 0:
        raise ValueError(f"arrival_rate must be > 0 requests per step (inf: all at once), got {arrival_rate!r}")
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 2:
        raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
    shape = WORKLOADS[name]
    rng = random.Random(seed)
    raw_in = [math.exp(rng.gauss(0.0, shape.sigma_input)) for _ in range(num_requests)]
    raw_out = [math.exp(rng.gauss(0.0, shape.sigma_output)) for _ in range(num_requests)]
    prompts = _scaled_to_mean(raw_in, shape.mean_input, [max_model_len // 2] * num_requests)
    outputs = _scaled_to_mean(raw_out, shape.mean_output, [max_model_len - p for p in prompts])

    arrivals, clock = [], 0.0
    for _ in range(num_requests):
        if math.isinf(arrival_rate):
            arrivals.append(0)
        else:
            clock += rng.expovariate(arrival_rate)
            arrivals.append(int(clock))
    return [Request(i, arrivals[i], prompts[i], outputs[i], max_tokens=outputs[i])
            for i in range(num_requests)]


def describe(requests: list[Request]) -> dict:
    """Means and extremes of a trace, to check it against the published numbers."""
    n = len(requests)
    prompts = sorted(r.prompt_len for r in requests)
    outputs = sorted(r.output_len for r in requests)
    return {
        "num_requests": n,
        "mean_input": sum(prompts) / n,
        "mean_output": sum(outputs) / n,
        "median_input": prompts[n // 2],
        "median_output": outputs[n // 2],
        "max_input": prompts[-1],
        "max_output": outputs[-1],
        "max_total": max(r.final_len for r in requests),
        "last_arrival_step": max(r.arrival_step for r in requests),
    }
