"""The lab's command line: ``python -m minipaged bench ...`` and ``python -m minipaged simulate ...``.

The engine's command line (minipaged/cli.py) hands these two commands here, so that the engine never
imports an instrument unless one is asked for. Every benchmark and the simulator take ``--record``
(capture.py), which keeps what the run printed and computed as a results record of its chapter.
"""

from __future__ import annotations

import argparse
import sys

from minipaged.lab import capture


def summary(module) -> str:
    """The first paragraph of a module's docstring, on one line: a benchmark's entry in ``bench --help``."""
    return " ".join(module.__doc__.split("\n\n")[0].replace("``", "").split())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minipaged", description="minipaged's lab: benchmarks and "
                                     "simulators that measure the engine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks (each prints ratios measured in one run)",
                           description="Benchmarks. Each one measures its alternatives side by side; "
                           "`bench` alone runs serving.")
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

    for name, module, chapter in [  # each one's help is the first paragraph of its docstring
        ("cache", kv_cache, "00"),
        ("roofline", roofline, "00"),
        ("decode", decode, "00"),
        ("sharing", sharing, "05"),
        ("serving", serving, "06"),
        ("prefix", prefix, "07"),
        ("chunked", chunked, "08"),
        ("speculative", speculative, "09"),
        ("throughput", throughput, "00"),
        ("online", online, "11"),
        ("kernel", bench_kernels, "10"),
    ]:
        b = bench_sub.add_parser(name, help=summary(module), description=module.__doc__,
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
