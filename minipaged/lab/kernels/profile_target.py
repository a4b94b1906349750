"""The kernels at chapter 10's target shape, for a profiler: what gpu_check.sh runs under Nsight Compute.

    ncu --nvtx --nvtx-include "profile/" ... python -m minipaged.lab.kernels.profile_target [--bench BENCH_JSON]

SmolLM2's shape, batch 64, 2,048 cached tokens, fp16. Each kernel is called once to compile and warm
up, then ``--repeat`` times inside an NVTX range named "profile", so that a profiler told to keep only
that range sees the kernels alone (not the warm-up, not the inputs being made). The kernels are those
the benchmark timed at the target shape (the keys of its row's ``us``: ``numba`` is the backend's own
choice, ``numba_K`` the kernel K forced), so a kernel added to the benchmark is profiled too; without
``--bench``, the backend's choice, v1 and v2.

Not handled: other shapes (the benchmark and the ceilings cover them).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from minipaged.lab.bench.kernels import SHAPES, TARGET, _uniform_decode_batch


def kernels_from_bench(bench: dict | None) -> list[tuple[str, int | None]]:
    """(kernel, num_partitions) for each numba call the benchmark timed at the target shape."""
    row = next((r for r in (bench or {}).get("rows", []) if (r["shape"], r["batch"], r["context"]) == TARGET), None)
    if row is None:
        return [("auto", None), ("v1", None), ("v2", None)]
    out = []
    for key in row["us"]:
        if key == "numba":
            out.append(("auto", None))
        elif key.startswith("numba_"):
            name = key.removeprefix("numba_")
            out.append((name, row.get(f"{name}_partitions")))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.kernels.profile_target",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=None, help="the benchmark's JSON: profile the kernels it timed")
    parser.add_argument("--repeat", type=int, default=2, help="profiled calls per kernel (default: 2)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_target: no CUDA GPU here", file=sys.stderr)
        return 2
    from minipaged.attention.numba_backend import paged_attention_numba

    bench = None
    if args.bench:
        try:
            with open(args.bench) as f:
                bench = json.load(f)
        except (OSError, ValueError) as e:
            print(f"profile_target: {args.bench} unreadable ({e}); profiling auto, v1 and v2", file=sys.stderr)
    name, batch, context = TARGET
    b = _uniform_decode_batch(SHAPES[name], batch, context, torch.device("cuda"))
    args_ = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    for kernel, parts in kernels_from_bench(bench):
        def call(kernel=kernel, parts=parts):
            return paged_attention_numba(*args_, kernel=kernel, num_partitions=parts, max_context_len=context,
                                         max_query_len=1, validate=False)

        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("profile")
        for _ in range(args.repeat):
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"profiled {kernel}" + (f" ({parts} partitions)" if parts else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
