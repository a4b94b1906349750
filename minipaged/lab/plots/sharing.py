"""Figures for chapter 05: shared blocks with their reference counts, copy-on-write, memory saved.

    plot_block_sharing(snapshots, titles)    the pool and the block tables, one panel per moment
                                             (``SharedPolicy.snapshot()``): each physical block with its
                                             reference count and how full it is, each table's entries
                                             pointing at them, pending copy-on-write copies as arrows
    plot_memory_saved(rows)                  saved fraction per (mode, n) and trace, from
                                             ``python -m minipaged.lab.simulator --sharing --json``, with
                                             the vLLM paper's quoted range for its trace over each bar
    plot_blocks_over_time(physical, logical) blocks in use per step with sharing and without
    plot_refcount_map(snapshots)             a memory map over time: each block's reference count at
                                             each step (white free, green 1, purple shades 2 and up)

Each returns a matplotlib Figure (no pyplot) and saves a PNG when given ``path``.
"""

from __future__ import annotations

from minipaged.lab.plots.style import save

SHARED_COLOR = "#6a1b9a"  # purple: a block several tables hold
PRIVATE_COLOR = "#2e7d32"  # green: a block one table holds
COPY_COLOR = "#c62828"  # red: a copy on write
SEQ_COLORS = ["#1f77b4", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#9467bd"]


def _draw_snapshot(ax, snap: dict, title: str, blocks_shown: list[int]) -> None:
    from matplotlib.patches import FancyArrowPatch, Rectangle

    bs, refs, fill = snap["block_size"], snap["refs"], snap["fill"]
    x_of = {b: i * 1.3 for i, b in enumerate(blocks_shown)}
    holders: dict[int, list[str]] = {}
    for seq_id, table in snap["tables"].items():
        for block in table:
            holders.setdefault(block, []).append(str(seq_id))
    everyone = len(snap["tables"])
    pool_y = 0.0
    for b in blocks_shown:  # the pool: one square per physical block, filled as far as it holds tokens
        x = x_of[b]
        count = refs.get(b, 0)
        color = SHARED_COLOR if count > 1 else PRIVATE_COLOR
        ax.add_patch(Rectangle((x, pool_y), 1, 1, facecolor="white", edgecolor="#555555", lw=1))
        if count:
            ax.add_patch(Rectangle((x, pool_y), 1, fill.get(b, 0) / bs, facecolor=color, alpha=0.85, lw=0))
            ax.text(x + 0.5, pool_y + 1.1, f"ref {count}", ha="center", va="bottom", fontsize=8, color=color,
                    fontweight="bold" if count > 1 else "normal")
            names = holders.get(b, [])
            label = "all" if everyone > 2 and len(names) == everyone else ",".join(names) if len(names) <= 2 \
                else f"{len(names)} tables"
            ax.text(x + 0.5, pool_y - 0.42, label, ha="center", va="top", fontsize=7, color="#333333")
        else:
            ax.text(x + 0.5, pool_y + 1.1, "free", ha="center", va="bottom", fontsize=8, color="#999999")
        ax.text(x + 0.5, pool_y - 0.08, f"#{b}", ha="center", va="top", fontsize=7, color="#555555")
    ax.text(-0.2, pool_y + 0.5, "pool", ha="right", va="center", fontsize=9)

    for row, (seq_id, table) in enumerate(snap["tables"].items()):  # each sequence's block table
        y = -1.9 - 0.95 * row
        ax.text(-0.2, y + 0.3, f"{seq_id}: {snap['tokens'][seq_id]} tok", ha="right", va="center", fontsize=8)
        for logical, block in enumerate(table):
            x = logical * 1.3
            shared = refs.get(block, 0) > 1
            ax.add_patch(Rectangle((x, y), 1, 0.6, facecolor=SHARED_COLOR if shared else PRIVATE_COLOR,
                                   alpha=0.25, edgecolor="#555555", lw=0.8))
            ax.text(x + 0.5, y + 0.3, f"#{block}", ha="center", va="center", fontsize=8)
    drawn = [(src, dst) for src, dst in snap["copies"] if src in x_of and dst in x_of]
    for src, dst in drawn:  # copies on write the engine is about to make
        ax.add_patch(FancyArrowPatch((x_of[src] + 0.5, pool_y + 1.5), (x_of[dst] + 0.5, pool_y + 1.5),
                                     connectionstyle="arc3,rad=-0.4", arrowstyle="-|>", mutation_scale=10,
                                     color=COPY_COLOR, lw=1.6))
    if drawn:  # one label for all the arrows
        first = min(min(x_of[s], x_of[d]) for s, d in drawn)
        last = max(max(x_of[s], x_of[d]) for s, d in drawn)
        ax.text((first + last) / 2 + 0.5, pool_y + 2.05, "copy K,V" if len(drawn) == 1 else f"copy K,V ({len(drawn)})",
                ha="center", fontsize=8, color=COPY_COLOR)
    ax.set_title(title, fontsize=10)


def plot_block_sharing(snapshots: list[dict], titles: list[str] | None = None, path: str | None = None,
                       max_blocks: int | None = None):
    """One panel per snapshot (``SharedPolicy.snapshot()``), side by side. Blocks shown: every block
    any snapshot holds, plus free ones up to max_blocks. Under each block: the tables holding it;
    below the pool, each table's entries (tinted purple where the block is shared)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if not snapshots:
        raise ValueError("snapshots is empty: give at least one SharedPolicy.snapshot()")
    titles = titles or [f"moment {i}" for i in range(len(snapshots))]
    held = sorted({b for s in snapshots for b in s["refs"]} | {b for s in snapshots for c in s["copies"] for b in c})
    limit = max_blocks or (max(held, default=0) + 1 if max(held, default=0) < 16 else 0)  # free ones too, if few
    blocks_shown = sorted(set(held) | set(range(min(limit, snapshots[0]["num_blocks"]))))
    rows = max(len(s["tables"]) for s in snapshots)
    width = max(len(blocks_shown), max((len(t) for s in snapshots for t in s["tables"].values()), default=1))
    panel_w, panel_h = 1.3 * width + 2.2, 2.9 + 0.95 * rows
    fig = Figure(figsize=(0.62 * panel_w * len(snapshots), 0.62 * panel_h + 0.5))
    for i, (snap, title) in enumerate(zip(snapshots, titles)):
        ax = fig.add_subplot(1, len(snapshots), i + 1)
        _draw_snapshot(ax, snap, title, blocks_shown)
        ax.set_xlim(-2.2, 1.3 * width)
        ax.set_ylim(-1.9 - 0.95 * (rows - 1) - 0.2, 2.5)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.legend(handles=[Patch(color=SHARED_COLOR, label="shared block (ref > 1); height: tokens in it"),
                        Patch(color=PRIVATE_COLOR, label="private block (ref 1)"),
                        Patch(color=COPY_COLOR, label="copy on write (before the write)")],
               loc="lower center", ncol=3, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    return save(fig, path)


def plot_memory_saved(rows: list[dict], path: str | None = None, title: str | None = None, paper=None):
    """rows: dicts with workload, mode ("parallel"/"beam"), n and saved (0..1), e.g. the "sharing"
    list of ``--sharing --json``. paper: {workload: {mode: (low, high)}}, e.g. the vLLM paper's ranges
    (simulator.sharing.PAPER_SAVED): each bar gets its own trace's range drawn over it as a hatched box,
    so a bar is only ever compared with the paper's figure for the same trace. None draws none."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    paper = paper or {}
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    groups = list(dict.fromkeys((r["mode"], r["n"]) for r in rows))
    fig = Figure(figsize=(max(7.0, 0.9 * len(groups) + 2.5), 4.6))
    ax = fig.add_subplot()
    bar = 0.8 / max(len(workloads), 1)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
    for k, workload in enumerate(workloads):
        values = {(r["mode"], r["n"]): r["saved"] for r in rows if r["workload"] == workload}
        xs = [i - 0.4 + bar * (k + 0.5) for i in range(len(groups))]
        heights = [100 * values.get(g, 0.0) for g in groups]
        ax.bar(xs, heights, width=bar, color=colors[k % len(colors)], label=f"{workload}-like trace (simulated)")
        for x, h, (mode, _) in zip(xs, heights, groups):
            ranges = paper.get(workload, {})
            if mode in ranges:  # the paper's range for this trace and mode, over this bar
                low, high = (100 * v for v in ranges[mode])
                ax.bar(x, high - low, bottom=low, width=bar * 0.9, fill=False, hatch="///",
                       edgecolor="#555555", lw=0.6)
            ax.text(x, h + 0.8, f"{h:.1f}", ha="center", va="bottom", fontsize=7)
    names = {"parallel": "n", "beam": "width"}
    ax.set_xticks(range(len(groups)), [f"{'sampling' if m == 'parallel' else 'beam'}\n{names[m]}={n}"
                                       for m, n in groups])
    ax.set_ylabel("KV memory saved by sharing (%)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    handles, _ = ax.get_legend_handles_labels()
    if paper:
        handles.append(Patch(fill=False, hatch="///", edgecolor="#555555",
                             label="vLLM paper, same trace, OPT-13B (quoted range, n or width 2-6)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.set_title(title or "memory saved by copy-on-write sharing")
    return save(fig, path)


def plot_blocks_over_time(physical: list[int], logical: list[int], path: str | None = None,
                          title: str | None = None, block_bytes: int | None = None):
    """Blocks in use per step with sharing (physical) and without (logical: the sum of table
    lengths). With block_bytes, the y axis is in MiB."""
    from matplotlib.figure import Figure

    if not physical or len(physical) != len(logical):
        raise ValueError("physical and logical must be non-empty and of the same length")
    scale = block_bytes / 2**20 if block_bytes else 1.0
    steps = range(len(physical))
    fig = Figure(figsize=(7.0, 3.8))
    ax = fig.add_subplot()
    ax.plot(steps, [scale * b for b in logical], color="#ff7f0e", label="without sharing (sum of block tables)")
    ax.plot(steps, [scale * b for b in physical], color=SHARED_COLOR, label="with sharing (distinct blocks)")
    ax.fill_between(steps, [scale * b for b in physical], [scale * b for b in logical], color="#ff7f0e", alpha=0.15)
    saved = 1 - sum(physical) / sum(logical) if sum(logical) else 0.0
    ax.set_xlabel("step (forward pass)")
    ax.set_ylabel("KV memory (MiB)" if block_bytes else "KV blocks in use")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title or f"KV memory per step: {100 * saved:.1f}% saved over the run")
    return save(fig, path)


def plot_refcount_map(snapshots: list[dict], path: str | None = None, title: str | None = None,
                      steps: list[int] | None = None):
    """snapshots: one ``SharedPolicy.snapshot()`` per step. x: step, y: physical block, color: its
    reference count (how many block tables hold it)."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if not snapshots:
        raise ValueError("snapshots is empty: give one SharedPolicy.snapshot() per step")
    num_blocks = snapshots[0]["num_blocks"]
    counts = np.zeros((num_blocks, len(snapshots)), dtype=np.int64)  # [blocks, steps]
    for i, snap in enumerate(snapshots):
        for block, count in snap["refs"].items():
            counts[block, i] = count
    top = max(int(counts.max()), 2)
    purples = [(0.80 - 0.55 * k / max(top - 2, 1), 0.65 - 0.55 * k / max(top - 2, 1), 0.90 - 0.35 * k / max(top - 2, 1))
               for k in range(top - 1)]  # lighter for 2, darker for more holders
    cmap = ListedColormap([(1, 1, 1), PRIVATE_COLOR, *purples])
    used = np.flatnonzero(counts.any(axis=1))
    shown = counts[: used.max() + 1] if used.size else counts
    x = steps if steps is not None else list(range(len(snapshots)))
    fig = Figure(figsize=(8.0, 4.4))
    ax = fig.add_subplot()
    ax.imshow(shown, aspect="auto", origin="lower", interpolation="nearest", cmap=cmap, vmin=-0.5, vmax=top + 0.5,
              extent=(x[0] - 0.5, x[-1] + 0.5, -0.5, shown.shape[0] - 0.5))
    ax.set_xlabel("step (forward pass)")
    ax.set_ylabel("physical block")
    ax.set_title(title or "reference count of every block, step by step")
    legend = [Patch(facecolor="white", edgecolor="#999999", label="free"), Patch(color=PRIVATE_COLOR, label="ref 1")]
    legend += [Patch(color=c, label=f"ref {k + 2}") for k, c in enumerate(purples)]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return save(fig, path)
