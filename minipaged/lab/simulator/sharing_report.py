"""``python -m minipaged.lab.simulator --sharing``: the memory that block sharing saves, as a table.

    python -m minipaged.lab.simulator --sharing                      both traces, n and width 2, 4, 6
    python -m minipaged.lab.simulator --sharing --workload alpaca --json
    python -m minipaged.lab.simulator --sharing --plot-dir DIR       also draws memory_saved.png

Each row is one ``simulate_sharing`` run (minipaged/lab/simulator/sharing.py) on a fresh "shared"
policy: parallel sampling with n samples per request, or beam search of that width. The vLLM
paper's Alpaca figures are printed beside them for comparison, labelled as quoted.

Why 300 requests by default: a sharing run holds several sequences per request, and the saved
fraction moves by well under a point from 300 to 1000 requests while the run gets 3-4x slower.
"""

from __future__ import annotations

import os

from minipaged.lab import capture
from minipaged.lab.simulator.sharing import PAPER_SAVED, simulate_sharing
from minipaged.lab.simulator.workloads import WORKLOADS, describe, make_workload

DEFAULT_REQUESTS = 300
DEFAULT_SIZES = (2, 4, 6)
MODE_LABELS = {"parallel": "parallel sampling n", "beam": "beam search width"}


def run_sharing_table(workloads, samples, widths, *, num_requests: int, capacity: int, block_size: int,
                      max_model_len: int, arrival_rate: float, seed: int) -> list[dict]:
    rows = []
    for workload in workloads:
        requests = make_workload(workload, num_requests, arrival_rate=arrival_rate, max_model_len=max_model_len,
                                 seed=seed)
        for mode, sizes in (("parallel", samples), ("beam", widths)):
            for n in sizes:
                result = simulate_sharing(mode, requests, n, capacity=capacity, block_size=block_size,
                                          max_model_len=max_model_len, seed=seed)
                rows.append({"workload": workload, **result.summary()})
    return rows


def format_sharing_table(rows: list[dict]) -> str:
    header = (f"{'workload':<10}{'sharing':<24}{'saved':>7}{'blocks shared':>15}{'unshared':>10}"
              f"{'forks':>8}{'copies':>9}{'preempt':>9}")
    lines = [header, "-" * len(header)]
    for r in rows:
        label = f"{MODE_LABELS[r['mode']]} = {r['n']}"
        lines.append(f"{r['workload']:<10}{label:<24}{100 * r['saved']:>6.1f}%{r['mean_physical_blocks']:>15.1f}"
                     f"{r['mean_logical_blocks']:>10.1f}{r['forks']:>8}{r['cow_copies']:>9}{r['preemptions']:>9}")
    return "\n".join(lines)


def paper_note() -> str:
    def span(low_high):
        return f"{100 * low_high[0]:.1f}-{100 * low_high[1]:.1f}%"

    parts = [f"{trace}: {span(ranges['parallel'])} by parallel sampling, {span(ranges['beam'])} by beam search"
             for trace, ranges in PAPER_SAVED.items()]
    return ("quoted, not measured here: the vLLM paper (SOSP'23, sec. 6.3; OPT-13B) reports the memory saved over "
            "n / width 2..6 on each trace:\n  " + "\n  ".join(parts))


LEGEND = """\
saved     1 - (blocks in use with sharing) / (blocks the same sequences hold without it), summed over steps
blocks    mean blocks in use per step: shared = with reference counts, unshared = sum of table lengths
forks     sequences started by fork (no copy); copies: blocks copied on write; preempt: requests restarted
beam search runs on synthetic next-token log-probabilities (see minipaged/lab/simulator/sharing.py)"""


def run_sharing(args) -> int:
    workloads = [args.workload] if args.workload else sorted(WORKLOADS)
    num_requests = args.num_requests or DEFAULT_REQUESTS
    options = dict(num_requests=num_requests, capacity=args.capacity, block_size=args.block_size,
                   max_model_len=args.max_model_len, arrival_rate=args.arrival_rate, seed=args.seed)
    try:
        rows = run_sharing_table(workloads, args.samples, args.beam_widths, **options)
    except ValueError as error:
        raise SystemExit(f"simulate --sharing: {error}") from None
    traces = {w: describe(make_workload(w, num_requests, arrival_rate=args.arrival_rate,
                                        max_model_len=args.max_model_len, seed=args.seed)) for w in workloads}
    capture.emit({"config": {**options, "workloads": workloads}, "workload": traces, "sharing": rows,
                  "paper_saved": PAPER_SAVED}, args.json)
    if not args.json:
        print(f"memory saved by sharing KV blocks: policy 'shared', {num_requests} requests per trace, capacity "
              f"{args.capacity} slots, block size {args.block_size}, max_model_len {args.max_model_len}, "
              f"seed {args.seed}\n")
        print(format_sharing_table(rows))
        print("\n" + LEGEND + "\n\n" + paper_note())
    if args.plot_dir:
        from minipaged.lab.plots import plot_memory_saved

        os.makedirs(args.plot_dir, exist_ok=True)
        path = os.path.join(args.plot_dir, "memory_saved.png")
        plot_memory_saved(rows, path=path, paper=PAPER_SAVED)
        print(f"\nsaved {path}")
    return 0
