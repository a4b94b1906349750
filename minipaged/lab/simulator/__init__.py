"""The trace simulator: synthetic workloads run step by step against the engine's own KV policies.

    workloads.py   seeded ShareGPT-like and Alpaca-like traces (lengths, Poisson arrivals)
    sim.py         ``simulate(policy, requests)``: admission, decode, preemption, waste per step
    compare.py     several policies, or several block sizes, on one trace
    cli.py         ``python -m minipaged.lab.simulator`` / ``minipaged simulate``

No model and no torch: a thousand requests take well under a second per policy.
"""

from minipaged.lab.simulator.compare import SWEEP_BLOCK_SIZES, compare_policies, policy_variants, sweep_block_size
from minipaged.lab.simulator.sim import SimulationResult, StepRecord, Timeline, simulate
from minipaged.lab.simulator.workloads import WORKLOADS, Request, describe, make_workload

__all__ = [
    "Request", "WORKLOADS", "make_workload", "describe", "simulate", "SimulationResult", "StepRecord", "Timeline",
    "compare_policies", "policy_variants", "sweep_block_size", "SWEEP_BLOCK_SIZES",
]
