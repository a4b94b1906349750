"""Utilization against block size: small blocks waste little but mean long tables, large ones
waste up to a block per sequence. One line per policy, from ``simulator.sweep_block_size``."""

from __future__ import annotations

from minipaged.lab.plots.style import save


def plot_block_size_sweep(sweep: dict, path: str | None = None, title: str | None = None):
    """sweep: {label: {block_size: SimulationResult or utilization (0..1)}}."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for label, runs in sweep.items():
        sizes = sorted(int(bs) for bs in runs)
        values = []
        for bs in sizes:
            run = runs[bs] if bs in runs else runs[str(bs)]
            values.append(100 * (run if isinstance(run, float) else run.utilization))
        ax.plot(sizes, values, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("utilization: tokens / occupied (%)")
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)
    ax.set_title(title or "KV utilization by block size")
    ax.legend(fontsize=8, loc="lower left")
    return save(fig, path)
