"""minipaged.metrics and metrics_reader: typed engine statistics with bounded memory (plain Python, no model needed)."""

import dataclasses
import math

import pytest

from minipaged.metrics import (
    LATENCY_BUCKETS,
    TOKEN_BUCKETS,
    CounterMetric,
    GaugeMetric,
    HistogramMetric,
    MetricsRegistry,
    engine_metrics,
)
from minipaged.metrics_reader import PREFIX, Counter, Gauge, Histogram, StepRecorder, find

ENGINE_COUNTERS = [
    "num_preemptions", "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens",
    "request_success", "num_requests_aborted", "num_requests_refused", "forward_passes", "tokens_computed",
    "block_copies", "blocks_swapped_out", "blocks_swapped_in", "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
]
ENGINE_GAUGES = ["num_requests_running", "num_requests_waiting", "num_requests_swapped", "kv_cache_usage_perc"]
ENGINE_HISTOGRAMS = [
    "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds", "step_seconds",
    "forward_seconds", "num_tokens_per_step",
]


# ---------------------------------------------------------------- counters and gauges

def test_counter_increments_and_snapshots_are_frozen():
    c = CounterMetric("x", "doc")
    assert c.snapshot().value == 0
    c.inc()
    c.inc(5)
    c.inc(0.5)
    snap = c.snapshot()
    assert isinstance(snap, Counter) and snap.name == "x" and snap.value == 6.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.value = 0
    c.inc()
    assert snap.value == 6.5 and c.snapshot().value == 7.5  # a snapshot does not follow the live counter


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan")])
def test_counter_rejects_negative_amounts(bad):
    c = CounterMetric("x")
    c.inc(3)
    with pytest.raises(ValueError, match="x"):
        c.inc(bad)
    assert c.snapshot().value == 3


def test_gauge_set_goes_up_and_down():
    g = GaugeMetric("g")
    g.set(10)
    g.set(0.25)
    snap = g.snapshot()
    assert isinstance(snap, Gauge) and snap.name == "g" and snap.value == 0.25


# ---------------------------------------------------------------- histograms

def test_histogram_counts_sum_and_cumulative_buckets_exactly():
    h = HistogramMetric("h", buckets=[1, 2, 5])
    for v in [0.5, 1.0, 1.5, 2.0, 3.0, 7.0, 100.0]:
        h.observe(v)
    snap = h.snapshot()
    assert isinstance(snap, Histogram)
    assert snap.count == 7 and snap.sum == pytest.approx(115.0)
    # bounds are "le": 1.0 counts in the 1 bucket, 2.0 in the 2 bucket
    assert snap.buckets == {1.0: 2, 2.0: 4, 5.0: 5, math.inf: 7}
    assert list(snap.buckets) == [1.0, 2.0, 5.0, math.inf]
    assert snap.value == pytest.approx(115.0 / 7)


def test_empty_histogram_mean_and_quantile_are_zero():
    snap = HistogramMetric("h", buckets=[1, 2]).snapshot()
    assert snap.count == 0 and snap.sum == 0.0 and snap.value == 0.0 and snap.quantile(0.5) == 0.0
    assert snap.buckets == {1.0: 0, 2.0: 0, math.inf: 0}


def test_quantile_estimate_lies_in_the_right_bucket_and_interpolates():
    h = HistogramMetric("h", buckets=[0.01, 0.1, 1.0, 10.0])
    for _ in range(10):
        h.observe(0.005)  # bucket (0, 0.01]
    for _ in range(80):
        h.observe(0.5)  # bucket (0.1, 1]
    for _ in range(10):
        h.observe(5.0)  # bucket (1, 10]
    snap = h.snapshot()
    median = snap.quantile(0.5)
    assert 0.1 < median <= 1.0
    assert median == pytest.approx(0.1 + 0.9 * (50 - 10) / 80)  # linear within the bucket
    assert 0.0 < snap.quantile(0.05) <= 0.01
    assert 1.0 < snap.quantile(0.95) <= 10.0
    assert snap.quantile(1.0) == pytest.approx(10.0)
    qs = [snap.quantile(q / 20) for q in range(21)]
    assert qs == sorted(qs)  # monotone in q


def test_quantile_in_the_overflow_bucket_returns_the_largest_finite_bound():
    h = HistogramMetric("h", buckets=[1, 2])
    for _ in range(4):
        h.observe(50.0)
    assert h.snapshot().quantile(0.5) == 2.0


@pytest.mark.parametrize("q", [-0.1, 1.5])
def test_quantile_rejects_q_outside_zero_one(q):
    h = HistogramMetric("h", buckets=[1])
    h.observe(0.5)
    with pytest.raises(ValueError):
        h.snapshot().quantile(q)


@pytest.mark.parametrize("buckets", [[], [2, 1], [1, 1, 2], [1, float("nan")]])
def test_histogram_rejects_bad_buckets(buckets):
    with pytest.raises(ValueError):
        HistogramMetric("h", buckets=buckets)


def test_histogram_memory_is_bounded_whatever_the_number_of_observations():
    h = HistogramMetric("h", buckets=LATENCY_BUCKETS)
    stored_before = len(h._counts)
    attrs_before = {k: (len(v) if hasattr(v, "__len__") else None) for k, v in vars(h).items()}
    for i in range(100_000):
        h.observe((i % 1000) * 0.001)
    assert len(h._counts) == stored_before == len(LATENCY_BUCKETS) + 1  # one count per bucket, +Inf included
    assert {k: (len(v) if hasattr(v, "__len__") else None) for k, v in vars(h).items()} == attrs_before
    snap = h.snapshot()
    assert snap.count == 100_000 and snap.buckets[math.inf] == 100_000
    assert len(snap.buckets) == stored_before


def test_latency_buckets_span_milliseconds_to_minutes_log_spaced():
    assert LATENCY_BUCKETS[0] == pytest.approx(0.001) and LATENCY_BUCKETS[-1] == pytest.approx(120.0)
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))
    ratios = [b / a for a, b in zip(LATENCY_BUCKETS, LATENCY_BUCKETS[1:])]
    assert all(1.5 <= r <= 3.0 for r in ratios)
    assert list(TOKEN_BUCKETS) == [2.0 ** i for i in range(14)]


# ---------------------------------------------------------------- registry

def test_registry_creates_or_returns_and_keeps_registration_order():
    reg = MetricsRegistry()
    c = reg.counter("b_counter", "a counter")
    g = reg.gauge("a_gauge", "a gauge")
    h = reg.histogram("c_hist", "a histogram", buckets=[1, 2])
    assert reg.counter("b_counter") is c and reg.gauge("a_gauge") is g and reg.histogram("c_hist") is h
    assert reg.histogram("c_hist", buckets=[1, 2]) is h
    c.inc(2)
    g.set(3)
    h.observe(1.5)
    snaps = reg.snapshot()
    assert [s.name for s in snaps] == ["b_counter", "a_gauge", "c_hist"]
    assert [type(s) for s in snaps] == [Counter, Gauge, Histogram]
    assert [s.value for s in snaps] == [2, 3, 1.5]
    assert reg.describe() == {"b_counter": ("counter", "a counter"), "a_gauge": ("gauge", "a gauge"),
                              "c_hist": ("histogram", "a histogram")}


@pytest.mark.parametrize("first, second", [("counter", "gauge"), ("gauge", "histogram"), ("histogram", "counter")])
def test_registry_kind_conflict_raises(first, second):
    reg = MetricsRegistry()
    getattr(reg, first)("m", "doc")
    with pytest.raises(ValueError, match=first):
        getattr(reg, second)("m", "doc")


def test_registry_histogram_with_other_buckets_raises():
    reg = MetricsRegistry()
    reg.histogram("h", "doc", buckets=[1, 2])
    with pytest.raises(ValueError, match="buckets"):
        reg.histogram("h", "doc", buckets=[1, 3])


def test_registry_rejects_invalid_names():
    with pytest.raises(ValueError):
        MetricsRegistry().counter("has space")


def test_get_returns_one_snapshot_and_unknown_name_lists_known_ones():
    reg = MetricsRegistry()
    reg.counter("alpha").inc(4)
    reg.gauge("beta")
    assert reg.get("alpha") == Counter("alpha", 4, {})
    with pytest.raises(KeyError) as err:
        reg.get("gamma")
    message = str(err.value)
    assert "gamma" in message and "alpha" in message and "beta" in message


def test_static_tags_are_copied_onto_snapshots():
    reg = MetricsRegistry(tags={"model": "tiny"})
    reg.counter("c").inc()
    snap = reg.get("c")
    assert snap.tags == {"model": "tiny"}
    snap.tags["model"] = "changed"
    assert reg.get("c").tags == {"model": "tiny"}


# ---------------------------------------------------------------- per-step records

def test_recorder_receives_records_only_while_subscribed():
    reg = MetricsRegistry()
    reg.steps.publish({"step": 0})  # nobody listening: nothing stored anywhere
    with reg.steps.recording() as rec:
        assert isinstance(rec, StepRecorder)
        reg.steps.publish({"step": 1, "num_running": 2})
        reg.steps.publish({"step": 2, "num_running": 3})
    reg.steps.publish({"step": 3})
    assert rec.records == [{"step": 1, "num_running": 2}, {"step": 2, "num_running": 3}]
    assert rec.series("num_running") == [2, 3] and len(rec) == 2
    assert reg.steps.subscribers == []


def test_recording_unsubscribes_after_an_exception():
    reg = MetricsRegistry()
    with pytest.raises(RuntimeError, match="boom"):
        with reg.steps.recording() as rec:
            reg.steps.publish({"step": 1})
            raise RuntimeError("boom")
    reg.steps.publish({"step": 2})
    assert rec.records == [{"step": 1}]
    assert reg.steps.subscribers == []


def test_subscribe_and_unsubscribe_plain_callables():
    reg = MetricsRegistry()
    seen = []
    fn = reg.steps.subscribe(seen.append)
    reg.steps.subscribe(fn)  # twice is still once
    reg.steps.publish({"a": 1})
    reg.steps.unsubscribe(fn)
    reg.steps.publish({"a": 2})
    assert seen == [{"a": 1}]
    with pytest.raises(ValueError):
        reg.steps.unsubscribe(fn)


def test_recorder_copies_records():
    reg = MetricsRegistry()
    record = {"step": 1}
    with reg.steps.recording() as rec:
        reg.steps.publish(record)
    record["step"] = 99  # the engine reusing its dict does not rewrite history
    assert rec.records == [{"step": 1}]


# ---------------------------------------------------------------- the engine's standard set

def test_engine_metrics_registers_every_listed_name_once_with_docs():
    reg = MetricsRegistry()
    assert engine_metrics(reg) is reg
    names = reg.names()
    expected = {PREFIX + n for n in ENGINE_COUNTERS + ENGINE_GAUGES + ENGINE_HISTOGRAMS}
    assert PREFIX == "minipaged:"
    assert len(names) == len(set(names)) == len(expected) and set(names) == expected
    described = reg.describe()
    assert {n for n, (kind, _) in described.items() if kind == "counter"} == {PREFIX + n for n in ENGINE_COUNTERS}
    assert {n for n, (kind, _) in described.items() if kind == "gauge"} == {PREFIX + n for n in ENGINE_GAUGES}
    assert {n for n, (kind, _) in described.items() if kind == "histogram"} == {PREFIX + n for n in ENGINE_HISTOGRAMS}
    assert all(doc for _, doc in described.values())
    engine_metrics(reg)  # idempotent
    assert reg.names() == names
    tokens = reg.get("minipaged:num_tokens_per_step").buckets
    assert list(tokens) == [2.0 ** i for i in range(14)] + [math.inf]
    assert list(reg.get("minipaged:step_seconds").buckets)[:-1] == list(LATENCY_BUCKETS)


def test_find_accepts_short_and_full_names():
    reg = engine_metrics(MetricsRegistry())
    reg.counter("minipaged:num_preemptions").inc(3)
    reg.gauge("minipaged:kv_cache_usage_perc").set(0.75)
    metrics = reg.snapshot()
    assert find(metrics, "num_preemptions").value == 3
    assert find(metrics, "minipaged:num_preemptions").value == 3
    assert find(metrics, "kv_cache_usage_perc").value == 0.75
    with pytest.raises(KeyError, match="num_preemptions"):
        find(metrics, "no_such_metric")
