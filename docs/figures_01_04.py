"""Regenerate the figures of chapters 01-04: the PNG files beside each chapter's README.

    .venv/bin/python docs/figures_01_04.py              all four chapters
    .venv/bin/python docs/figures_01_04.py --chapter 3  one chapter

Everything is drawn by minipaged's own simulator and plots; this script only chooses the runs,
the titles and the file names. Three scenarios:

    tiny    seven hand-written requests in a 64-slot pool (blocks of 4, max_model_len 32), one
            snapshot per step, each request labelled r0..r6. The notebooks step through the same
            requests by hand.
    medium  the ShareGPT-like trace of the simulate command cut to 100 requests, in 8192 slots:
            readable memory maps. Same runs as
            ``python -m minipaged simulate --capacity 8192 --num-requests 100 --plot-dir DIR``.
    full    the simulate command's defaults (1000 requests, 32768 slots): the waste bars and the
            block-size sweep, with the numbers of ``python -m minipaged simulate``.

Takes under a minute on two cores.
"""

from __future__ import annotations

import argparse
import os
import time

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.ticker import MaxNLocator

from minipaged.kv import make_policy
from minipaged.lab.plots import plot_block_size_sweep, plot_memory_map, plot_waste_breakdown
from minipaged.lab.plots.memory_map import memory_map_image
from minipaged.lab.simulator import (
    Request,
    Timeline,
    compare_policies,
    make_workload,
    policy_variants,
    simulate,
    sweep_block_size,
)
from minipaged.lab.simulator.cli import DEFAULTS
from minipaged.lab.simulator.sim import TOKEN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAPTERS = {
    1: "chapters/01_contiguous-cache",
    2: "chapters/02_fixed-blocks",
    3: "chapters/03_block-table",
    4: "chapters/04_on-demand-allocation",
}

# The tiny scenario: (request id, arrival step, prompt tokens, output tokens). max_tokens = output.
TINY_REQUESTS = [(0, 0, 6, 6), (1, 0, 4, 3), (2, 0, 10, 12), (3, 0, 3, 4), (4, 1, 9, 6), (5, 2, 5, 10),
                 (6, 3, 7, 8)]
TINY = dict(capacity=64, block_size=4, max_model_len=32)
MEDIUM = dict(num_requests=100, capacity=8192)


def tiny_trace() -> list[Request]:
    return [Request(i, arrival, prompt, output, max_tokens=output) for i, arrival, prompt, output in TINY_REQUESTS]


def default_trace(num_requests: int = DEFAULTS["num_requests"]) -> list[Request]:
    return make_workload(DEFAULTS["workload"], num_requests, arrival_rate=DEFAULTS["arrival_rate"],
                         max_model_len=DEFAULTS["max_model_len"], seed=DEFAULTS["seed"])


def path_for(chapter: int, name: str) -> str:
    return os.path.join(ROOT, CHAPTERS[chapter], name)


def save(fig, path: str) -> None:
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print("saved", os.path.relpath(path, ROOT))


# ---- memory maps ----------------------------------------------------------------------------------

def label_requests(fig, timeline) -> None:
    """Write r<id> on every run of cells a request holds, at the middle of its lifetime."""
    ax = fig.axes[0]
    seen = sorted({o for row in timeline.owner for o in row if o >= 0})
    for rid in seen:
        snaps = [i for i, row in enumerate(timeline.owner) if rid in row]
        i = snaps[len(snaps) // 2]
        cells = [c for c, o in enumerate(timeline.owner[i]) if o == rid]
        runs, start = [], cells[0]
        for a, b in zip(cells, cells[1:] + [None]):
            if b != a + 1:
                runs.append((start, a))
                start = b
        for first, last in runs:
            y = (first + last + 1) / 2 * timeline.cell_slots
            ax.text(timeline.steps[i], y, f"r{rid}", ha="center", va="center", fontsize=9, fontweight="bold",
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.8))


def tiny_map(chapter: int, policy: str, reservation: str, title: str) -> None:
    p = make_policy(policy, num_slots=TINY["capacity"], block_size=TINY["block_size"],
                    max_model_len=TINY["max_model_len"], reservation=reservation)
    result = simulate(p, tiny_trace(), record_history=True, timeline_steps=100)
    blocked = [r.step for r in result.history if r.usage.external]
    print(f"tiny trace, {result.policy}: {result.steps} steps, at most {result.max_concurrent} running, "
          f"head refused despite enough free memory at steps {blocked or 'none'}, "
          f"preemptions {result.preemptions}")
    fig = plot_memory_map(result.timeline, title=title)
    fig.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    label_requests(fig, result.timeline)
    name = result.policy.replace("(", "_").replace(")", "")
    save(fig, path_for(chapter, f"tiny_map_{name}.png"))


def medium_map(chapter: int, results, label: str) -> None:
    result = next(r for r in results if r.policy == label)
    title = f"{label}: 100 ShareGPT-like requests in {MEDIUM['capacity']} slots (util. {100 * result.utilization:.1f}%)"
    fig = plot_memory_map(result.timeline, title=title)
    name = label.replace("(", "_").replace(")", "")
    save(fig, path_for(chapter, f"memory_map_{name}.png"))


def medium_results():
    variants = policy_variants(["contiguous", "fixed_blocks", "block_table", "on_demand"], ["max", "pow2", "oracle"])
    # the same timeline settings as ``simulate --plot-dir``: 200 snapshots, one every 10 steps
    return compare_policies(default_trace(MEDIUM["num_requests"]), variants, capacity=MEDIUM["capacity"],
                            block_size=DEFAULTS["block_size"], max_model_len=DEFAULTS["max_model_len"],
                            timeline_steps=200, timeline_every=10)


# ---- waste bars and sweep -------------------------------------------------------------------------

def full_results():
    variants = policy_variants(["contiguous", "fixed_blocks", "block_table", "on_demand"], ["max", "pow2", "oracle"])
    return compare_policies(default_trace(), variants, capacity=DEFAULTS["capacity"],
                            block_size=DEFAULTS["block_size"], max_model_len=DEFAULTS["max_model_len"])


def waste_bars(chapter: int, results, labels: list[str], name: str, title: str) -> None:
    chosen = [next(r for r in results if r.policy == label) for label in labels]
    save(plot_waste_breakdown(chosen, title=title), path_for(chapter, name))


# ---- chapter 03: a block table drawn from a real policy state --------------------------------------

def owner_hues(count: int):
    """The memory maps' hue for request ids 0..count-1, asked of the plotting code itself."""
    timeline = Timeline("hues", count, 1, 1, steps=[0], owner=[list(range(count))], state=[[TOKEN] * count])
    return [tuple(rgb) for rgb in memory_map_image(timeline)[:, 0]]


def tiny_block_table_state():
    """The tiny scenario by hand on a block_table(pow2) policy, up to r4's admission (step 4)."""
    policy = make_policy("block_table", num_slots=TINY["capacity"], block_size=TINY["block_size"],
                         max_model_len=TINY["max_model_len"], reservation="pow2")
    for rid, _, prompt, output in TINY_REQUESTS[:4]:
        policy.allocate(rid, prompt, output, prompt + output)
        policy.append_slots(rid, prompt)
    for rid in (1, 3):  # the two short ones finish first
        policy.append_slots(rid, TINY_REQUESTS[rid][3])
        policy.free(rid)
    for rid in (0, 2):
        policy.append_slots(rid, 4)
    _, _, prompt, output = TINY_REQUESTS[4]
    policy.allocate(4, prompt, output, prompt + output)
    policy.append_slots(4, prompt)
    policy.check_invariants()
    return policy


def block_table_diagram(chapter: int) -> None:
    policy = tiny_block_table_state()
    nb = policy.num_blocks
    hues = owner_hues(7)
    pale = {sid: tuple(0.4 * c + 0.6 for c in hue) for sid, hue in enumerate(hues)}
    rows = sorted(policy.seq_ids())
    width = sum(len(policy.allocated_blocks(sid)) for sid in rows) + len(rows) - 1
    fig = Figure(figsize=(11, 4.4))
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, width + 0.5)
    ax.set_ylim(-1.3, 4.6)
    ax.axis("off")

    # the tables, side by side on top
    table_y, pool_y, pool_x = 3.0, 0.0, (width - nb) / 2
    holds_tokens, owner = set(), {}
    x = 0.0
    for sid in rows:
        blocks = policy.allocated_blocks(sid)
        used = len(policy.block_table(sid))
        ax.text(x + len(blocks) / 2, table_y + 1.05, f"r{sid}'s block table ({policy.num_tokens(sid)} tokens)",
                ha="center", va="center", fontsize=9)
        for logical, physical in enumerate(blocks):
            filled = logical < used
            owner[physical] = sid
            if filled:
                holds_tokens.add(physical)
            ax.add_patch(Rectangle((x, table_y), 0.92, 0.75, facecolor=hues[sid] if filled else "white",
                                   edgecolor=hues[sid], linewidth=1.5, zorder=3))
            ax.text(x + 0.46, table_y + 0.375, str(physical), ha="center", va="center", fontsize=9, zorder=4,
                    color="white" if filled else "black", fontweight="bold")
            ax.text(x + 0.46, table_y - 0.15, f"L{logical}", ha="center", va="center", fontsize=7, color="#555555")
            ax.add_patch(FancyArrowPatch((x + 0.46, table_y - 0.3), (pool_x + physical + 0.46, pool_y + 0.8),
                                         arrowstyle="-|>", mutation_scale=8, color=hues[sid], alpha=0.7,
                                         linewidth=1, zorder=1))
            x += 1.0
        x += 1.0

    # the physical pool below
    for b in range(nb):
        sid = owner.get(b)
        color = "white" if sid is None else hues[sid] if b in holds_tokens else pale[sid]
        ax.add_patch(Rectangle((pool_x + b, pool_y), 0.92, 0.75, facecolor=color, edgecolor="#555555", zorder=3))
        ax.text(pool_x + b + 0.46, pool_y - 0.2, str(b), ha="center", va="center", fontsize=8)
        if sid is not None:
            ax.text(pool_x + b + 0.46, pool_y + 0.375, f"r{sid}", ha="center", va="center", fontsize=8, zorder=4,
                    color="white" if b in holds_tokens else "black", fontweight="bold")
    ax.text(pool_x + nb / 2, pool_y - 0.55, "physical pool: 16 blocks of 4 slots (pale: reserved, no token yet)",
            ha="center", va="center", fontsize=9)
    ax.text(width / 2, -1.1, "entry Li of a table holds the physical block of logical block i (tokens 4i..4i+3); "
            "filled entries cover tokens, hollow ones are reserved ahead", ha="center", va="center", fontsize=8.5,
            style="italic")
    ax.set_title("block tables after r4's admission (tiny trace, block_table(pow2), step 4): r4's four blocks are "
                 "4, 5, 14, 15, freed by r1 and r3", fontsize=10)
    save(fig, path_for(chapter, "block_table_diagram.png"))


# ---- per chapter ------------------------------------------------------------------------------------

def chapter_1(full, medium) -> None:
    tiny_map(1, "contiguous", "max", "tiny trace, contiguous(max): every slab is max_model_len = 32 slots")
    tiny_map(1, "contiguous", "pow2", "tiny trace, contiguous(pow2): at steps 4-11 the queue head (r4, then r5) "
                                      "waits though 16 slots are free")
    medium_map(1, medium, "contiguous(max)")
    medium_map(1, medium, "contiguous(oracle)")
    waste_bars(1, full, ["contiguous(max)", "contiguous(pow2)", "contiguous(oracle)"], "waste_contiguous.png",
               "contiguous arena, 1000 ShareGPT-like requests (label: utilization)")


def chapter_2(full, medium) -> None:
    tiny_map(2, "fixed_blocks", "pow2", "tiny trace, fixed_blocks(pow2), blocks of 4: the same waits at steps "
                                        "4-11 though 4 blocks are free")
    medium_map(2, medium, "fixed_blocks(oracle)")
    waste_bars(2, full, [f"{p}({r})" for r in ("max", "pow2", "oracle") for p in ("contiguous", "fixed_blocks")],
               "waste_fixed_blocks.png", "slots vs blocks of 16, same reservation rules (label: utilization)")


def chapter_3(full, medium) -> None:
    tiny_map(3, "block_table", "pow2", "tiny trace, block_table(pow2): r4 is admitted at step 4 into "
                                       "scattered blocks")
    block_table_diagram(3)
    medium_map(3, medium, "block_table(oracle)")
    waste_bars(3, full, [f"{p}({r})" for r in ("pow2", "oracle") for p in ("fixed_blocks", "block_table")],
               "waste_block_table.png", "contiguous runs vs block tables (label: utilization)")


def chapter_4(full, medium) -> None:
    tiny_map(4, "on_demand", "max", "tiny trace, on_demand: blocks taken as tokens arrive")
    medium_map(4, medium, "on_demand")
    waste_bars(4, full, [r.policy for r in full], "waste_all_policies.png",
               "KV memory by policy, 1000 ShareGPT-like requests (label: utilization)")
    variants = [("block_table", "oracle"), ("on_demand", "max")]
    sweep = sweep_block_size(default_trace(), variants, capacity=DEFAULTS["capacity"],
                             max_model_len=DEFAULTS["max_model_len"])
    fig = plot_block_size_sweep(sweep, title="utilization by block size (1000 ShareGPT-like requests)")
    ax = fig.axes[0]
    ax.axhline(96.3, color="#555555", linestyle="--", linewidth=1, label="96.3%: vLLM, as the paper measured it")
    ax.axvline(16, color="#999999", linestyle=":", linewidth=1)
    ax.legend(fontsize=8, loc="lower left")
    save(fig, path_for(4, "block_size_sweep.png"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the PNG figures of chapters 01-04.")
    parser.add_argument("--chapter", type=int, nargs="+", choices=sorted(CHAPTERS), default=sorted(CHAPTERS))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    full, medium = full_results(), medium_results()
    for chapter in args.chapter:
        os.makedirs(os.path.join(ROOT, CHAPTERS[chapter]), exist_ok=True)
        {1: chapter_1, 2: chapter_2, 3: chapter_3, 4: chapter_4}[chapter](full, medium)
    print(f"done in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
