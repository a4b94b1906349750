"""``simulate``: compare KV policies on a synthetic trace from the command line.

    python -m minipaged.lab.simulator                          every policy and reservation rule
    python -m minipaged.lab.simulator --policy contiguous on_demand --reservation max --json
    python -m minipaged.lab.simulator --sweep-block-size       on_demand utilization, blocks 1..256
    python -m minipaged.lab.simulator --sharing                memory saved by copy-on-write sharing (ch05)
    python -m minipaged.lab.simulator --prefix                 prefill saved by the prefix cache (ch07)
    python -m minipaged.lab.simulator --chunked                inter-token latency with chunked prefill (ch08)
    python -m minipaged.lab.simulator --serving --capacity 16384   forward passes: static, Orca, paged (ch06)

``register(subparsers)`` adds the same command as ``simulate`` to another argparse program; the
parsed arguments carry ``func``, which runs it and returns the exit code.

Why these defaults. max_model_len 2048 is the context length of the models the vLLM paper served,
and what its "max" baseline reserves. The capacity, 32768 token slots, holds 16 such slabs: enough
requests at once that averages are not decided by a handful of them, and still a sub-second run
(the utilization figures move by well under a point between 16k and 64k slots). 1000 requests give
thousands of loaded steps per policy. Arrivals at 1 request per step exceed what any policy can serve
at this capacity (at most ~0.2 finish per step), so the queue stays non-empty and memory, the
thing being compared, is what limits every policy. Utilization is averaged over those loaded steps.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from minipaged.kv import ALL_POLICIES, POLICIES, RESERVATION_RULES
from minipaged.lab import capture
from minipaged.lab.simulator.compare import (
    SWEEP_BLOCK_SIZES,
    compare_policies,
    policy_variants,
    sweep_block_size,
)
from minipaged.lab.simulator.workloads import WORKLOADS, describe, make_workload

SERVING_REQUESTS = 200  # with --serving: a few seconds for the static system's ~25,000 steps
SERVING_MAX_NUM_SEQS = 256  # with --serving: high enough that memory, not this cap, limits every system
DEFAULTS = dict(workload="sharegpt", capacity=32768, block_size=16, num_requests=1000, arrival_rate=1.0,
                max_model_len=2048, seed=0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=None,
                        help="synthetic trace shaped like ShareGPT (mean 161 in / 338 out tokens) or "
                             f"Alpaca (19 in / 58 out); default {d['workload']} (with --sharing: both)")
    parser.add_argument("--policy", nargs="+", choices=[*ALL_POLICIES, "all"], default=None,
                        help="KV policies to compare side by side: contiguous (ch01), fixed_blocks (ch02), "
                             "block_table (ch03), on_demand (ch04), or all of those four; shared (ch05) "
                             "equals on_demand on a trace without forks (see --sharing). Default: all; "
                             "with --sweep-block-size alone, on_demand")
    parser.add_argument("--reservation", nargs="+", choices=[*RESERVATION_RULES, "all"], default=["all"],
                        help="what the reserving policies (contiguous, fixed_blocks, block_table) set "
                             "aside at admission: max = max_model_len, pow2 = next power of two of "
                             "prompt + max_tokens, oracle = the exact final length. on_demand ignores "
                             "it. Default: all")
    parser.add_argument("--block-size", type=int, default=d["block_size"],
                        help="tokens per KV block for the block policies (the contiguous arena always "
                             "uses 1); default %(default)s")
    parser.add_argument("--capacity", type=int, default=None,
                        help=f"KV cache size in token slots, the same for every policy; default {d['capacity']} "
                             f"(with --chunked: 65536)")
    parser.add_argument("--num-requests", type=int, default=None,
                        help=f"requests in the trace; default {d['num_requests']} (with --sharing: 300)")
    parser.add_argument("--arrival-rate", type=float, default=d["arrival_rate"],
                        help="mean arrivals per step (Poisson); inf puts every request at step 0; "
                             "default %(default)s")
    parser.add_argument("--max-model-len", type=int, default=d["max_model_len"],
                        help="longest prompt + output the model accepts (and what 'max' reserves); "
                             "default %(default)s")
    parser.add_argument("--seed", type=int, default=d["seed"], help="trace seed; default %(default)s")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table: per policy label its "
                             "utilization, max_concurrent, refused and the rest")
    parser.add_argument("--sweep-block-size", action="store_true",
                        help=f"also measure utilization of the block policies at block sizes "
                             f"{', '.join(map(str, SWEEP_BLOCK_SIZES))}")
    parser.add_argument("--sharing", action="store_true",
                        help="chapter 05 instead: KV memory saved by sharing blocks (policy 'shared') for "
                             "parallel sampling and beam search, on both traces unless --workload is given")
    parser.add_argument("--samples", type=int, nargs="+", default=[2, 4, 6],
                        help="with --sharing: parallel-sampling n values; default %(default)s")
    parser.add_argument("--beam-widths", type=int, nargs="+", default=[2, 4, 6],
                        help="with --sharing: beam widths; default %(default)s")
    parser.add_argument("--prefix", action="store_true",
                        help="chapter 07 instead: prompt tokens served by the prefix cache on a trace of "
                             "chat requests sharing a few system prompts, against KV capacity "
                             "(minipaged/lab/simulator/prefix.py; its own trace, --num-requests and --seed apply)")
    parser.add_argument("--capacities", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768],
                        help="with --prefix: KV capacities in token slots; default %(default)s")
    parser.add_argument("--chunked", action="store_true",
                        help="chapter 08 instead: inter-token latency with whole and chunked prefills on a trace of "
                             "chat requests and long documents, in cost units (minipaged/lab/simulator/chunked.py; "
                             "--num-requests and --seed apply)")
    parser.add_argument("--budgets", type=int, nargs="+", default=None,
                        help="with --chunked: max_num_batched_tokens values; default 2048 1024 512 256 128 64")
    parser.add_argument("--step-overhead", type=float, default=None,
                        help="with --chunked: what every step costs besides its tokens, in tokens' worth; "
                             "default 55, the order of what python -m minipaged bench chunked fits on a 2-core CPU "
                             "(chapter 08's record: 47)")
    parser.add_argument("--serving", action="store_true",
                        help="chapter 06 instead: the trace through the real engine core without a model "
                             "(minipaged/lab/simulator/serving.py), served by static batching, by Orca's "
                             "continuous batching over contiguous slabs (max, pow2, oracle reservations) and by "
                             "continuous batching over blocks on demand: forward passes, mean batch, preemptions "
                             f"(--num-requests defaults to {SERVING_REQUESTS})")
    parser.add_argument("--plot-dir", default=None,
                        help="also save PNG figures there: waste breakdown per policy, a memory map per "
                             "policy (its first 2000 steps), and the sweep if asked; with --serving, "
                             "steps_timeline.png; with --sharing, --prefix or --chunked, their own figures "
                             "(needs matplotlib)")


def _percent(x: float) -> str:
    return f"{100 * x:5.1f}%"


def format_table(results) -> str:
    header = (f"{'policy':<22}{'util':>7}{'tokens':>8}{'reserv':>8}{'intern':>8}{'extern':>8}{'free':>8}"
              f"{'max_conc':>9}{'refused':>8}{'preempt':>8}{'steps':>8}{'frag_blk':>9}{'unused/seq':>11}{'max':>8}")
    lines = [header, "-" * len(header)]
    for r in results:
        u = r.mean_usage
        util = _percent(r.utilization) + ("*" if r.utilization_basis != "loaded" else "")
        lines.append(f"{r.policy:<22}{util:>7}{_percent(u['tokens']):>8}"
                     f"{_percent(u['reserved']):>8}{_percent(u['internal']):>8}{_percent(u['external']):>8}"
                     f"{_percent(u['free']):>8}{r.max_concurrent:>9}{len(r.refused):>8}{r.preemptions:>8}"
                     f"{r.steps:>8}{r.fragmentation_blocked_steps:>9}{r.unused_per_seq:>11.2f}"
                     f"{r.unused_per_seq_max:>8.2f}")
    return "\n".join(lines)


LEGEND = """\
util      tokens / occupied slots, time-averaged over loaded steps (a request waiting);
          * = never loaded, averaged over the busy steps instead
tokens .. free   share of the pool in each state over the same steps (definitions: minipaged/kv/base.py)
max_conc  most requests running at once; preempt: sequences evicted for lack of a free block
frag_blk  loaded steps where the queue head was refused although all free slots together held it
unused/seq  slots held without a token (reserved + internal) per running sequence: mean over the steps
          with one running; max: the worst step"""


def run(args: argparse.Namespace) -> int:
    if args.capacity is None:
        from minipaged.lab.simulator.chunked import DEFAULTS as CHUNKED

        args.capacity = CHUNKED["capacity"] if getattr(args, "chunked", False) else DEFAULTS["capacity"]
    for field in ("capacity", "num_requests", "block_size", "max_model_len"):
        if getattr(args, field) is not None and getattr(args, field) < 1:
            raise SystemExit(f"--{field.replace('_', '-')} must be >= 1, got {getattr(args, field)}")
    if not (args.arrival_rate > 0 or math.isinf(args.arrival_rate)):
        raise SystemExit(f"--arrival-rate must be > 0 (or inf), got {args.arrival_rate}")
    if getattr(args, "prefix", False):
        return run_prefix(args)
    if getattr(args, "chunked", False):
        return run_chunked(args)
    if getattr(args, "serving", False):
        return run_serving(args)
    if getattr(args, "sharing", False):
        if any(n < 1 for n in args.samples + args.beam_widths):
            raise SystemExit("--samples and --beam-widths must be >= 1")
        from minipaged.lab.simulator.sharing_report import run_sharing

        return run_sharing(args)
    args.workload = args.workload or DEFAULTS["workload"]
    args.num_requests = args.num_requests or DEFAULTS["num_requests"]
    requests = make_workload(args.workload, args.num_requests, arrival_rate=args.arrival_rate,
                             max_model_len=args.max_model_len, seed=args.seed)
    chosen = args.policy or (["on_demand"] if args.sweep_block_size else ["all"])
    policies = list(dict.fromkeys((list(POLICIES) if "all" in chosen else []) + [p for p in chosen if p != "all"]))
    rules = list(RESERVATION_RULES) if "all" in args.reservation else list(dict.fromkeys(args.reservation))
    variants = policy_variants(policies, rules)
    timeline = dict(timeline_steps=200, timeline_every=10) if args.plot_dir else {}
    try:
        results = compare_policies(requests, variants, capacity=args.capacity, block_size=args.block_size,
                                   max_model_len=args.max_model_len, **timeline)
        sweep = (sweep_block_size(requests, variants, capacity=args.capacity, max_model_len=args.max_model_len)
                 if args.sweep_block_size else None)
    except ValueError as error:
        raise SystemExit(f"simulate: {error}") from None

    config = {k: getattr(args, k) for k in DEFAULTS}
    out = {"config": config, "workload": describe(requests), "policies": {r.policy: r.summary() for r in results}}
    if sweep is not None:
        out["block_size_sweep"] = {label: {str(bs): round(r.utilization, 4) for bs, r in runs.items()}
                                   for label, runs in sweep.items()}
    capture.emit(out, args.json)
    if not args.json:
        stats = describe(requests)
        print(f"{args.workload}-like trace: {stats['num_requests']} requests, mean input "
              f"{stats['mean_input']:.2f}, mean output {stats['mean_output']:.2f} tokens; capacity "
              f"{args.capacity} slots, block size {args.block_size}, max_model_len {args.max_model_len}, "
              f"arrival rate {args.arrival_rate}/step, seed {args.seed}\n")
        print(format_table(results))
        print("\n" + LEGEND)
        if sweep is not None:
            print("\nutilization by block size")
            print(f"{'policy':<22}" + "".join(f"{bs:>7}" for bs in SWEEP_BLOCK_SIZES))
            for label, runs in sweep.items():
                print(f"{label:<22}" + "".join(f"{_percent(runs[bs].utilization):>7}" for bs in runs))
    if args.plot_dir:
        _save_plots(args.plot_dir, results, sweep)
    return 0


def run_prefix(args: argparse.Namespace) -> int:
    from minipaged.lab.simulator import prefix

    if any(c < args.block_size for c in args.capacities):
        raise SystemExit(f"--capacities must each hold at least one block of {args.block_size} slots")
    d = prefix.DEFAULTS
    requests = prefix.make_prefix_workload(args.num_requests or d["num_requests"], d["num_prefixes"],
                                           d["prefix_len"], d["suffix_len"], d["output_len"], d["zipf"],
                                           seed=args.seed)
    ideal = prefix.ideal_hit_rate(requests, args.block_size)
    rows = prefix.sweep_capacity(requests, args.capacities, progress=not args.json, block_size=args.block_size,
                                 max_model_len=d["max_model_len"], max_num_seqs=d["max_num_seqs"])
    capture.emit({"config": {**d, "num_requests": len(requests), "seed": args.seed, "block_size": args.block_size},
                  "ideal_hit_rate": ideal, "rows": rows}, args.json)
    if not args.json:
        mean = sum(r.prompt_len for r in requests) / len(requests)
        print(f"{len(requests)} chat requests, {d['num_prefixes']} system prompts of {d['prefix_len']} tokens "
              f"(Zipf {d['zipf']}), mean prompt {mean:.1f} tokens, block size {args.block_size}, "
              f"max_num_seqs {d['max_num_seqs']}; cold = policy 'shared', warm = 'prefix_caching'\n")
        print(prefix.format_sweep(rows, ideal))
    if args.plot_dir:
        from minipaged.lab.plots import plot_prefix_sweep

        os.makedirs(args.plot_dir, exist_ok=True)
        path = os.path.join(args.plot_dir, "prefix_capacity_sweep.png")
        plot_prefix_sweep(rows, ideal, path=path)
        print(f"\nsaved {path}")
    return 0


SERVING_SYSTEMS = {  # key: (label, scheduler, policy, reservation)
    "static": ("static + contiguous", "static", "contiguous", "max"),
    "orca_max": ("Orca (max): continuous + contiguous", "continuous", "contiguous", "max"),
    "orca_pow2": ("Orca (pow2): continuous + contiguous", "continuous", "contiguous", "pow2"),
    "orca_oracle": ("Orca (oracle): continuous + contiguous", "continuous", "contiguous", "oracle"),
    "paged": ("continuous + paged", "continuous", "on_demand", "max"),
}


def serving_runs(requests, capacity: int, block_size: int, max_model_len: int,
                 max_num_seqs: int = SERVING_MAX_NUM_SEQS) -> dict:
    """label -> ServingRun for every system of SERVING_SYSTEMS on the same requests and capacity."""
    from minipaged.kv import make_policy
    from minipaged.lab.simulator.serving import simulate_serving

    runs = {}
    for label, scheduler, policy_name, reservation in SERVING_SYSTEMS.values():
        policy = make_policy(policy_name, num_slots=capacity, block_size=block_size, max_model_len=max_model_len,
                             reservation=reservation)
        runs[label] = simulate_serving(scheduler, policy, requests, max_num_seqs=max_num_seqs)
    return runs


def run_serving(args: argparse.Namespace) -> int:
    args.workload = args.workload or DEFAULTS["workload"]
    requests = make_workload(args.workload, args.num_requests or SERVING_REQUESTS, arrival_rate=float("inf"),
                             max_model_len=args.max_model_len, seed=args.seed)
    runs = serving_runs(requests, args.capacity, args.block_size, args.max_model_len)
    static = runs["static + contiguous"].steps
    keys = {label: key for key, (label, *_) in SERVING_SYSTEMS.items()}
    rows = {keys[label]: {"label": label, "steps": r.steps, "mean_batch": round(r.mean_batch, 2),
                          "preemptions": r.preemptions, "mean_kv_held": round(sum(r.kv_held) / len(r.kv_held), 4),
                          "static_steps_over_steps": round(static / r.steps, 2)} for label, r in runs.items()}
    config = {"workload": args.workload, "num_requests": len(requests), "capacity": args.capacity,
              "block_size": args.block_size, "max_model_len": args.max_model_len,
              "max_num_seqs": SERVING_MAX_NUM_SEQS,
              "seed": args.seed}
    capture.emit({"config": config, "workload": describe(requests), "systems": rows}, args.json)
    if args.plot_dir:  # three of the five systems, step by step
        from minipaged.lab.plots import plot_serving_timeline

        os.makedirs(args.plot_dir, exist_ok=True)
        shown = [SERVING_SYSTEMS[key][0] for key in ("static", "orca_oracle", "paged")]
        plot_serving_timeline({k: {"time": list(range(1, runs[k].steps + 1)), "batch": runs[k].batch_sizes,
                                   "kv_held": runs[k].kv_held} for k in shown}, args.capacity,
                              x_label="step (forward pass)", path=os.path.join(args.plot_dir, "steps_timeline.png"),
                              title=f"{args.workload}-like trace, {len(requests)} requests, {args.capacity} slots "
                                    f"(simulated, no model)")
    if not args.json:
        stats = describe(requests)
        print(f"{args.workload}-like trace: {stats['num_requests']} requests at once, mean input "
              f"{stats['mean_input']:.2f}, mean output {stats['mean_output']:.2f} tokens; capacity {args.capacity} "
              f"slots, block size {args.block_size}, max_model_len {args.max_model_len}, "
              f"max_num_seqs {SERVING_MAX_NUM_SEQS}\n")
        print(f"{'system':<40}{'steps':>8}{'mean batch':>12}{'KV held':>9}{'preempt':>9}{'fewer steps':>13}")
        print("-" * 91)
        for row in rows.values():
            print(f"{row['label']:<40}{row['steps']:>8}{row['mean_batch']:>12.1f}{100 * row['mean_kv_held']:>8.1f}%"
                  f"{row['preemptions']:>9}{row['static_steps_over_steps']:>12.2f}x")
        print("\nsteps = forward passes to serve the whole trace (the model is replaced by one token per "
              "sequence per step);\nKV held = share of the pool's slots held, mean over steps; fewer steps = "
              "static's steps / the system's")
    return 0


def run_chunked(args: argparse.Namespace) -> int:
    from minipaged.lab.simulator import chunked

    d = chunked.DEFAULTS
    budgets = args.budgets or d["budgets"]
    overhead = d["step_overhead"] if args.step_overhead is None else args.step_overhead
    if any(b < d["max_num_seqs"] for b in budgets):
        raise SystemExit(f"--budgets must each be at least max_num_seqs={d['max_num_seqs']}")
    if not overhead >= 0 or overhead == float("inf"):
        raise SystemExit(f"--step-overhead must be a finite number >= 0, got {overhead}")
    requests = chunked.make_chunked_workload(args.num_requests or d["num_requests"], d["long_every"], d["long_len"],
                                             d["short_len"], d["output_len"], seed=args.seed)
    longest = max(r.prompt_len + r.max_tokens for r in requests)
    need = -(-longest // args.block_size) * args.block_size
    if args.capacity < need:
        raise SystemExit(f"--capacity {args.capacity} cannot hold the trace's longest request ({longest} tokens with "
                         f"its output); give at least {need} slots")
    rows = chunked.simulate_chunked(requests, budgets, step_overhead=overhead, max_num_seqs=d["max_num_seqs"],
                                    capacity=args.capacity, block_size=args.block_size,
                                    max_model_len=d["max_model_len"], progress=not args.json)
    capture.emit({"config": {**d, "num_requests": len(requests), "seed": args.seed, "budgets": budgets,
                             "step_overhead": overhead, "capacity": args.capacity, "block_size": args.block_size},
                  "rows": rows}, args.json)
    if not args.json:
        num_long = sum(1 for r in requests if r.prompt_len >= d["long_len"][0])
        print(f"{len(requests)} requests arriving at once: {num_long} documents of {d['long_len'][0]}-"
              f"{d['long_len'][1]} tokens among chat prompts of {d['short_len'][0]}-{d['short_len'][1]}; "
              f"outputs {d['output_len'][0]}-{d['output_len'][1]} tokens; max_num_seqs {d['max_num_seqs']}; "
              f"capacity {args.capacity} slots, block size {args.block_size}\n")
        print(chunked.format_rows(rows, overhead))
    if args.plot_dir:
        from minipaged.lab.plots import plot_budget_sweep, plot_step_tokens

        os.makedirs(args.plot_dir, exist_ok=True)
        paths = [os.path.join(args.plot_dir, name) for name in ("chunked_steps.png", "chunked_budget_sweep.png")]
        plot_step_tokens(rows, 256 if 256 in budgets else budgets[-1], path=paths[0])
        plot_budget_sweep(rows, path=paths[1])
        print("\nsaved " + ", ".join(paths))
    return 0


def _save_plots(directory: str, results, sweep) -> None:
    from minipaged.lab.plots import plot_block_size_sweep, plot_memory_map, plot_waste_breakdown

    os.makedirs(directory, exist_ok=True)
    saved = [os.path.join(directory, "waste_breakdown.png")]
    plot_waste_breakdown(results, path=saved[-1])
    for r in results:
        name = r.policy.replace("(", "_").replace(")", "")
        saved.append(os.path.join(directory, f"memory_map_{name}.png"))
        plot_memory_map(r.timeline, path=saved[-1])
    if sweep is not None:
        saved.append(os.path.join(directory, "block_size_sweep.png"))
        plot_block_size_sweep(sweep, path=saved[-1])
    print("\nsaved " + ", ".join(saved))


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="python -m minipaged.lab.simulator",
        description="Simulate a request trace against KV-cache policies and measure memory waste.")
    add_arguments(parser)
    capture.add_argument(parser, record_default)
    parser.set_defaults(func=run)
    return parser


POLICY_CHAPTER = {"contiguous": "01", "fixed_blocks": "02", "block_table": "03", "on_demand": "04", "shared": "05"}


def record_default(args: argparse.Namespace) -> str:
    """Where ``--record`` writes by default: the chapter of the mode, or of the latest policy compared."""
    for mode, where in (("prefix", "07/simulate_prefix"), ("chunked", "08/simulate_chunked"),
                        ("serving", "06/simulate_serving"),
                        ("sharing", "05/simulate_sharing"), ("sweep_block_size", "04/simulate_block_sizes")):
        if getattr(args, mode, False):
            return where
    chosen = [p for p in (args.policy or ["all"]) if p != "all"]
    chapter = max((POLICY_CHAPTER[p] for p in chosen), default="04")
    return f"{chapter}/simulate"


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``simulate`` subcommand to an argparse subparsers object."""
    parser = subparsers.add_parser(
        "simulate", help="compare KV policies on a synthetic trace (no model needed)",
        description="Simulate a request trace against KV-cache policies and measure memory waste.")
    return build_parser(parser)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return capture.call(args, ["simulate", *(sys.argv[1:] if argv is None else argv)])
