"""``/metrics``: the engine's metrics in Prometheus's text format, through ``prometheus_client``.

    minipaged:num_requests_running{model_name="smollm2-135m"} 3.0
    minipaged:kv_cache_usage_perc{model_name="smollm2-135m"} 0.42
    minipaged:time_to_first_token_seconds_bucket{le="0.1",model_name="smollm2-135m"} 17.0

The engine keeps its own bounded instruments (metrics.py); this module does not copy them into
prometheus_client's. A custom collector reads a snapshot when Prometheus scrapes, taken by the engine
thread between two steps (``AsyncLLMEngine.inspect``), and hands it to prometheus_client, which
writes the format: counters get the ``_total`` suffix, histograms their ``_bucket`` (cumulative,
ending at ``+Inf``), ``_count`` and ``_sum`` series. Every series carries a ``model_name`` label, as
vLLM's do (vLLM's prefix is ``vllm:``, ours ``minipaged:``).

Not handled yet: per-request-class labels, multiprocess collection.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from minipaged.metrics_reader import Counter, Gauge, Histogram

CONTENT_TYPE = CONTENT_TYPE_LATEST


def families(snapshot, docs: dict, model_name: str) -> list:
    """prometheus_client metric families for one snapshot of the engine's metrics."""
    out = []
    labels = ["model_name"]
    for m in snapshot:
        doc = docs.get(m.name, ("", ""))[1] or m.name
        if isinstance(m, Counter):
            family = CounterMetricFamily(m.name, doc, labels=labels)
            family.add_metric([model_name], m.value)
        elif isinstance(m, Gauge):
            family = GaugeMetricFamily(m.name, doc, labels=labels)
            family.add_metric([model_name], m.value)
        elif isinstance(m, Histogram):
            family = HistogramMetricFamily(m.name, doc, labels=labels)
            buckets = [("+Inf" if b == float("inf") else repr(float(b)), n) for b, n in m.buckets.items()]
            family.add_metric([model_name], buckets, m.sum)
        else:
            continue
        out.append(family)
    return out


class _Snapshot:
    """A one-shot collector: what ``generate_latest`` reads."""

    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return self.fams


class PrometheusExporter:
    def __init__(self, engine, model_name: str):
        self.engine, self.model_name = engine, model_name

    async def render(self) -> bytes:
        snapshot, docs = await self.engine.inspect(lambda e: (e.get_metrics(), e.metrics.describe()))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(families(snapshot, docs, self.model_name)))
        return generate_latest(registry)
