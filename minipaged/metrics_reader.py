"""What a user reads of the engine's metrics: frozen snapshots, and two helpers to look into them.

    from minipaged.metrics_reader import find
    find(llm.get_metrics(), "num_preemptions").value        # 1

The engine keeps live instruments (metrics.py); ``LLM.get_metrics()`` returns one snapshot of each:
a ``Counter`` or ``Gauge`` with ``.name`` and ``.value``, or a ``Histogram`` with its cumulative
buckets (ending at +Inf, as Prometheus's "le"), ``count``, ``sum`` and an estimated ``quantile``.
``StepStream`` hands the per-step records (``step_record``) to subscribers, and a ``StepRecorder``
keeps them for a benchmark (``with registry.steps.recording() as rec:``).
vLLM V1 has the same kinds in vllm/v1/metrics/reader.py; its Vector kind is not here yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PREFIX = "minipaged:"


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


class StepStream:
    """Per-step records, forwarded to subscribers and never stored: the core publishes one after each
    step only while someone subscribes (``subscribers`` is non-empty), so nobody listening costs
    nothing. ``step_record`` says what a record holds."""

    def __init__(self):
        self.subscribers: list[Callable[[dict], None]] = []

    def subscribe(self, fn: Callable[[dict], None]) -> Callable[[dict], None]:
        """Call ``fn(record)`` on every publish; subscribing the same callable twice is a no-op.
        Returns fn, so it can be used as a decorator."""
        if fn not in self.subscribers:
            self.subscribers.append(fn)
        return fn

    def unsubscribe(self, fn: Callable[[dict], None]) -> None:
        """Stop calling fn; ValueError if it was not subscribed."""
        try:
            self.subscribers.remove(fn)
        except ValueError:
            raise ValueError(f"{fn!r} is not subscribed") from None

    def publish(self, record: dict) -> None:
        """Hand one engine step's record (a dict of plain values) to every subscriber."""
        for fn in list(self.subscribers):  # a subscriber may unsubscribe itself
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


def step_record(core, plan, output) -> dict:
    """What the pool and the queues were at one step, as the forward pass saw them (before the step's
    output changes them); the core adds ``step_seconds`` once the step is over."""
    policy, scheduler = core.policy, core.scheduler
    usage = policy.usage()
    record = {"step": core.num_steps, "forward_seconds": output.forward_seconds,
              "batch_size": len(plan.work), "num_tokens": plan.num_tokens, "num_decodes": plan.num_decodes,
              "num_prefill_tokens": plan.num_prefill_tokens, "preempted": plan.preempted,
              "kv_utilization": usage.utilization, "kv_occupied": usage.occupied / usage.total,
              "running": len(scheduler.running), "waiting": len(scheduler.waiting), "swapped": len(scheduler.swapped)}
    if policy.shares_blocks:
        sharing = policy.sharing()
        record["blocks_physical"], record["blocks_logical"] = sharing.physical_blocks, sharing.logical_blocks
    return record


class StepRecorder:
    """A subscriber that keeps every published step record (a shallow copy) in ``.records``: for a
    benchmark that wants the timeline of one run. Its memory grows with the run, so subscribe it only
    for as long as needed (``with registry.steps.recording() as rec:``)."""

    def __init__(self):
        self.records: list[dict] = []

    def __call__(self, record: dict) -> None:
        self.records.append(dict(record))

    def series(self, key: str, default=None) -> list:
        """One field across all records, e.g. rec.series("num_running")."""
        return [r.get(key, default) for r in self.records]

    def __len__(self) -> int:
        return len(self.records)


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
