"""Regenerate the figures of chapter 06 (continuous batching): the PNG files beside its README.

    .venv/bin/python docs/figures_06.py

    serving_timeline.png  comes from the benchmark itself:
                          ``python -m minipaged bench serving --plot-dir chapters/06_continuous-batching``
    steps_timeline.png    the model-free simulation of ``python -m minipaged simulate --serving
                          --capacity 16384`` (ShareGPT-like trace, 200 requests): running batch and KV
                          memory held per step, static vs Orca (oracle) vs continuous + paged.
    capacity_sweep.png    SmolLM2 on the benchmark's trace, static + contiguous vs continuous + paged
                          at KV capacities of 1024 ... 4096 token slots: the requests/s ratio. Each
                          point is one ``bench serving`` run without HF and without the pressure runs.

Prints the numbers the chapter quotes. Takes about eight minutes on two cores (the sweep).
"""

from __future__ import annotations

import os

from minipaged.bench import serving
from minipaged.plots import plot_serving_timeline
from minipaged.simulator.workloads import make_workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "chapters", "06_continuous-batching")
CAPACITIES = (1024, 1536, 2048, 3072, 4096)


def steps_timeline() -> None:
    """The runs of `python -m minipaged simulate --serving --capacity 16384` (the chapter's record),
    three of its five systems drawn step by step."""
    from minipaged.simulator.cli import serving_runs

    trace = make_workload("sharegpt", 200, max_model_len=2048, seed=0)
    runs = serving_runs(trace, capacity=16384, block_size=16, max_model_len=2048)
    shown = ("static + contiguous", "Orca (oracle): continuous + contiguous", "continuous + paged")
    plot_serving_timeline({k: {"time": list(range(1, runs[k].steps + 1)), "batch": runs[k].batch_sizes,
                               "kv_held": runs[k].kv_held} for k in shown}, 16384, x_label="step (forward pass)",
                          path=os.path.join(OUT, "steps_timeline.png"),
                          title="ShareGPT-like trace, 200 requests, 16384 slots (simulated, no model)")


def capacity_sweep() -> None:
    from matplotlib.figure import Figure

    ratios, batches = [], []
    for capacity in CAPACITIES:
        r = serving.run(kv_capacity=capacity, skip_hf=True, skip_pressure=True, orca=())
        static, continuous = r["systems"]
        ratios.append(continuous["requests_per_s"] / static["requests_per_s"])
        batches.append((static["mean_batch"], continuous["mean_batch"]))
        print(f"capacity {capacity:5}: static {static['requests_per_s']:.2f} req/s (batch {static['mean_batch']:.1f}), "
              f"continuous {continuous['requests_per_s']:.2f} req/s (batch {continuous['mean_batch']:.1f}, "
              f"{continuous['preemptions']} preemptions): {ratios[-1]:.2f}x, "
              f"identical outputs {r['identical_outputs']}")
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.add_subplot()
    ax.plot(CAPACITIES, ratios, marker="o", color="#2e7d32")
    for x, y, (bs, bc) in zip(CAPACITIES, ratios, batches):
        ax.annotate(f"batch {bs:.1f} vs {bc:.1f}", (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.axhline(1, color="#999999", lw=0.8)
    ax.set_xlabel("KV capacity (token slots; slabs of 256 for the static system)")
    ax.set_ylabel("requests/s, continuous + paged / static + contiguous")
    ax.set_ylim(0, max(ratios) * 1.25)
    ax.grid(alpha=0.3)
    ax.set_title("SmolLM2, 64 ShareGPT-like requests x0.1: the less memory, the more paging buys")
    fig.savefig(os.path.join(OUT, "capacity_sweep.png"), dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    steps_timeline()
    capacity_sweep()
