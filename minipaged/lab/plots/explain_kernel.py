"""Explanatory figures of chapter 10: the kernel's grid, its walk over the block table, the online softmax.

    trace = trace_kernel()               a small seeded decode input (2 sequences, 2 KV heads, GQA
                                         group 2, head_dim 8, blocks of 4), planned by the real
                                         ``plan_launch`` and run by the real v2 kernels in numba's
                                         CUDA simulator, with the partials kept
    plot_kernel_grid(trace, path=...)    the grid (sequence x KV head x partition), and how thread block
                                         (0, 0, p) walks sequence 0's block table a tile at a time
    plot_online_softmax(trace, path=...) one query row: its scores tile by tile, the running max m and
                                         running sum l after each tile, and v2's merge of the partitions

The tile-by-tile values come from ``online_softmax_steps``, the kernel's ``softmax_step`` written again
in numpy (float32) over the same tiles: the kernel keeps them in shared memory, where nothing outside
can read them. At the end of each partition they must equal the kernel's own ``part_max`` and
``part_sum``, and the merged output the PyTorch reference's; ``trace_kernel`` checks both.

Not handled: v1 and v3 (v1 is v2 with one partition; v3's walk is chapter 10's last section), query
rows of a prefill (the figure's input decodes one token per sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minipaged.lab.plots.style import save

KERNEL_INPUT = dict(context_lens=(29, 13), num_kv_heads=2, group=2, head_dim=8, block_size=4, num_blocks=24,
                    num_partitions=2, seed=0)


@dataclass
class KernelTrace:
    plan: object  # the LaunchPlan
    grid: tuple[int, int, int]
    tile_tokens: int
    block_size: int
    context_lens: list[int]
    block_tables: list[list[int]]  # per sequence: its physical blocks, in logical order
    scores: np.ndarray  # [ctx of seq 0] the row's scaled q.k (sequence 0, head 0)
    steps: list[dict]  # per tile of that row: partition, keys [start, end), m and l after the tile
    part_max: np.ndarray  # [P] the kernel's m_p for the row
    part_sum: np.ndarray  # [P] the kernel's l_p
    out: np.ndarray  # [head_dim] the merged output (kernel)
    reference: np.ndarray  # [head_dim] the PyTorch reference's
    plain_softmax_sum: float  # sum of exp(score - max) over the whole row, computed in one go
    plain_max: float


def online_softmax_steps(scores: np.ndarray, tile_tokens: int, partition_tokens: int) -> list[dict]:
    """The online softmax over ``scores`` (one row), tile by tile inside each partition, as the
    kernel's softmax_step does it: new max, rescale by alpha = exp(old max - new max), add the tile's
    exp(score - new max). Returns each tile's partition, key range, m and l after it, and alpha."""
    steps = []
    ctx = len(scores)
    for p, begin in enumerate(range(0, ctx, partition_tokens)):
        m, l = np.float32(-np.inf), np.float32(0.0)
        for start in range(begin, min(begin + partition_tokens, ctx), tile_tokens):
            tile = scores[start:min(start + tile_tokens, begin + partition_tokens, ctx)].astype(np.float32)
            m_new = max(m, tile.max())
            alpha = np.exp(m - m_new, dtype=np.float32)
            l = l * alpha + np.exp(tile - m_new, dtype=np.float32).sum(dtype=np.float32)
            m = m_new
            steps.append({"partition": p, "start": start, "end": start + len(tile), "m": float(m), "l": float(l),
                          "alpha": float(alpha)})
    return steps


def trace_kernel(context_lens=KERNEL_INPUT["context_lens"], num_kv_heads: int = KERNEL_INPUT["num_kv_heads"],
                 group: int = KERNEL_INPUT["group"], head_dim: int = KERNEL_INPUT["head_dim"],
                 block_size: int = KERNEL_INPUT["block_size"], num_blocks: int = KERNEL_INPUT["num_blocks"],
                 num_partitions: int = KERNEL_INPUT["num_partitions"], seed: int = KERNEL_INPUT["seed"]) -> KernelTrace:
    import torch

    from minipaged.attention.kernels.config import KernelConfig, plan_launch
    from minipaged.attention.numba_backend import _Launcher
    from minipaged.attention.reference import gather_kv, paged_attention_reference

    g = torch.Generator().manual_seed(seed)
    num_seqs, num_heads = len(context_lens), num_kv_heads * group
    q = torch.randn(num_seqs, num_heads, head_dim, generator=g)  # one decode query per sequence
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g)
    width = max(-(-c // block_size) for c in context_lens)
    order = torch.randperm(num_blocks, generator=g).tolist()  # blocks anywhere in the pool, in no order
    tables = [order[i * width:(i + 1) * width] for i in range(num_seqs)]
    block_tables = torch.tensor(tables, dtype=torch.int32)
    ctx = torch.tensor(context_lens, dtype=torch.int32)
    scale = head_dim ** -0.5

    cfg = KernelConfig.for_simulator(head_dim, block_size=block_size)
    plan = plan_launch(num_seqs, num_kv_heads, group, 1, max(context_lens), cfg, kernel="v2",
                       num_partitions=num_partitions, simulator=True)
    from minipaged.attention.kernels.v2_split import make_v2_kernels

    partition_kernel, merge_kernel = make_v2_kernels(cfg)
    P = plan.num_partitions
    part_out = torch.zeros(num_seqs, num_heads, P, head_dim)
    part_max = torch.zeros(num_seqs, num_heads, P)
    part_sum = torch.zeros(num_seqs, num_heads, P)
    out = torch.zeros(num_seqs, num_heads, head_dim)
    query_lens = torch.ones(num_seqs, dtype=torch.int32)
    query_start = torch.arange(num_seqs, dtype=torch.int32)
    grid = plan.grid(num_seqs, num_kv_heads)
    with _Launcher(q.device) as launcher:  # the launches of numba_backend.run_v2, partials kept
        launcher.launch(partition_kernel, grid, cfg.num_threads, part_out, part_max, part_sum, q, k_cache, v_cache,
                        block_tables, ctx, query_start, query_lens, np.float32(scale), np.int32(P),
                        np.int32(plan.partition_tokens))
        launcher.launch(merge_kernel, (num_seqs, num_heads), head_dim, out, part_out, part_max, part_sum)
    reference = paged_attention_reference(q, k_cache, v_cache, block_tables, ctx, scale=scale)

    # sequence 0, head 0 (KV head 0): its scores, the same numbers the kernel scores
    k0 = gather_kv(k_cache, block_tables[0], context_lens[0])[:, 0]  # [ctx, D]
    scores = ((q[0, 0] * scale) @ k0.T).numpy().astype(np.float32)
    steps = online_softmax_steps(scores, cfg.tile_tokens, plan.partition_tokens)
    return KernelTrace(plan, grid, cfg.tile_tokens, block_size, list(context_lens), tables, scores, steps,
                       part_max[0, 0].numpy(), part_sum[0, 0].numpy(), out[0, 0].numpy(), reference[0, 0].numpy(),
                       float(np.exp(scores - scores.max()).sum()), float(scores.max()))


PART_COLORS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a"]


def plot_kernel_grid(trace: KernelTrace, path: str | None = None, title: str | None = None):
    """Left: the grid's thread blocks and the keys each walks. Right: sequence 0's block table, logical
    blocks in tiles, each tile read by one step of its partition's thread block."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, Rectangle

    S, H, Z = trace.grid
    T, P, bs = trace.plan.partition_tokens, trace.plan.num_partitions, trace.block_size
    fig = Figure(figsize=(10, 4.4))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.5], "wspace": 0.2})
    # the grid
    for s in range(S):
        for h in range(H):
            for z in range(Z):
                x, y = z * 1.1 + h * (Z * 1.1 + 0.5), -s * 1.5
                keys = (z * T, min((z + 1) * T, trace.context_lens[s]))
                empty = keys[0] >= keys[1]
                ax.add_patch(Rectangle((x, y), 1, 1, facecolor="#eeeeee" if empty else PART_COLORS[z % 4],
                                       alpha=0.85, edgecolor="#212121"))
                label = "no keys" if empty else f"keys\n{keys[0]}-{keys[1] - 1}"
                ax.text(x + 0.5, y + 0.5, f"({s},{h},{z})\n{label}", ha="center", va="center", fontsize=8,
                        color="black" if empty else "white")
        ax.text(-0.15, -s * 1.5 + 0.5, f"seq {s}\n{trace.context_lens[s]} keys", ha="right", va="center",
                fontsize=8)
    for h in range(H):
        ax.text(h * (Z * 1.1 + 0.5) + Z * 0.55, 1.15, f"KV head {h}", ha="center", fontsize=8)
    ax.set_xlim(-1.3, H * (Z * 1.1 + 0.5))
    ax.set_ylim(-S * 1.5 + 0.3, 1.6)
    ax.axis("off")
    ax.set_title(f"grid (sequences, KV heads, partitions) = {trace.grid}\n"
                 f"plan_launch: {P} partitions of {T} keys", fontsize=9)
    # the walk over sequence 0's block table
    ctx = trace.context_lens[0]
    table = trace.block_tables[0]
    n_logical = -(-ctx // bs)
    for b in range(n_logical):
        x = b * 1.15
        start = b * bs
        part = start // T
        tile = start // trace.tile_tokens
        bx.add_patch(Rectangle((x, 0), 1, 1, facecolor=PART_COLORS[part % 4], alpha=0.35 + 0.3 * (tile % 2),
                               edgecolor="#212121"))
        bx.text(x + 0.5, 0.5, f"{table[b]}", ha="center", va="center", fontsize=9, fontweight="bold")
        bx.text(x + 0.5, 1.1, f"{b}", ha="center", va="bottom", fontsize=8, color="#616161")
        used = min(bs, ctx - start)
        bx.text(x + 0.5, -0.12, f"{used}/{bs}", ha="center", va="top", fontsize=7, color="#616161")
    bx.text(-0.1, 1.1, "logical", ha="right", va="bottom", fontsize=8, color="#616161")
    bx.text(-0.1, 0.5, "physical", ha="right", va="center", fontsize=8)
    per_tile = trace.tile_tokens // bs
    for i, step in enumerate(s for s in trace.steps):
        b0, b1 = step["start"] // bs, -(-step["end"] // bs)
        x0, x1 = b0 * 1.15, (b1 - 1) * 1.15 + 1
        y = -0.75 - 0.0 * i
        bx.add_patch(FancyArrowPatch((x0, y), (x1, y), arrowstyle="<->", mutation_scale=8,
                                     color=PART_COLORS[step["partition"] % 4]))
        bx.text((x0 + x1) / 2, y - 0.12, f"block (0,0,{step['partition']})\nstep {i - first_step(trace, step)}:\n"
                f"keys {step['start']}-{step['end'] - 1}", ha="center", va="top", fontsize=8)
    bx.set_xlim(-1.4, n_logical * 1.15)
    bx.set_ylim(-2.1, 1.6)
    bx.axis("off")
    bx.set_title(f"sequence 0's block table; each step stages one tile of\n{trace.tile_tokens} keys "
                 f"({per_tile} blocks of {bs}) in shared memory", fontsize=9)
    fig.suptitle(title or "The paged attention kernel (v2): who reads which keys", fontsize=11, y=1.06)
    return save(fig, path)


def first_step(trace: KernelTrace, step: dict) -> int:
    """Index in trace.steps of the first tile of step's partition."""
    return next(i for i, s in enumerate(trace.steps) if s["partition"] == step["partition"])


def plot_online_softmax(trace: KernelTrace, path: str | None = None, title: str | None = None):
    """Scores tile by tile with the running max m; the running sum l; the merge of the partitions."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.6))
    ax, lx, mx = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1.5, 1.2, 1.1], "wspace": 0.35})
    keys = np.arange(len(trace.scores))
    for step in trace.steps:
        c = PART_COLORS[step["partition"] % 4]
        sl = slice(step["start"], step["end"])
        ax.plot(keys[sl], trace.scores[sl], "o", color=c, ms=4)
        ax.hlines(step["m"], step["start"] - 0.4, step["end"] - 0.6, color=c, lw=2)
        ax.axvline(step["start"] - 0.5, color="#bdbdbd", lw=0.8, ls=":")
    ax.set_xlabel("key position (sequence 0)")
    ax.set_ylabel("score q.k / sqrt(d)")
    ax.set_title("scores, and the running max m after each tile\n(colour: partition)", fontsize=9)
    labels = [f"p{s['partition']}: {s['start']}-{s['end'] - 1}" for s in trace.steps]
    xs = np.arange(len(trace.steps))
    lx.bar(xs, [s["l"] for s in trace.steps], color=[PART_COLORS[s["partition"] % 4] for s in trace.steps])
    for x, s in zip(xs, trace.steps):
        lx.text(x, s["l"], f"l={s['l']:.2f}\nm={s['m']:.2f}\nα={s['alpha']:.2f}", ha="center", va="bottom",
                fontsize=8)
    lx.set_xticks(xs, labels, fontsize=8, rotation=20)
    lx.set_ylim(0, max(s["l"] for s in trace.steps) * 1.45)
    lx.set_ylabel("running sum l = sum exp(score - m)")
    lx.set_title("after each tile: l = l * alpha + tile's sum,\nalpha = exp(old m - new m) (0 on a "
                 "partition's first tile)", fontsize=9)
    # the merge
    M = float(np.max(trace.part_max))
    w = trace.part_sum * np.exp(trace.part_max - M)
    rows = [f"p{p}: m_p {trace.part_max[p]:.3f}  l_p {trace.part_sum[p]:.3f}  w_p {w[p]:.3f}" for p in range(len(w))]
    err = float(np.abs(trace.out - trace.reference).max())
    text = ("v2's merge (merge_partitions),\nfrom the kernel's partials:\n\n" + "\n".join(rows)
            + f"\n\nM = max m_p = {M:.3f}\nw_p = l_p exp(m_p - M)\nsum w_p = {w.sum():.3f}\n\n"
            + f"one softmax over all {len(trace.scores)} keys:\n  max {trace.plain_max:.3f}, "
            + f"sum exp(s - max) {trace.plain_softmax_sum:.3f}\n\n"
            + "out = sum w_p o_p / sum w_p\n"
            + f"max |out - reference| = {err:.1e}")
    mx.text(-0.05, 1.0, text, ha="left", va="top", fontsize=8.5, family="monospace", transform=mx.transAxes)
    mx.axis("off")
    fig.suptitle(title or "Online softmax, one query row (sequence 0, head 0): tile by tile, then partitions "
                          "merged", fontsize=11, y=1.06)
    return save(fig, path)
