"""Chapter 06's picture: the running batch and the KV memory held, over time, one line per system.

Static batching shows a saw-tooth: a batch starts full, shrinks as its short requests finish, and
idles until its longest one ends. Continuous batching refills the batch at every step, so both the
batch and the memory held stay near the top until the queue runs out.
"""

from __future__ import annotations

from minipaged.lab.plots.style import save

COLORS = ["#c62828", "#2e7d32", "#1565c0", "#6a1b9a"]


def plot_serving_timeline(timelines: dict, capacity: int | None = None, path: str | None = None,
                          title: str | None = None, x_label: str = "time (s)"):
    """timelines: {system label: {"time": [...], "batch": [...], "kv_held": [fractions of the pool]}},
    e.g. from ``python -m minipaged bench serving`` or ``simulate_serving`` (steps as time)."""
    from matplotlib.figure import Figure

    if not timelines:
        raise ValueError("timelines is empty: give at least one system's time, batch and kv_held lists")
    fig = Figure(figsize=(8.0, 5.2))
    top, bottom = fig.subplots(2, 1, sharex=True)
    for color, (label, t) in zip(COLORS, timelines.items()):
        top.step(t["time"], t["batch"], where="post", color=color, lw=1.2, label=label)
        bottom.step(t["time"], [100 * x for x in t["kv_held"]], where="post", color=color, lw=1.2, label=label)
    top.set_ylabel("running batch (sequences)")
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="upper right")
    bottom.set_ylabel("KV memory held (% of pool)")
    bottom.set_ylim(0, 105)
    bottom.set_xlabel(x_label)
    bottom.grid(alpha=0.3)
    size = f" (a pool of {capacity} token slots)" if capacity else ""
    top.set_title(title or f"running batch and KV memory held, per step{size}")
    return save(fig, path)


def plot_capacity_sweep(result: dict, path: str | None = None, title: str | None = None):
    """Requests/s of each system against the KV capacity, from ``bench serving --capacities``: with
    little memory paging buys the most; with plenty, something else (max_num_seqs, the CPU) limits all."""
    from matplotlib.figure import Figure

    rows = result["rows"]
    if not rows:
        raise ValueError("result has no rows: run bench serving --capacities with at least one capacity")
    x = [row["kv_capacity_tokens"] for row in rows]
    fig = Figure(figsize=(6.8, 4.2))
    ax = fig.add_subplot()
    colors = ["#c62828", "#ef6c00", "#f9a825", "#6a1b9a", "#2e7d32"]
    names = [s["system"] for s in rows[0]["systems"]]
    for i, name in enumerate(names):
        color = colors[-1] if i == len(names) - 1 else colors[i % (len(colors) - 1)]
        y = [row["systems"][i]["requests_per_s"] for row in rows]
        ax.plot(x, y, marker="o", color=color, label=name.split(":")[0])
        for xi, yi, row in zip(x, y, rows):
            ax.annotate(f"{row['systems'][i]['mean_batch']:.1f}", (xi, yi), textcoords="offset points",
                        xytext=(3, 4), fontsize=7, color=color)
    ax.set_xlabel("KV capacity (token slots)")
    ax.set_ylabel("requests/s (labels: mean running batch)")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"{result['model']}: the less memory, the more paging buys")
    return save(fig, path)
