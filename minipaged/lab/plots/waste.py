"""Where the KV pool went, per policy: the course's own version of the vLLM paper's Figure 2.

One stacked bar per policy: the share of the pool holding tokens, reserved for tokens still to come,
lost to internal and to external fragmentation, and free, each time-averaged over the loaded steps
of a simulation. The number above a bar is the utilization, tokens / occupied slots.
"""

from __future__ import annotations

from minipaged.lab.plots.style import TERM_COLORS, TERM_LABELS, save

TERMS = ("tokens", "reserved", "internal", "external", "free")


def plot_waste_breakdown(results, path: str | None = None, title: str | None = None):
    """results: SimulationResult objects (or their ``summary()`` dicts), one bar each."""
    from matplotlib.figure import Figure

    rows = [r if isinstance(r, dict) else r.summary() for r in results]
    fig = Figure(figsize=(max(6.0, 1.0 * len(rows) + 2), 4.8))
    ax = fig.add_subplot()
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for term in TERMS:
        heights = [100 * row["mean_usage"].get(term, 0.0) for row in rows]
        ax.bar(x, heights, bottom=bottom, color=TERM_COLORS[term], label=TERM_LABELS[term],
               edgecolor="white", linewidth=0.5)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, row in enumerate(rows):
        ax.text(i, bottom[i] + 1, f"{100 * row['utilization']:.1f}%", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(list(x), [row["policy"] for row in rows], rotation=30, ha="right")
    ax.set_ylabel("share of the KV pool (%)")
    ax.set_ylim(0, 112)
    ax.set_title(title or "KV memory by policy (label: utilization = tokens / occupied)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return save(fig, path)
