"""Compile every kernel to PTX for a chosen GPU architecture, with no GPU present.

    NUMBA_ENABLE_CUDASIM=0 python -m minipaged.lab.kernels.ptx [--cc 9.0] [--dump DIR] [--json]
                                                                     [--head-dims 64,128] [--dtypes float16]
                                                                     [--loop-cost]

The simulator runs kernels as Python, so it never type-checks them: a float64 that crept into the
inner loop or an fp16 store numba cannot lower only shows up when the kernel is really compiled.
``numba.cuda.compile_ptx`` runs the real compiler (numba -> NVVM, shipped by ``numba-cuda[cu13]``)
for any compute capability without a device, so this catches those errors on any machine.

It needs the real ``numba.cuda``: run it in a process where ``NUMBA_ENABLE_CUDASIM`` is 0 or unset
and torch sees no GPU is fine (this module sets the variable to 0 before numba is imported, unless
numba was imported earlier as the simulator, in which case it raises).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
from types import SimpleNamespace

if "numba" not in sys.modules:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"

from numba import config as numba_config  # noqa: E402

if numba_config.ENABLE_CUDASIM:
    raise ImportError("minipaged.lab.kernels.ptx needs the real numba.cuda, but numba was already "
                      "imported with NUMBA_ENABLE_CUDASIM=1; run it in a fresh process")

from numba import cuda, types  # noqa: E402

from minipaged.attention.kernels.config import KernelConfig  # noqa: E402
from minipaged.attention.kernels.v1_group import make_v1_kernel  # noqa: E402
from minipaged.attention.kernels.v2_split import make_v2_kernels  # noqa: E402
from minipaged.attention.kernels.v3_config import V3Config  # noqa: E402
from minipaged.attention.kernels.v3_wide import make_v3_kernel  # noqa: E402

DTYPES = {"float16": types.float16, "float32": types.float32}
# The exit status of a command that cannot compile here because the compilers are not installed; the
# tests skip on it, naming the install that brings them.
NO_TOOLCHAIN = 3
TOOLCHAIN_HINT = 'pip install -e ".[kernels]" (numba-cuda[cu13]: NVRTC and NVVM)'


def toolchain_missing() -> str | None:
    """Why numba.cuda.compile_ptx cannot run on this machine (NVRTC or NVVM not found), or None."""
    from numba.cuda.cudadrv import nvrtc, nvvm

    try:
        nvrtc.get_supported_ccs()
        nvvm.NVVM()
    except Exception as e:  # their loaders raise several kinds of error for a missing library
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def exit_without_toolchain() -> None:
    """Leave with NO_TOOLCHAIN and a line that says what to install, if the compilers are missing."""
    why = toolchain_missing()
    if why is not None:
        print(f"the CUDA compilers are not installed here: {TOOLCHAIN_HINT}; {why}", file=sys.stderr)
        raise SystemExit(NO_TOOLCHAIN)
# v3's compile-time sizes per compiled entry: decode at the chapter's two shapes (head_dim 64 is
# SmolLM2's, GQA 3; 128 is Llama-3-8B's, GQA 4), the most rows a block takes (multi-token queries),
# and the shared-memory sum the simulator runs, compiled for the GPU.
V3_GROUP = {64: 3, 128: 4}
V3_ENTRIES = {"v3": dict(max_query_len=1), "v3_rows_max": dict(max_query_len=64),
              "v3_shared_sum": dict(max_query_len=1, reduce="shared")}


def v3_config(name: str, head_dim: int, dtype_name: str) -> V3Config:
    """The V3Config behind kernel_signatures' entry `name` (its threads: .num_threads)."""
    opts = dict(V3_ENTRIES[name])
    reduce = opts.pop("reduce", "shuffle")
    cfg = V3Config.for_shape(head_dim, dtype_name, V3_GROUP.get(head_dim, 1), **opts)
    return cfg if reduce == "shuffle" else dataclasses.replace(cfg, reduce=reduce)


def threads_per_block(name: str, cfg: KernelConfig, dtype_name: str) -> int:
    """How many threads a block of kernel_signatures' entry `name` has."""
    return v3_config(name, cfg.head_dim, dtype_name).num_threads if name in V3_ENTRIES else cfg.num_threads


def kernel_signatures(cfg: KernelConfig, dtype_name: str) -> dict:
    """name -> (python function, argument types), as torch tensors arrive: C-contiguous arrays."""
    dt = DTYPES[dtype_name]
    f32, i32 = types.float32, types.int32

    def arr(t, ndim):
        return types.Array(t, ndim, "C")

    act = arr(dt, 3)                # q and out [num_tokens, num_heads, D]
    cache = arr(dt, 4)              # [num_blocks, block_size, num_kv_heads, D]
    ints = (arr(i32, 2), arr(i32, 1), arr(i32, 1), arr(i32, 1))  # block_tables, ctx, q_start, q_lens
    v1 = make_v1_kernel(cfg)
    part, merge = make_v2_kernels(cfg)
    strided = types.Array(dt, 3, "A")  # q as a slice of a fused projection: any strides
    words = types.Array(types.int64, 3, "A")  # v3's q as int64 words, any strides
    flat = arr(types.int64, 1)                # v3's caches as flat runs of int64 words
    v3 = {name: (make_v3_kernel(v3_config(name, cfg.head_dim, dtype_name), simulator=False).py_func,
                 (act, arr(f32, 4), arr(f32, 3), arr(f32, 3), arr(i32, 1), words, flat, flat, *ints, f32, i32, i32))
          for name in V3_ENTRIES}
    return {
        "v1": (v1.py_func, (act, act, cache, cache, *ints, f32)),
        "v1_strided_q": (v1.py_func, (act, strided, cache, cache, *ints, f32)),
        "v2_partition": (part.py_func, (arr(f32, 4), arr(f32, 3), arr(f32, 3), act, cache, cache, *ints, f32,
                                        i32, i32)),
        "v2_merge": (merge.py_func, (act, arr(f32, 4), arr(f32, 3), arr(f32, 3))),
        **v3,
    }


@contextlib.contextmanager
def _assume_device(cc):
    """compile_ptx takes a target cc, but numba compiles the *device functions* a kernel calls for
    the current device, which needs a driver. With none, tell numba which device to assume."""
    import numba.cuda.dispatcher as dispatcher

    if cuda.is_available():
        yield
        return
    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def compile_all(cc=(9, 0), head_dims=(64, 128), dtypes=("float16", "float32")) -> dict:
    """(kernel name, head_dim, dtype) -> PTX text, for the GPU configs of each head_dim."""
    ptx = {}
    with _assume_device(cc):
        for head_dim in head_dims:
            cfg = KernelConfig.for_head_dim(head_dim)
            for dtype_name in dtypes:
                for name, (fn, sig) in kernel_signatures(cfg, dtype_name).items():
                    text, _ = cuda.compile_ptx(fn, sig, cc=cc)
                    ptx[(name, head_dim, dtype_name)] = text
                # one token per KV block (the contiguous arena): copy steps that split unevenly
                fn, sig = kernel_signatures(KernelConfig.for_head_dim(head_dim, block_size=1), dtype_name)["v1"]
                ptx[("v1_block_size_1", head_dim, dtype_name)] = cuda.compile_ptx(fn, sig, cc=cc)[0]
    return ptx


def main_loop_instructions(ptx: str) -> int | None:
    """PTX instructions in the body of the smallest loop that loads 8-byte words (v3's step loop).

    PTX, not the machine code ptxas makes of it: an upper bound. Among them are the register moves
    around each shuffle (shfl works on 32-bit registers), which vanish in the machine code."""
    lines = ptx.splitlines()
    labels = {line.strip()[:-1]: i for i, line in enumerate(lines) if re.match(r"^\$L__\w+:$", line.strip())}
    best = None
    for i, line in enumerate(lines):
        m = re.search(r"bra(?:\.uni)?\s+(\$L__\w+);", line)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            body = [b.strip() for b in lines[labels[m.group(1)]:i + 1]]
            if any(b.startswith("ld.global.u64") for b in body):
                n = sum(1 for b in body if b and not b.startswith(("$L", "//", "{", "}", ".")))
                best = n if best is None else min(best, n)
    return best


def v3_loop_cost(ptx: dict) -> list[dict]:
    """For each compiled "v3" entry: its step loop's PTX instructions per thread, and what that makes
    per key for the whole block (warp instructions: threads / 32 warps run it for step_keys keys)."""
    rows = []
    for (name, head_dim, dtype_name), text in ptx.items():
        if name != "v3":
            continue
        cfg = v3_config(name, head_dim, dtype_name)
        n = main_loop_instructions(text)
        moves = text.count("shfl.sync") * 2  # a move into and out of each shuffle (all of them in the loop)
        rows.append({"kernel": name, "head_dim": head_dim, "dtype": dtype_name, "rows": cfg.rows, "lanes": cfg.lanes,
                     "step_keys": cfg.step_keys, "loop_ptx_instructions": n, "shuffle_moves": moves,
                     "warp_instructions_per_key": (cfg.num_threads // 32) * n / cfg.step_keys,
                     "warp_instructions_per_key_without_moves": (cfg.num_threads // 32) * (n - moves) / cfg.step_keys})
    return rows


def summarize(ptx: dict, cc) -> list[dict]:
    target = f".target sm_{cc[0]}{cc[1]}"
    return [{"kernel": name, "head_dim": head_dim, "dtype": dtype_name, "ptx_chars": len(text),
             "target": target in text, "entry": ".entry" in text, "f64_mentions": text.count(".f64"),
             "local_mentions": text.count(".local")}
            for (name, head_dim, dtype_name), text in ptx.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.kernels.ptx",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 (Hopper), 8.0 (A100)")
    parser.add_argument("--dump", help="write each kernel's PTX into this directory")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--head-dims", default="64,128", help="comma-separated head dims (default: 64,128)")
    parser.add_argument("--dtypes", default="float16,float32", help="comma-separated (default: float16,float32)")
    parser.add_argument("--loop-cost", action="store_true", help="print v3's instructions per key instead")
    args = parser.parse_args(argv)
    exit_without_toolchain()
    cc = tuple(int(x) for x in args.cc.split("."))
    ptx = compile_all(cc=cc, head_dims=tuple(int(d) for d in args.head_dims.split(",")),
                      dtypes=tuple(args.dtypes.split(",")))
    rows = summarize(ptx, cc)
    if args.loop_cost:
        for r in v3_loop_cost(ptx):
            print(json.dumps(r) if args.json else
                  f"v3 head_dim={r['head_dim']:<4d} {r['dtype']:8s} rows={r['rows']} lanes={r['lanes']:<3d} "
                  f"{r['loop_ptx_instructions']} PTX instructions a step of {r['step_keys']} keys: "
                  f"{r['warp_instructions_per_key']:.1f} warp instructions a key "
                  f"({r['warp_instructions_per_key_without_moves']:.1f} without the shuffles' moves)")
        return 0
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for (name, head_dim, dtype_name), text in ptx.items():
            with open(os.path.join(args.dump, f"{name}_d{head_dim}_{dtype_name}.ptx"), "w") as f:
                f.write(text)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['kernel']:13s} head_dim={r['head_dim']:<4d} {r['dtype']:8s} {r['ptx_chars']:7d} chars of "
                  f"PTX, .target sm_{cc[0]}{cc[1]}: {'yes' if r['target'] else 'NO'}, "
                  f".f64 mentions: {r['f64_mentions']}, .local mentions: {r['local_mentions']}")
    return 0 if all(r["target"] and r["entry"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
