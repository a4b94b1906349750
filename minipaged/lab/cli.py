"""The lab's command line: ``python -m minipaged bench ...`` and ``python -m minipaged simulate ...``.

The engine's command line (minipaged/cli.py) hands these two commands here, so that the engine never
imports an instrument unless one is asked for. Every benchmark and the simulator take ``--record``
(capture.py), which keeps what the run printed and computed as a results record of its chapter.
"""

from __future__ import annotations

import argparse
import sys

from minipaged.lab import capture


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minipaged", description="minipaged's lab: benchmarks and "
                                     "simulators that measure the engine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks (each prints ratios measured in one run)",
                           description="Benchmarks. Each one measures its alternatives side by side.")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCHMARK")
    from minipaged.lab.bench import (
        chunked,
        decode,
        kv_cache,
        online,
        prefix,
        roofline,
        serving,
        sharing,
        speculative,
        throughput,
    )
    from minipaged.lab.bench import kernels as bench_kernels

    for name, module, chapter, text in [
        ("cache", kv_cache, "00", "chapter 00: decode tokens/s with the KV cache vs full recomputation"),
        ("roofline", roofline, "00", "chapter 00: FLOPs vs bytes of a decode step, against this CPU's peaks"),
        ("decode", decode, "00", "chapter 00: the default engine's decode tokens/s at batch 1-64 under this CPU's two "
                           "roofs (weight streaming, the step's matmuls), and against HF generate"),
        ("sharing", sharing, "05", "chapter 05: KV memory with block sharing vs without, on the real model"),
        ("serving", serving, "06", "chapter 06 (the default): static + contiguous vs continuous + paged vs HF "
                             "generate, same KV memory; recompute vs swap"),
        ("prefix", prefix, "07", "chapter 07: SmolLM2 with the prefix cache off and on: a shared system prompt, "
                           "a conversation"),
        ("chunked", chunked, "08", "chapter 08: SmolLM2 with whole and chunked prefills: inter-token latency, "
                             "TTFT, throughput; what a step costs"),
        ("speculative", speculative, "09", "chapter 09: SmolLM2 with and without prompt-lookup speculation: tokens "
                                     "per forward pass, speedup, same outputs"),
        ("throughput", throughput, "00", "the default engine LLM(model) against HF generate (padded batches of 8) on "
                                   "two chat workloads: output tokens/s, same greedy outputs"),
        ("online", online, "11", "chapter 11: Poisson load through the HTTP server: normalized latency against "
                           "request rate for static, Orca and paged; TTFT, ITL, goodput; server overhead"),
        ("kernel", bench_kernels, "10", "chapter 10: numba PagedAttention kernels vs reference vs SDPA "
                                  "(needs a GPU; --roofline works without)"),
    ]:
        b = bench_sub.add_parser(name, help=text, description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(b)
        capture.add_argument(b, serving.record_default if module is serving else f"{chapter}/bench_{name}")
        b.set_defaults(func=module.main)
    serving.add_arguments(bench)  # `python -m minipaged bench` alone runs the serving benchmark
    capture.add_argument(bench, serving.record_default)
    bench.set_defaults(func=serving.main)

    from minipaged.lab.simulator import cli as simulator_cli

    simulator_cli.register(sub)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        return capture.call(args, argv)
    except ValueError as e:  # bad input: say what is wrong, without a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
