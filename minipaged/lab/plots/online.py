"""Chapter 11's picture, the vLLM paper's Fig. 12: normalized latency against request rate.

    python -m minipaged.lab.plots.online chapters/11_serving/results/bench_online.json online_latency.png

Left: each system's mean normalized latency (s/token) against the request rate, from the simulated
sweep (the line: the mean over seeds; the band: the lowest and highest seed), with the real
servers' runs on top (hollow markers, one per seed) and the threshold every system is held to
(dashed: twice the unloaded latency). A curve stays nearly flat while the system keeps up, then climbs
once its queue grows faster than it drains: the further right the climb, the higher the rate it
sustains with the same KV memory.

Right: achieved requests/s against the offered rate (simulated, mean over seeds). Each system
follows the diagonal while it keeps up, then flattens at what it can serve when never idle: the
flat part is its capacity, and where it leaves the diagonal is where the left panel climbs.
"""

from __future__ import annotations

import json
import sys

from minipaged.lab.plots.style import save

COLORS = {"static": "#c62828", "orca_max": "#ef6c00", "orca_pow2": "#f9a825", "orca_oracle": "#6a1b9a",
          "paged": "#1565c0"}
MARKERS = {"static": "s", "orca_max": "^", "orca_pow2": "v", "orca_oracle": "D", "paged": "o"}


def plot_online_latency(result: dict, path: str | None = None, title: str | None = None):
    """result: ``bench online``'s result (or a record's ``results``): its ``simulated.systems`` (key ->
    {"system", "runs": [{"rate", "normalized_latency_s", "normalized_min_s", "normalized_max_s",
    "requests_per_s"}]}), ``simulated.threshold_s_per_token`` and ``real.systems`` (key -> {"runs": [{"rate",
    "seeds": [{"normalized_latency_s"}]}]})."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    systems = result["simulated"]["systems"]
    if not systems or not any(s["runs"] for s in systems.values()):
        raise ValueError("result has no simulated runs to draw")
    real = result.get("real", {}).get("systems", {})
    fig = Figure(figsize=(12.0, 4.8))
    left, right = fig.subplots(1, 2)
    rates = [r["rate"] for s in systems.values() for r in s["runs"]]
    for i, (key, s) in enumerate(systems.items()):
        color, marker = COLORS.get(key, f"C{i}"), MARKERS.get(key, "o")
        runs = [r for r in s["runs"] if r["normalized_latency_s"] is not None]
        x = [r["rate"] for r in runs]
        left.plot(x, [r["normalized_latency_s"] for r in runs], color=color, lw=1.6, marker=marker, ms=4,
                  label=s["system"])
        left.fill_between(x, [r["normalized_min_s"] for r in runs], [r["normalized_max_s"] for r in runs],
                          color=color, alpha=0.15, lw=0)
        for run in real.get(key, {}).get("runs", []):
            values = [x["normalized_latency_s"] for x in run["seeds"] if x["normalized_latency_s"]]
            left.plot([run["rate"]] * len(values), values, ls="none", marker=marker, ms=9, mfc="none", mew=1.6,
                      color=color)
        right.plot([r["rate"] for r in s["runs"]], [r["requests_per_s"] for r in s["runs"]], color=color, lw=1.6,
                   marker=marker, ms=4, label=s["system"])
    threshold = result["simulated"].get("threshold_s_per_token")
    if threshold:
        factor = result.get("sustain_factor", 2)
        left.axhline(threshold, color="#424242", ls="--", lw=1, label=f"threshold: {factor:g} x the unloaded latency")
    if real:
        left.plot([], [], ls="none", marker="o", mfc="none", color="#424242", label="real server (one per seed)")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax in (left, right):
        ax.set_xscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("request rate (requests/s)")
        ax.grid(alpha=0.3, which="both")
    left.set_yscale("log")
    left.set_ylabel("normalized latency (s/token)")
    left.legend(fontsize=7.5, loc="upper left")
    left.set_title("mean latency per output token (band: lowest to highest seed)", fontsize=10)
    lo, hi = min(rates), max(rates)
    right.plot([lo, hi], [lo, hi], color="#9e9e9e", ls=":", lw=1, label="achieved = offered")
    right.set_yscale("log")
    for axis in (left.xaxis, right.xaxis, right.yaxis, left.yaxis):
        axis.set_major_formatter(plain)
    right.set_ylabel("achieved requests/s")
    right.legend(fontsize=7.5, loc="upper left")
    right.set_title("throughput: the diagonal while a system keeps up, flat at its capacity", fontsize=10)
    if title is None:
        sim = result["simulated"]
        title = (f"{result['model']}: {sim['requests']} ShareGPT-like requests x{result['scale']} per rate, "
                 f"{sim['seeds']} seeds, {result['kv_capacity_tokens']} KV slots\nlines: simulated with the "
                 f"step time calibrated on the real engine; rings: real servers, "
                 f"{result.get('real', {}).get('requests', '?')} requests a run (a shorter queue)")
    fig.suptitle(title, fontsize=10, y=1.0)
    fig.subplots_adjust(top=0.84, wspace=0.22)
    return save(fig, path)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m minipaged.lab.plots.online RECORD.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        data = json.load(f)
    plot_online_latency(data.get("results", data), path=argv[1])
    print(f"saved {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
