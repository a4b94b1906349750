"""Chapter 11's picture, the vLLM paper's headline figure: normalized latency against request rate.

Each system's latency stays nearly flat while it keeps up with the arrivals, then climbs once its
queue grows faster than it drains: the further right the knee, the higher the rate it sustains with
the same KV memory. The second panel shows why: achieved requests/s follows the offered rate (the
diagonal) until the system saturates, then flattens (with a few dozen requests it stays a little
below the diagonal even before: the last requests' decode, after the last arrival, counts in the
run's duration).
"""

from __future__ import annotations

from minipaged.plots.style import save

COLORS = {"static": "#c62828", "orca": "#ef6c00", "paged": "#1565c0"}
MARKERS = {"static": "s", "orca": "^", "paged": "o"}


def plot_online_latency(systems: list[dict], path: str | None = None, title: str | None = None):
    """systems: ``bench online``'s result["systems"]: each {"system": label, "key": "static" | "orca" |
    "paged", "runs": [{"rate", "normalized_latency_s", "requests_per_s", "finished", "requests"}], and
    optionally "threshold_s_per_token" (drawn dashed)}. A run where some request did not finish is
    ringed (its latency counts the finished ones only)."""
    from matplotlib.figure import Figure

    if not systems or not any(s["runs"] for s in systems):
        raise ValueError("systems is empty: give at least one system with runs")
    fig = Figure(figsize=(11.0, 4.4))
    left, right = fig.subplots(1, 2)
    top_rate = max(r["rate"] for s in systems for r in s["runs"])
    for i, s in enumerate(systems):
        color = COLORS.get(s.get("key"), f"C{i}")
        marker = MARKERS.get(s.get("key"), "o")
        runs = [r for r in s["runs"] if r["normalized_latency_s"] is not None]
        left.plot([r["rate"] for r in runs], [r["normalized_latency_s"] for r in runs], color=color, lw=1.5,
                  marker=marker, label=s["system"])
        for r in runs:
            if r["finished"] < r["requests"]:
                left.plot([r["rate"]], [r["normalized_latency_s"]], marker=marker, ms=11, mfc="none", color=color)
        if s.get("threshold_s_per_token"):
            left.axhline(s["threshold_s_per_token"], color=color, ls="--", lw=0.8, alpha=0.7)
        right.plot([r["rate"] for r in s["runs"]], [r["requests_per_s"] for r in s["runs"]], color=color, lw=1.5,
                   marker=marker, label=s["system"])
    left.set_yscale("log")
    left.set_xlabel("request rate (requests/s)")
    left.set_ylabel("normalized latency (s/token)")
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=8, loc="best")
    left.set_title("mean latency per output token (dashed: sustain thresholds)")
    right.plot([0, top_rate], [0, top_rate], color="#9e9e9e", ls=":", lw=1, label="offered = achieved")
    right.set_xlabel("offered request rate (requests/s)")
    right.set_ylabel("achieved requests/s")
    right.set_xlim(left=0)
    right.set_ylim(bottom=0)
    right.grid(alpha=0.3)
    right.legend(fontsize=8, loc="upper left")
    right.set_title("throughput")
    if title:
        fig.suptitle(title, fontsize=10)
    return save(fig, path)
