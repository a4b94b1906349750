"""Engine statistics: counters, gauges and histograms whose memory stays bounded however long the engine runs.

    registry = engine_metrics()
    registry.counter("minipaged:num_preemptions").inc()
    registry.histogram("minipaged:step_seconds").observe(0.012)
    registry.snapshot()                                      # frozen values (metrics_reader.py)

The engine updates live instruments kept by name in a ``MetricsRegistry``; a histogram keeps only a
count per bucket, the number of observations and their sum, so a million observations cost what ten
do. Per-step timelines are not kept here: while someone listens, the core publishes a record of each
step (``registry.steps``, metrics_reader.py). ``engine_metrics`` registers vLLM V1's standard set
with "minipaged:" instead of "vllm:" (num_preemptions, prefix_cache_queries/hits,
kv_cache_usage_perc as a fraction, time_to_first_token_seconds, ...) and a few of ours
(forward_passes, tokens_computed, block_copies, step_seconds, num_requests_refused). Counters carry
no "_total" suffix; the Prometheus exporter (server/metrics_export.py) adds it.

Not handled yet: labels beyond one static tags dict, thread safety (one thread steps the engine).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable

from minipaged.metrics_reader import PREFIX, Counter, Gauge, Histogram, MetricSnapshot, StepStream

# Seconds, a 1-2-5 series from 1 ms to 2 minutes (roughly log spaced); +Inf is added by HistogramMetric.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
                                      1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 120.0)
# Tokens per engine step: powers of two, 1 .. 8192.
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(2 ** i) for i in range(14))

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # what Prometheus accepts as a metric name


# ---------------------------------------------------------------- live instruments (what the engine updates)

class CounterMetric:
    """A monotonically increasing count (tokens, requests, preemptions...)."""
    kind = "counter"

    def __init__(self, name: str, doc: str = "", tags: dict | None = None):
        self.name, self.doc, self.tags = name, doc, dict(tags or {})
        self._value: int | float = 0

    def inc(self, amount: int | float = 1) -> None:
        if not amount >= 0:  # also refuses NaN
            raise ValueError(f"counter {self.name} can only grow; inc({amount!r}) is not allowed")
        self._value += amount

    def snapshot(self) -> Counter:
        return Counter(self.name, self._value, dict(self.tags))


class GaugeMetric:
    """A value that is set, not accumulated (queue lengths, KV-cache usage)."""
    kind = "gauge"

    def __init__(self, name: str, doc: str = "", tags: dict | None = None):
        self.name, self.doc, self.tags = name, doc, dict(tags or {})
        self._value: int | float = 0

    def set(self, value: int | float) -> None:
        self._value = value

    def snapshot(self) -> Gauge:
        return Gauge(self.name, self._value, dict(self.tags))


class HistogramMetric:
    """Counts observations per bucket. Memory is fixed by the number of buckets: the observations
    themselves are never stored, only a count per bucket, their number and their sum."""
    kind = "histogram"

    def __init__(self, name: str, doc: str = "", buckets: Iterable[float] = LATENCY_BUCKETS,
                 tags: dict | None = None):
        bounds = [float(b) for b in buckets]
        if not bounds or any(math.isnan(b) for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"histogram {name} needs strictly increasing bucket bounds, got {bounds}")
        if not math.isinf(bounds[-1]):
            bounds.append(math.inf)
        self.name, self.doc, self.tags = name, doc, dict(tags or {})
        self.bounds: tuple[float, ...] = tuple(bounds)
        self._counts = [0] * len(bounds)  # per bucket, not cumulative
        self._count = 0
        self._sum = 0.0

    def observe(self, value: int | float) -> None:
        if math.isnan(value):
            raise ValueError(f"histogram {self.name} cannot observe NaN")
        self._counts[bisect.bisect_left(self.bounds, value)] += 1  # first bound >= value ("le")
        self._count += 1
        self._sum += value

    def snapshot(self) -> Histogram:
        cumulative, running = {}, 0
        for bound, n in zip(self.bounds, self._counts):
            running += n
            cumulative[bound] = running
        return Histogram(self.name, self._count, self._sum, cumulative, dict(self.tags))


Instrument = CounterMetric | GaugeMetric | HistogramMetric


# ---------------------------------------------------------------- the registry

class MetricsRegistry:
    """Holds the engine's instruments by name, in registration order, and the stream of per-step
    records (``steps``, metrics_reader.py). ``tags``: static labels copied onto every instrument."""

    def __init__(self, tags: dict | None = None):
        self.tags = dict(tags or {})
        self._metrics: dict[str, Instrument] = {}
        self.steps = StepStream()  # per-step records, handed to whoever subscribes, never kept here

    def _get_or_make(self, cls, name: str, doc: str, **kwargs):
        existing = self._metrics.get(name)
        if existing is not None:
            if not isinstance(existing, cls):
                raise ValueError(f"metric {name!r} is already registered as a {existing.kind}, not a {cls.kind}")
            return existing
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"metric name {name!r} is not valid: use letters, digits, '_' and ':'")
        metric = cls(name, doc, tags=self.tags, **kwargs)
        self._metrics[name] = metric
        return metric

    def counter(self, name: str, doc: str = "") -> CounterMetric:
        return self._get_or_make(CounterMetric, name, doc)

    def gauge(self, name: str, doc: str = "") -> GaugeMetric:
        return self._get_or_make(GaugeMetric, name, doc)

    def histogram(self, name: str, doc: str = "", buckets: Iterable[float] | None = None) -> HistogramMetric:
        """Create or return a histogram; ``buckets`` defaults to LATENCY_BUCKETS when it is created.
        Asking again with other buckets raises ValueError (None means "whatever it has")."""
        if name in self._metrics and buckets is not None:
            metric = self._get_or_make(HistogramMetric, name, doc)
            wanted = HistogramMetric(name, buckets=buckets).bounds
            if wanted != metric.bounds:
                raise ValueError(f"histogram {name!r} already has buckets {metric.bounds}, not {wanted}")
            return metric
        return self._get_or_make(HistogramMetric, name, doc,
                                 buckets=LATENCY_BUCKETS if buckets is None else buckets)

    def __contains__(self, name: str) -> bool:
        return name in self._metrics

    def __len__(self) -> int:
        return len(self._metrics)

    def names(self) -> list[str]:
        return list(self._metrics)

    def snapshot(self) -> list[MetricSnapshot]:
        """Every metric's current value, in registration order."""
        return [m.snapshot() for m in self._metrics.values()]

    def get(self, name: str) -> MetricSnapshot:
        """The snapshot of one metric, by its full name."""
        if name not in self._metrics:
            raise KeyError(f"no metric named {name!r}; known: {', '.join(self._metrics) or '(none)'}")
        return self._metrics[name].snapshot()

    def describe(self) -> dict[str, tuple[str, str]]:
        """{name: (kind, doc)} with kind "counter", "gauge" or "histogram" (Prometheus's type names)."""
        return {name: (m.kind, m.doc) for name, m in self._metrics.items()}


# ---------------------------------------------------------------- the engine's standard set

_ENGINE_COUNTERS = (
    ("num_preemptions", "Cumulative number of preemptions (recompute or swap)."),
    ("prefix_cache_queries", "Prefix cache queries, in tokens looked up."),
    ("prefix_cache_hits", "Prefix cache hits, in tokens found cached."),
    ("prompt_tokens", "Prompt tokens processed (prefill)."),
    ("generation_tokens", "Tokens generated (decode)."),
    ("request_success", "Requests that finished."),
    ("num_requests_aborted", "Requests aborted before finishing."),
    ("num_requests_refused", "Requests refused at admission (they can never fit)."),
    ("forward_passes", "Model forward passes run."),
    ("tokens_computed", "Tokens run through the model, including recomputed ones."),
    ("block_copies", "KV blocks copied (copy-on-write)."),
    ("blocks_swapped_out", "KV blocks swapped from GPU to CPU memory."),
    ("blocks_swapped_in", "KV blocks swapped from CPU back to GPU memory."),
    ("spec_decode_num_draft_tokens", "Draft tokens proposed by speculative decoding."),
    ("spec_decode_num_accepted_tokens", "Draft tokens accepted by the target model."),
)
_ENGINE_GAUGES = (
    ("num_requests_running", "Requests in the running batch."),
    ("num_requests_waiting", "Requests waiting to be scheduled."),
    ("num_requests_swapped", "Requests swapped out to CPU memory."),
    ("kv_cache_usage_perc", "KV-cache usage as a fraction, 0 (empty) to 1 (full)."),
)
_ENGINE_HISTOGRAMS = (
    ("time_to_first_token_seconds", "Time from arrival to the first output token.", LATENCY_BUCKETS),
    ("inter_token_latency_seconds", "Time between consecutive output tokens.", LATENCY_BUCKETS),
    ("e2e_request_latency_seconds", "Time from arrival to the request's end.", LATENCY_BUCKETS),
    ("step_seconds", "Wall time of one engine step (schedule + forward + sample).", LATENCY_BUCKETS),
    ("forward_seconds", "Wall time of one model forward pass.", LATENCY_BUCKETS),
    ("num_tokens_per_step", "Tokens scheduled in one engine step.", TOKEN_BUCKETS),
)


def engine_metrics(registry: MetricsRegistry | None = None) -> MetricsRegistry:
    """Register the engine's standard metrics ("minipaged:" + name) on registry (a new one if None)
    and return it. Calling it again on the same registry changes nothing."""
    registry = MetricsRegistry() if registry is None else registry
    for name, doc in _ENGINE_COUNTERS:
        registry.counter(PREFIX + name, doc)
    for name, doc in _ENGINE_GAUGES:
        registry.gauge(PREFIX + name, doc)
    for name, doc, buckets in _ENGINE_HISTOGRAMS:
        registry.histogram(PREFIX + name, doc, buckets)
    return registry
