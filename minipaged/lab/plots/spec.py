"""Chapter 09's figure: what speculation buys, per kind of request and number of guessed tokens."""

from __future__ import annotations

from minipaged.lab.plots.style import save


def plot_spec_speedup(result: dict, path: str | None = None, title: str | None = None):
    """result from ``bench.speculative.run``: tokens per request and forward pass, and the speedup, against
    k, for copy requests and open questions, one at a time and batched."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 3.8))
    left, right = fig.subplots(1, 2)
    styles = {("one at a time", "copy"): ("#2e7d32", "o", "-"), ("one at a time", "open"): ("#c62828", "o", "-"),
              ("batched", "copy"): ("#2e7d32", "s", "--"), ("batched", "open"): ("#c62828", "s", "--")}
    for mode, runs in result["modes"].items():
        for kind, by_k in runs.items():
            ks = sorted(by_k, key=int)
            color, marker, line = styles[(mode, kind)]
            label = f"{kind}, {mode}"
            left.plot([int(k) for k in ks], [by_k[k]["tokens_per_step"] for k in ks], marker=marker, linestyle=line,
                      color=color, label=label)
            right.plot([int(k) for k in ks], [by_k[k]["speedup"] for k in ks], marker=marker, linestyle=line,
                       color=color, label=label)
    left.set_ylabel("tokens per request per forward pass")
    right.set_ylabel("speedup in wall time (x)")
    right.axhline(1, color="#9e9e9e", linewidth=0.8)
    for ax in (left, right):
        ax.set_xlabel("tokens guessed per step (k; 0 = no speculation)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or f"{result['model']}: prompt-lookup speculation, same tokens out")
    return save(fig, path)
