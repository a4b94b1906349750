"""Figures for the chapters, drawn from simulator results (matplotlib is imported only when drawing).

    plot_memory_map(timeline)        who holds which part of the pool, step by step
    plot_waste_breakdown(results)    where the pool went, per policy (tokens, reserved, fragmentation)
    plot_block_size_sweep(sweep)     utilization against block size

Each returns a matplotlib Figure (created without pyplot, so nothing global changes) and saves a PNG
when given ``path``.
"""

from minipaged.plots.memory_map import plot_memory_map
from minipaged.plots.sweep import plot_block_size_sweep
from minipaged.plots.waste import plot_waste_breakdown

__all__ = ["plot_memory_map", "plot_waste_breakdown", "plot_block_size_sweep"]
