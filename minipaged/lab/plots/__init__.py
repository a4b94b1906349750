"""Figures for the chapters, drawn from simulator results (matplotlib is imported only when drawing).

    plot_memory_map(timeline)        who holds which part of the pool, step by step
    plot_waste_breakdown(results)    where the pool went, per policy (tokens, reserved, fragmentation)
    plot_block_size_sweep(sweep)     utilization against block size
    plot_block_sharing(snapshots)    shared blocks, reference counts, copy-on-write (chapter 05)
    plot_memory_saved(rows)          memory saved by sharing, per mode and trace (chapter 05)
    plot_blocks_over_time(p, l)      blocks in use per step with and without sharing (chapter 05)
    plot_refcount_map(snapshots)     every block's reference count, step by step (chapter 05)
    plot_serving_timeline(t)         running batch and KV memory held over time, per system (chapter 06)
    plot_capacity_sweep(result)      requests/s per system against the KV capacity (chapter 06)
    plot_prefix_sweep(rows, ideal)   prefix-cache hit rate and compute saved against KV capacity (chapter 07)
    plot_turns(turns)                prompt tokens computed and TTFT per turn of a conversation (chapter 07)
    plot_step_tokens(rows, budget)   decode and prompt tokens per step, whole vs chunked (chapter 08)
    plot_budget_sweep(rows)          inter-token latency and TTFT against the chunk budget (chapter 08)
    plot_itl_cdf(systems)            measured inter-token gaps per system (chapter 08)
    plot_step_cost(points, fit)      forward-pass time against tokens in the step (chapter 08)
    plot_spec_speedup(result)        tokens per pass and speedup with speculation, per k (chapter 09)
    plot_kernel_roofline(results)    the kernels under the GPU's roofs and measured ceilings (chapter 10)

The explanatory figures of chapters 06-11 trace a small run of the real engine, then draw it
(``trace_*`` returns plain data the tests check, ``plot_*`` draws it; docs/figures_06_11.py runs them):

    explain_steps      the scheduler's steps (06), chunks under the budget (08), draft and rollback (09)
    explain_prefix     the hash chain of full blocks and the LRU list (07)
    explain_kernel     the kernel's grid, its walk over the block table, the online softmax (10)
    explain_serving    the hand-offs between the event loop and the engine thread (11)

Each returns a matplotlib Figure (created without pyplot, so nothing global changes) and saves a PNG
when given ``path``.
"""

from minipaged.lab.plots.chunked import plot_budget_sweep, plot_itl_cdf, plot_step_cost, plot_step_tokens
from minipaged.lab.plots.kernels import plot_kernel_roofline
from minipaged.lab.plots.memory_map import plot_memory_map
from minipaged.lab.plots.prefix import plot_prefix_sweep, plot_turns
from minipaged.lab.plots.serving import plot_capacity_sweep, plot_serving_timeline
from minipaged.lab.plots.sharing import (
    plot_block_sharing,
    plot_blocks_over_time,
    plot_memory_saved,
    plot_refcount_map,
)
from minipaged.lab.plots.spec import plot_spec_speedup
from minipaged.lab.plots.sweep import plot_block_size_sweep
from minipaged.lab.plots.waste import plot_waste_breakdown

__all__ = ["plot_memory_map", "plot_waste_breakdown", "plot_block_size_sweep", "plot_block_sharing",
           "plot_memory_saved", "plot_blocks_over_time", "plot_refcount_map", "plot_serving_timeline",
           "plot_capacity_sweep", "plot_prefix_sweep", "plot_turns", "plot_step_tokens", "plot_budget_sweep",
           "plot_itl_cdf", "plot_step_cost", "plot_spec_speedup", "plot_kernel_roofline"]
