"""Run one trace against several KV policies, or one policy at several block sizes.

Both helpers build fresh policies through ``minipaged.kv.make_policy`` and run ``simulate`` on the
same requests, so the only difference between two rows is the policy. The command line
(``python -m minipaged.lab.simulator``), the notebooks and the tests all go through here.
"""

from __future__ import annotations

from minipaged.kv import RESERVING_POLICIES, make_policy
from minipaged.lab.simulator.sim import SimulationResult, simulate
from minipaged.lab.simulator.workloads import Request

SWEEP_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def policy_variants(policies: list[str], reservations: list[str]) -> list[tuple[str, str]]:
    """(policy, reservation) pairs to run: every reservation rule for the reserving policies, one
    run for on_demand (it reserves nothing ahead)."""
    variants = []
    for name in policies:
        rules = reservations if name in RESERVING_POLICIES else ["max"]  # on_demand ignores the rule
        variants += [(name, rule) for rule in rules]
    return variants


def compare_policies(requests: list[Request], variants: list[tuple[str, str]], *, capacity: int,
                     block_size: int = 16, max_model_len: int = 2048, **simulate_options
                     ) -> list[SimulationResult]:
    return [simulate(make_policy(name, num_slots=capacity, block_size=block_size,
                                 max_model_len=max_model_len, reservation=rule), requests, **simulate_options)
            for name, rule in variants]


def sweep_block_size(requests: list[Request], variants: list[tuple[str, str]], *, capacity: int,
                     max_model_len: int = 2048, block_sizes=SWEEP_BLOCK_SIZES
                     ) -> dict[str, dict[int, SimulationResult]]:
    """{policy label: {block size: result}} for every block-based variant (the contiguous arena has
    no block size and is skipped)."""
    sweep: dict[str, dict[int, SimulationResult]] = {}
    for name, rule in variants:
        if name == "contiguous":
            continue
        for block_size in block_sizes:
            policy = make_policy(name, num_slots=capacity, block_size=block_size,
                                 max_model_len=max_model_len, reservation=rule)
            sweep.setdefault(policy.label, {})[block_size] = simulate(policy, requests)
    return sweep
