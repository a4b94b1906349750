"""Chapter 08's figures: the steps a decode waits on, with and without chunks, and what a budget costs."""

from __future__ import annotations

from minipaged.lab.plots.style import save


def _finish(fig, axes, path: str | None, title: str):
    """What the line plots below end with: a light grid and a small legend on each of ``axes``, the
    figure's title, and ``save``."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return save(fig, path)


def plot_step_tokens(rows: list[dict], budget: int, steps: int = 160, path: str | None = None,
                     title: str | None = None):
    """rows from ``simulator.chunked.simulate_chunked``: the tokens each step computes, split into
    decodes and prompt work, for whole prefills and for one budget, over the first ``steps`` steps."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 4.6))
    axes = fig.subplots(2, 1, sharex=True, sharey=True)
    chosen = [rows[0], next(r for r in rows if r["budget"] == budget)]
    for ax, r in zip(axes, chosen):
        tokens, decodes = r["step_tokens"][:steps], r["decodes"][:steps]
        x = range(1, len(tokens) + 1)
        ax.fill_between(x, 1, tokens, step="mid", color="#ef6c00", label="prompt tokens (on top of the decodes)")
        ax.fill_between(x, 1, [max(d, 1) for d in decodes], step="mid", color="#1565c0", label="decode tokens")
        name = "whole prefills" if r["budget"] is None else f"chunked, max_num_batched_tokens={r['budget']}"
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_yscale("log")
        ax.set_ylim(1, None)
        ax.set_ylabel("tokens in the step")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, loc="upper right")
    axes[-1].set_xlabel("step (forward pass)")
    fig.suptitle(title or "Each step's tokens: a decode waits for its whole step")
    return save(fig, path)


def plot_budget_sweep(rows: list[dict], path: str | None = None, title: str | None = None):
    """rows from ``simulator.chunked.simulate_chunked``: inter-token latency and the price in time to
    first token and total time, against the budget, each relative to whole prefills."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 3.8))
    left, right = fig.subplots(1, 2)
    base, chunked = rows[0], rows[1:]
    x = [r["budget"] for r in chunked]
    for key, label, color, marker in (("itl_max", "ITL max", "#6a1b9a", "^"), ("itl_p99", "ITL p99", "#c62828", "o"),
                                      ("itl_p50", "ITL p50", "#1565c0", "s")):
        left.plot(x, [r[key] for r in chunked], marker=marker, color=color, label=label)
        left.axhline(base[key], color=color, linestyle=":", linewidth=1)
    left.set_ylabel("cost units (dotted: whole prefills)")
    left.set_yscale("log")
    for key, label, color, marker in (("ttft_short_p50", "TTFT p50, chat", "#2e7d32", "o"),
                                      ("ttft_long_p50", "TTFT p50, documents", "#ef6c00", "s"),
                                      ("total", "total time", "#616161", "^")):
        right.plot(x, [r[key] / base[key] for r in chunked], marker=marker, color=color, label=label)
    right.axhline(1, color="#9e9e9e", linewidth=0.8)
    right.set_ylabel("chunked / whole prefills")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(b) for b in x])
        ax.set_xlabel("max_num_batched_tokens")
    return _finish(fig, (left, right), path,
                   title or "A smaller budget: shorter waits between tokens, a later first token")


def plot_itl_cdf(systems: dict, path: str | None = None, title: str | None = None):
    """systems: {label: [inter-token gaps in seconds]} from ``bench.chunked``: what fraction of the
    gaps is at most x, per system."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 3.8))
    left, right = fig.subplots(1, 2)
    colors = ["#c62828", "#ef6c00", "#2e7d32", "#1565c0", "#6a1b9a", "#616161"]
    for (label, gaps), color in zip(systems.items(), colors):
        ordered = sorted(1000 * g for g in gaps)
        frac = [(i + 1) / len(ordered) for i in range(len(ordered))]
        left.plot(ordered, frac, color=color, label=label)
        right.plot(ordered, [1 - f for f in frac], color=color, label=label)
    left.set_ylabel("fraction of gaps <= x")
    right.set_ylabel("fraction of gaps > x")
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("time between two tokens of a request (ms)")
    return _finish(fig, (left, right), path, title or "Inter-token latency on SmolLM2: chunks cut the long waits")


def plot_step_cost(points: list[tuple[int, float]], fit: tuple[float, float], path: str | None = None,
                   title: str | None = None):
    """points: (tokens in a step, forward seconds) from ``bench.chunked``; fit: (overhead s, s per token)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    ax.scatter([t for t, _ in points], [1000 * s for _, s in points], s=6, alpha=0.4, color="#1565c0",
               label="one forward pass")
    top = max(t for t, _ in points)
    a, b = fit
    ax.plot([0, top], [1000 * a, 1000 * (a + b * top)], color="#c62828",
            label=f"{1000 * a:.0f} ms + {1000 * b:.2f} ms per token")
    ax.set_xlabel("tokens computed in the step")
    ax.set_ylabel("forward pass (ms)")
    return _finish(fig, (ax,), path, title or "What a step costs: a fixed part and a part per token")
