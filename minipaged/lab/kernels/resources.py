"""What each kernel costs an SM, read at compile time on a CPU: registers, shared memory, spills, the
width of every global load, and the occupancy those resources allow.

    python -m minipaged.lab.kernels.resources [--cc 9.0] [--json] [--kernels v1,v2_partition]
                                                    [--head-dims 64,128] [--dtypes float16,float32]

Three steps, none of which needs a GPU:

1. ``numba.cuda.compile_ptx`` turns every kernel of ``ptx.kernel_signatures`` into PTX (as ptx.py does);
2. ``ptxas -v`` (from the PyPI wheel ``nvidia-cuda-nvcc``, 13.x: the 12.x one refuses numba-cuda's PTX
   9.5) assembles the PTX for the chosen architecture and reports the registers a thread uses, the
   static shared memory of a block, its stack frame and its spills: the same figures Nsight Compute
   shows in its "Launch Statistics" on the GPU;
3. the CUDA occupancy arithmetic (``occupancy``) turns those into resident blocks per SM.

The load widths come from the PTX itself: every ``ld.global`` instruction, by its type and vector
count (``ld.global.v2.u32`` moves 8 bytes). A kernel that loads an fp16 cache with ``ld.global.u16``
moves two bytes per instruction, and on an H200 a plain read that way tops out near a quarter of the
memory's bandwidth.

The SM limits in ``SM_LIMITS`` are the per-compute-capability figures of the CUDA C++ Programming
Guide's table of technical specifications (registers and threads per SM, resident blocks, shared
memory per SM and per block) and the allocation rules of NVIDIA's CUDA occupancy calculator (registers
are granted to a warp in units of 256, and the warps that fit are counted per quarter of the register
file, one quarter per scheduler; shared memory is granted in units of 128 bytes, plus 1 KiB the system
keeps per block from compute capability 8.0 on). Nsight Compute's "Block Limit" rows apply the same rules.

Not handled: dynamic shared memory (the kernels declare theirs statically), the L1/shared carveout the
driver picks at launch (the arithmetic assumes the largest), register limits set by launch bounds,
clusters.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

NVCC_WHEEL = "nvidia-cuda-nvcc==13.5.37"


@dataclass(frozen=True)
class KernelResources:
    kernel: str
    head_dim: int
    dtype: str
    cc: tuple[int, int]
    threads_per_block: int
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    global_loads: dict[int, int]  # byte width -> number of ld.global instructions of that width
    blocks_per_sm: int
    occupancy: float  # resident warps the resources allow / the SM's maximum warps
    limited_by: str  # "registers", "shared memory", "threads", "blocks"


@dataclass(frozen=True)
class SMLimits:
    registers: int = 65536          # 32-bit registers per SM
    register_unit: int = 256        # registers are granted per warp in units of this many
    register_banks: int = 4         # the register file is split over the SM's 4 schedulers (sub-partitions)
    max_registers_per_thread: int = 255
    threads: int = 2048             # resident threads per SM
    warps: int = 64                 # resident warps per SM
    blocks: int = 32                # resident blocks per SM
    shared_bytes: int = 228 * 1024  # shared memory per SM (the largest carveout)
    shared_per_block: int = 227 * 1024
    shared_unit: int = 128          # shared memory is granted in units of this many bytes
    shared_reserved: int = 1024     # kept by the system for every resident block


SM_LIMITS = {
    (8, 0): SMLimits(shared_bytes=164 * 1024, shared_per_block=163 * 1024),
    (8, 6): SMLimits(threads=1536, warps=48, blocks=16, shared_bytes=100 * 1024, shared_per_block=99 * 1024),
    (8, 9): SMLimits(threads=1536, warps=48, blocks=24, shared_bytes=100 * 1024, shared_per_block=99 * 1024),
    (9, 0): SMLimits(),
}


def occupancy(registers: int, shared_bytes: int, threads_per_block: int, cc=(9, 0)) -> tuple[int, float, str]:
    """(blocks per SM, resident warps / maximum warps, the limiting resource) for one kernel."""
    cc = tuple(cc)
    if cc not in SM_LIMITS:
        raise ValueError(f"cc={cc}: the occupancy arithmetic knows {sorted(SM_LIMITS)}")
    lim = SM_LIMITS[cc]
    if not 0 < threads_per_block <= 1024:
        raise ValueError(f"threads_per_block={threads_per_block}: a block has 1 to 1024 threads")
    if registers > lim.max_registers_per_thread:
        raise ValueError(f"registers={registers}: at most {lim.max_registers_per_thread} per thread")
    if shared_bytes > lim.shared_per_block:
        raise ValueError(f"shared_bytes={shared_bytes}: at most {lim.shared_per_block} per block")
    warps = math.ceil(threads_per_block / 32)
    per_warp = math.ceil(max(registers, 1) * 32 / lim.register_unit) * lim.register_unit
    per_block_shared = math.ceil(shared_bytes / lim.shared_unit) * lim.shared_unit + lim.shared_reserved
    by = {
        # each scheduler's quarter of the register file holds whole warps: floor per quarter, then x 4
        "registers": lim.register_banks * ((lim.registers // lim.register_banks) // per_warp) // warps,
        "shared memory": lim.shared_bytes // per_block_shared,
        "threads": min(lim.threads // (warps * 32), lim.warps // warps),
        "blocks": lim.blocks,
    }
    limited_by = min(by, key=by.get)  # on a tie, the first in the order above
    blocks = by[limited_by]
    return blocks, blocks * warps / lim.warps, limited_by


# ---------------------------------------------------------------- the PTX and ptxas

LD_GLOBAL = re.compile(r"\bld\.global((?:\.[A-Za-z0-9_:]+)+)")
TYPE_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}


def global_loads(ptx: str) -> tuple[dict[int, int], dict[str, int]]:
    """Counts of ``ld.global`` instructions in a PTX text: by bytes moved, and by vector + PTX type."""
    by_width: dict[int, int] = {}
    by_type: dict[str, int] = {}
    for m in LD_GLOBAL.finditer(ptx):
        parts = m.group(1).strip(".").split(".")
        vec = next((int(p[1:]) for p in parts if re.fullmatch(r"v[248]", p)), 1)
        kind = parts[-1]  # u16, b32, f32, s64, ...
        bits = re.search(r"(\d+)$", kind)
        if bits is None or bits.group(1) not in TYPE_BYTES:
            continue
        width = vec * TYPE_BYTES[bits.group(1)]
        name = (f"v{vec}." if vec > 1 else "") + kind
        by_width[width] = by_width.get(width, 0) + 1
        by_type[name] = by_type.get(name, 0) + 1
    return dict(sorted(by_width.items())), dict(sorted(by_type.items()))


def ptxas_path() -> str:
    """The ptxas of the pip wheel nvidia-cuda-nvcc (13.x), found through the installed package."""
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13", "cuda_nvcc"):
            path = Path(base) / sub / "bin" / "ptxas"
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    raise FileNotFoundError(f"ptxas not found: it comes with the pip package nvidia-cuda-nvcc 13.x "
                            f"(pip install -e \".[kernels]\", or pip install {NVCC_WHEEL})")


PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


@functools.cache
def ptxas_info(ptx: str, cc=(9, 0)) -> dict:
    """Registers, shared bytes, stack and spills of the entry function of a PTX text, from ``ptxas -v``."""
    proc = subprocess.run([ptxas_path(), f"-arch=sm_{cc[0]}{cc[1]}", "-v", "-", "-o", os.devnull],
                          input=ptx, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ptxas failed for sm_{cc[0]}{cc[1]}: {proc.stderr[-2000:]}")
    text = proc.stderr + proc.stdout
    entry = text.split("Compiling entry function", 1)
    if len(entry) < 2:
        raise RuntimeError(f"ptxas reported no entry function: {text[-2000:]}")
    used, frame = PTXAS_USED.search(entry[1]), PTXAS_FRAME.search(entry[1])
    if used is None or frame is None:
        raise RuntimeError(f"cannot read ptxas -v's report: {entry[1][-2000:]}")
    return {"registers": int(used.group(1)), "shared_bytes": int(used.group(2) or 0),
            "stack_bytes": int(frame.group(1)), "spill_store_bytes": int(frame.group(2)),
            "spill_load_bytes": int(frame.group(3))}


def threads_per_block(name: str, entry: tuple, cfg) -> int:
    """A kernel's launch width: the third item of its kernel_signatures entry when given, else the merge
    kernel's (one thread per dim, as numba_backend launches it), else the config's thread count."""
    if len(entry) > 2:
        return int(entry[2])
    if "merge" in name:
        return min(cfg.head_dim, 1024)
    return cfg.num_threads


@functools.cache
def _signatures(head_dim: int, dtype: str) -> dict:
    from minipaged.attention.kernels.config import KernelConfig
    from minipaged.lab.kernels import ptx as ptx_mod  # needs the real numba.cuda

    cfg = KernelConfig.for_head_dim(head_dim)
    return {name: (entry, threads_per_block(name, entry, cfg))
            for name, entry in ptx_mod.kernel_signatures(cfg, dtype).items()}


@functools.cache
def _compiled(cc: tuple[int, int], head_dim: int, dtype: str, name: str) -> tuple[str, int]:
    """(PTX, threads per block) of one kernel at the GPU config of head_dim; compiled once per process."""
    from minipaged.lab.kernels import ptx as ptx_mod

    entry, threads = _signatures(head_dim, dtype)[name]
    with ptx_mod._assume_device(cc):
        text, _ = ptx_mod.cuda.compile_ptx(entry[0], entry[1], cc=cc)
    return text, threads


def kernel_resources(cc=(9, 0), head_dims=(64, 128), dtypes=("float16", "float32"),
                     kernels: tuple[str, ...] | None = None) -> list[KernelResources]:
    """One KernelResources per kernel of ``kernel_signatures`` (or those named), head dim and dtype.
    Needs the real numba.cuda (a process where NUMBA_ENABLE_CUDASIM is 0 or unset) and ptxas."""
    cc = tuple(cc)
    for dt in dtypes:
        if dt not in ("float16", "float32"):
            raise ValueError(f"dtypes: {dt!r} is not one of 'float16', 'float32'")
    ptxas_path()  # fail before compiling anything
    rows = []
    for head_dim in head_dims:
        for dtype in dtypes:
            names = list(_signatures(head_dim, dtype))
            unknown = sorted(set(kernels or ()) - set(names))
            if unknown:
                raise ValueError(f"kernels: {unknown} are not in kernel_signatures, which has {names}")
            for name in names:
                if kernels and name not in kernels:
                    continue
                text, threads = _compiled(cc, head_dim, dtype, name)
                info = ptxas_info(text, cc)
                blocks, occ, limit = occupancy(info["registers"], info["shared_bytes"], threads, cc)
                rows.append(KernelResources(kernel=name, head_dim=head_dim, dtype=dtype, cc=cc,
                                            threads_per_block=threads, **info,
                                            global_loads=global_loads(text)[0], blocks_per_sm=blocks,
                                            occupancy=occ, limited_by=limit))
    return rows


def load_types(row: KernelResources) -> dict[str, int]:
    """The row's global loads by PTX type (from the cached compile)."""
    text, _ = _compiled(row.cc, row.head_dim, row.dtype, row.kernel)
    return global_loads(text)[1]


def to_json(row: KernelResources) -> dict:
    return {**asdict(row), "cc": list(row.cc), "global_loads": {str(k): v for k, v in row.global_loads.items()}}


def from_json(d: dict) -> KernelResources:
    loads = {int(k): v for k, v in d["global_loads"].items()}
    return KernelResources(**{**d, "cc": tuple(d["cc"]), "global_loads": loads})


def kernel_resources_in_subprocess(cc=(9, 0), head_dims=(64, 128), dtypes=("float16", "float32"),
                                   kernels: tuple[str, ...] | None = None, timeout=600) -> list[KernelResources]:
    """kernel_resources from a fresh process with the real numba.cuda: what a test under the simulator calls."""
    root = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "minipaged.lab.kernels.resources", "--json", "--cc", f"{cc[0]}.{cc[1]}",
           "--head-dims", ",".join(map(str, head_dims)), "--dtypes", ",".join(dtypes)]
    if kernels:
        cmd += ["--kernels", ",".join(kernels)]
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[1:])} failed: {proc.stderr[-3000:]}")
    return [from_json(d) for d in json.loads(proc.stdout)]


def report(rows: list[KernelResources]) -> str:
    lines = [f"{'kernel':16} {'D':>3} {'dtype':8} {'thr':>4} {'regs':>4} {'smem B':>7} {'stack':>5} {'spill':>7} "
             f"{'blk/SM':>6} {'occ':>5}  {'limit':13} global loads (count x bytes; by type)"]
    for r in rows:
        widths = " ".join(f"{n}x{w}B" for w, n in r.global_loads.items())
        types = ", ".join(f"{t} {n}" for t, n in load_types(r).items())
        lines.append(f"{r.kernel:16} {r.head_dim:>3} {r.dtype:8} {r.threads_per_block:>4} {r.registers:>4} "
                     f"{r.shared_bytes:>7,} {r.stack_bytes:>5} {r.spill_store_bytes:>3}/{r.spill_load_bytes:<3} "
                     f"{r.blocks_per_sm:>6} {r.occupancy:>5.0%}  {r.limited_by:13} {widths}; {types}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.kernels.resources",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cc", default="9.0", help=f"compute capability, one of "
                        f"{', '.join(f'{a}.{b}' for a, b in SM_LIMITS)} (default 9.0)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.add_argument("--kernels", default=None, help="comma-separated names from kernel_signatures (default: all)")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--dtypes", default="float16,float32")
    args = parser.parse_args(argv)
    try:
        cc = tuple(int(x) for x in args.cc.split("."))
        if cc not in SM_LIMITS:
            raise ValueError(f"--cc {args.cc}: choose one of {', '.join(f'{a}.{b}' for a, b in SM_LIMITS)}")
        rows = kernel_resources(cc, tuple(int(d) for d in args.head_dims.split(",")), tuple(args.dtypes.split(",")),
                                tuple(args.kernels.split(",")) if args.kernels else None)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps([to_json(r) for r in rows], indent=1) if args.json else report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
