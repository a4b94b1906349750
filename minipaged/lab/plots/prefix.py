"""Chapter 07's figures: what the prefix cache saves, against memory and turn by turn."""

from __future__ import annotations

from minipaged.lab.plots.style import save


def plot_prefix_sweep(rows: list[dict], ideal: float, path: str | None = None, title: str | None = None):
    """rows from ``simulator.prefix.sweep_capacity``: hit rate and compute saved against KV capacity."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 3.8))
    left, right = fig.subplots(1, 2)
    caps = [r["capacity"] for r in rows]
    left.plot(caps, [100 * r["hit_rate"] for r in rows], marker="o", color="#2e7d32", label="prefix cache (LRU)")
    left.axhline(100 * ideal, color="#616161", linestyle="--", label="unbounded cache")
    left.set_ylabel("prompt tokens served from the cache (%)")
    left.set_ylim(0, 100)
    right.plot(caps, [r["compute_ratio"] for r in rows], marker="o", color="#1565c0",
               label="tokens computed, cold / warm")
    right.plot(caps, [r["shared"]["steps"] / r["prefix_caching"]["steps"] for r in rows], marker="s",
               color="#ef6c00", label="forward passes, cold / warm")
    right.axhline(1, color="#9e9e9e", linewidth=0.8)
    right.set_ylabel("cold / warm")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(caps, [f"{c // 1024}k" if c >= 1024 else str(c) for c in caps])
        ax.set_xlabel("KV capacity (token slots)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(title or "Prefix caching: a bigger pool keeps more prefixes cached")
    return save(fig, path)


def plot_turns(turns: list[dict], path: str | None = None, title: str | None = None):
    """turns from ``bench.prefix``: prompt tokens computed and time to first token at each turn of a
    conversation, without and with the prefix cache."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.6, 3.8))
    left, right = fig.subplots(1, 2)
    x = [t["turn"] for t in turns]
    for key, label, color in (("cold", "no prefix cache", "#c62828"), ("warm", "prefix cache", "#2e7d32")):
        left.plot(x, [t[key]["computed"] for t in turns], marker="o", color=color, label=label)
        right.plot(x, [1000 * t[key]["ttft"] for t in turns], marker="o", color=color, label=label)
    left.plot(x, [t["prompt_tokens"] for t in turns], color="#9e9e9e", linestyle="--", label="prompt length")
    left.set_ylabel("prompt tokens computed")
    right.set_ylabel("time to first token (ms)")
    for ax in (left, right):
        ax.set_xlabel("turn of the conversation")
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title or "A conversation: each turn resends the whole history")
    return save(fig, path)
