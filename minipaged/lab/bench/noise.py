"""The noise probe every benchmark runs before and after it measures: is anything else using the cores?

On a small machine a second busy process is the largest error a benchmark can have. With two cores
and a competing process, OpenMP's threads wait for each other at every parallel region, and a
matmul that takes 0.7 ms alone can take 16. ``gemm_probe()`` times one of the model's own
projections on every torch thread and on one; alone, the threads scale almost perfectly, so a much
slower multi-thread time (or samples far apart) means they did not have the cores to themselves.
``describe_probe`` turns a before/after pair into the lines a benchmark prints, with a warning when
either failed.

Not handled: noise that starts and stops between the two probes (a benchmark's ratios, measured side
by side in one run, are what protects against that).
"""

from __future__ import annotations

import os
import time
from statistics import median


def gemm_probe(repeats: int = 20, samples: int = 5) -> dict:
    """Time a 512x576 @ 576x576 fp32 matmul (one SmolLM2-135M projection of a 512-token batch) on
    all torch threads and on one; all threads should be about ``threads`` times faster."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 576, generator=gen), torch.randn(576, 576, generator=gen)
    flops = 2 * 512 * 576 * 576

    def sample():
        t0 = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        return (time.perf_counter() - t0) / repeats

    threads = torch.get_num_threads()
    sample()  # warm-up
    multi = [sample() for _ in range(samples)]
    torch.set_num_threads(1)
    try:
        single = [sample() for _ in range(samples)]
    finally:
        torch.set_num_threads(threads)
    expected = min(single) / threads  # perfect scaling of one thread's best over every thread
    measured = median(multi)
    slowdown, spread = measured / expected, max(multi) / min(multi)
    # two threads on this GEMM reach about 1.7x one; under 1.25x (a slowdown over 1.6 at 2 threads), or
    # samples differing by half, means the threads did not have the cores to themselves
    reliable = (threads == 1 or slowdown <= 1 + 0.6 * (threads - 1)) and spread <= 1.5
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"threads": threads, "cpus": os.cpu_count(), "gflops": flops / measured / 1e9,
            "gflops_one_thread": flops / min(single) / 1e9, "ms": 1000 * measured,
            "expected_ms": 1000 * expected, "slowdown": slowdown, "spread": spread,
            "load_average_1m": load, "reliable": reliable}


def probe_pair(before: dict, after: dict) -> dict:
    return {"before": before, "after": after, "reliable": before["reliable"] and after["reliable"]}


def describe_probe(probe: dict) -> list[str]:
    """The report lines of a probe_pair: both probes, and a warning when either was disturbed."""
    lines = []
    for when in ("before", "after"):
        q = probe[when]
        load = "" if q["load_average_1m"] is None else f", load average {q['load_average_1m']:.2f}"
        lines.append(f"GEMM probe {when}: {q['gflops']:.1f} GFLOP/s on {q['threads']} threads, "
                     f"{q['gflops_one_thread']:.1f} on one ({q['slowdown']:.2f}x the perfect-scaling time, "
                     f"samples spread {q['spread']:.2f}x{load} on {q['cpus']} CPUs)")
    if not probe["reliable"]:
        lines.append(WARNING)
    return lines


WARNING = ("WARNING: the GEMM probe ran much slower than expected: another process competes for the cores, "
           "so these numbers are unreliable; rerun on a quiet machine")
