"""Engine statistics: typed counters, gauges and histograms whose memory stays bounded however long the engine runs.

    registry = engine_metrics(MetricsRegistry())
    registry.counter("minipaged:num_preemptions").inc()
    registry.histogram("minipaged:step_seconds").observe(0.012)
    find(registry.snapshot(), "num_preemptions").value        # 1

The engine owns live *instruments* (``CounterMetric``, ``GaugeMetric``, ``HistogramMetric``) kept in a
``MetricsRegistry``; users read frozen *snapshots* (``Counter``, ``Gauge``, ``Histogram``), each with
``.name`` and ``.value``. A histogram keeps only a count per bucket, the number of observations and
their sum, so a million observations cost what ten do. Timelines (one entry per engine step) are not
kept by the registry: the engine calls ``publish_step(record)`` and whoever wants them subscribes a
recorder, e.g. ``with registry.recording() as rec:`` for one benchmark run.

How it maps to vLLM V1 (``LLM.get_metrics()``, vllm/v1/metrics/reader.py): the snapshot kinds are the
same (Counter, Gauge, Histogram with cumulative buckets ending at +Inf), and ``engine_metrics`` names the
standard set as vLLM does with a "minipaged:" prefix instead of "vllm:", e.g. num_preemptions,
prefix_cache_queries/hits (tokens), prompt_tokens, generation_tokens, request_success,
num_requests_running/waiting, kv_cache_usage_perc (a fraction 0..1), time_to_first_token_seconds,
inter_token_latency_seconds, e2e_request_latency_seconds, spec_decode_num_draft/accepted_tokens.
A few are ours: forward_passes, tokens_computed, block_copies, blocks_swapped_out/in, step_seconds,
forward_seconds, num_tokens_per_step, num_requests_refused. Counters carry no "_total" suffix here;
a Prometheus exporter adds it, as prometheus_client does.

Not handled yet: labels beyond a static tags dict per instrument (no per-model or per-engine label sets,
no child series), vLLM's Vector kind (per-position spec-decode acceptance), thread safety (the engine
loop is single-threaded), and Prometheus text exposition: the server layer builds that later from
``describe()`` and ``snapshot()``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PREFIX = "minipaged:"

# Seconds, a 1-2-5 series from 1 ms to 2 minutes (roughly log spaced); +Inf is added by HistogramMetric.
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
                                      1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 120.0)
# Tokens per engine step: powers of two, 1 .. 8192.
TOKEN_BUCKETS: tuple[float, ...] = tuple(float(2 ** i) for i in range(14))

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # what Prometheus accepts as a metric name


# ---------------------------------------------------------------- snapshots (what users read)

@dataclass(frozen=True)
class Counter:
    """A counter's value at snapshot time: only ever grows."""
    name: str
    value: int | float
    tags: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Gauge:
    """A gauge's value at snapshot time: can go up and down."""
    name: str
    value: int | float
    tags: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Histogram:
    """A histogram at snapshot time. ``buckets`` maps each upper bound to the number of observations
    <= it (cumulative, as Prometheus's "le"), in increasing order; the last key is float('inf')."""
    name: str
    count: int
    sum: float
    buckets: dict[float, int] = field(default_factory=dict, hash=False)
    tags: dict = field(default_factory=dict, hash=False)

    @property
    def value(self) -> float:
        """The mean observation (sum / count), 0.0 when nothing was observed."""
        return self.sum / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """An *estimate* of the q-quantile (0 <= q <= 1) from the buckets alone, as Prometheus's
        histogram_quantile does: find the bucket holding the rank q * count and interpolate linearly
        between its lower and upper bound (the first bucket's lower bound is 0, or its upper bound if
        that is negative). A rank in the +Inf bucket returns the largest finite bound. The true value
        lies somewhere in the same bucket; 0.0 when nothing was observed."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q={q!r} must be between 0 and 1")
        if not self.count:
            return 0.0
        rank = q * self.count
        bounds = list(self.buckets)
        finite = [b for b in bounds if not math.isinf(b)]
        prev_bound, prev_cum = min(0.0, bounds[0]), 0
        for bound in bounds:
            cum = self.buckets[bound]
            if cum > prev_cum and rank <= cum:
                if math.isinf(bound):
                    return finite[-1] if finite else 0.0
                return prev_bound + (bound - prev_bound) * (rank - prev_cum) / (cum - prev_cum)
            prev_bound, prev_cum = bound, cum
        return finite[-1] if finite else 0.0  # unreachable while the last bucket holds every observation


MetricSnapshot = Counter | Gauge | Histogram


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


# ---------------------------------------------------------------- per-step records

class StepRecorder:
    """A subscriber that keeps every published step record (a shallow copy) in ``.records``: for a
    benchmark that wants the timeline of one run. Its memory grows with the run, so subscribe it only
    for as long as needed (``with registry.recording() as rec:``)."""

    def __init__(self):
        self.records: list[dict] = []

    def __call__(self, record: dict) -> None:
        self.records.append(dict(record))

    def series(self, key: str, default=None) -> list:
        """One field across all records, e.g. rec.series("num_running")."""
        return [r.get(key, default) for r in self.records]

    def __len__(self) -> int:
        return len(self.records)


# ---------------------------------------------------------------- the registry

class MetricsRegistry:
    """Holds the engine's instruments by name, in registration order, and forwards per-step records
    to subscribers. ``tags`` are static labels copied onto every instrument made here."""

    def __init__(self, tags: dict | None = None):
        self.tags = dict(tags or {})
        self._metrics: dict[str, Instrument] = {}
        self._subscribers: list[Callable[[dict], None]] = []

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

    # -- per-step records: forwarded, never stored here

    def subscribe(self, fn: Callable[[dict], None]) -> Callable[[dict], None]:
        """Call ``fn(record)`` on every publish_step; subscribing the same callable twice is a no-op.
        Returns fn, so it can be used as a decorator."""
        if fn not in self._subscribers:
            self._subscribers.append(fn)
        return fn

    def unsubscribe(self, fn: Callable[[dict], None]) -> None:
        """Stop calling fn; ValueError if it was not subscribed."""
        try:
            self._subscribers.remove(fn)
        except ValueError:
            raise ValueError(f"{fn!r} is not subscribed") from None

    @property
    def listening(self) -> bool:
        """Whether any recorder is subscribed (so a publisher can skip building records nobody reads)."""
        return bool(self._subscribers)

    def publish_step(self, record: dict) -> None:
        """Hand one engine step's record (a dict of plain values) to every subscriber."""
        for fn in list(self._subscribers):  # a subscriber may unsubscribe itself
            fn(record)

    @contextmanager
    def recording(self) -> Iterator[StepRecorder]:
        """Subscribe a fresh StepRecorder for the duration of the with-block (unsubscribed on exit,
        also on an exception)."""
        recorder = StepRecorder()
        self.subscribe(recorder)
        try:
            yield recorder
        finally:
            self.unsubscribe(recorder)


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


def find(metrics: Iterable[MetricSnapshot], name: str) -> MetricSnapshot:
    """The one snapshot called ``name`` or "minipaged:" + name, e.g. find(llm.get_metrics(), "num_preemptions")."""
    metrics = list(metrics)
    wanted = {name, PREFIX + name}
    hits = [m for m in metrics if m.name in wanted]
    if not hits:
        raise KeyError(f"no metric named {name!r}; known: {', '.join(m.name for m in metrics) or '(none)'}")
    if len(hits) > 1:
        raise ValueError(f"{len(hits)} metrics match {name!r}: {[m.name for m in hits]}")
    return hits[0]


def percentile(values, q: float):
    """The q-th percentile (0..100) of a list of numbers by the nearest rank, or None if it is empty.
    For a benchmark's own list of latencies (a histogram estimates it with ``Histogram.quantile``)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else None
