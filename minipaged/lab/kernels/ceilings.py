"""Ceilings for chapter 10's kernels: how fast this GPU moves the bytes a decode step must read, when
nothing but the reading is done. Measured in the same run as the kernels, they say how much of the gap
to the datasheet peak is the kernels' own.

    python -m minipaged.lab.kernels.ceilings [--quick] [--out ceilings.json] [--iters 10]   (GPU)
    python -m minipaged.lab.kernels.ceilings --ptx [--cc 9.0]                            (no GPU needed)

Three kinds of ceiling:

- **device copy**: torch's ``copy_`` of a 2 GiB buffer (bytes read plus bytes written, per second);
- **flat read**: a numba kernel that reads 2 GiB of fp16 values as 2-, 4- or 8-byte words (float16,
  int32 or int64), unpacks each word into its halves, converts them to fp32 and sums them: the width of
  the load is the only difference between the three;
- **paged read**: a numba kernel that reads K and V of every cached token through the block table,
  like the attention kernels, in 8-byte words, with the block size and row width compile-time constants,
  and does no attention math (it XORs the words together so that no load can be left out). At each
  shape the benchmark times it tries a few partition counts and block widths and keeps the fastest.

Each kernel returns a checksum, so the simulator can check that it reads what it should: the flat
read's sum equals torch's, the paged read's XOR equals that of the visible rows gathered by torch.

Not handled: 16-byte loads (numba has no vector types), reads that overlap arithmetic.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from minipaged.attention.kernels import using_simulator  # importing it picks the simulator without a GPU

PAGED_PARTITIONS = (1, 2, 4, 6, 8, 12, 16, 32)
PAGED_THREADS = (128, 256)
FLAT_BYTES = 2 * 2**30
FLAT_WORDS = {2: "float16", 4: "int32", 8: "int64"}  # as in ceiling_kernels (which imports numba)


# ---------------------------------------------------------------- launching on torch tensors


def _launch(kernel, grid, threads, *args):
    """Run a kernel on torch tensors: NumPy views under the simulator, device views on torch's stream."""
    from numba import cuda

    if using_simulator():
        kernel[grid, threads](*[a.numpy() if isinstance(a, torch.Tensor) else a for a in args])
        return
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    kernel[grid, threads, stream](*[cuda.as_cuda_array(a, sync=False) if isinstance(a, torch.Tensor) else a
                                    for a in args])


def flat_read_sum(values: torch.Tensor, word_bytes: int, blocks: int, threads: int) -> tuple[torch.Tensor, object]:
    """(partial sums [blocks * threads], the call that refills them): fp16 values read as words."""
    if values.dtype != torch.float16 or values.dim() != 1:
        raise ValueError(f"values must be a 1-D float16 tensor, got {values.dtype} with {values.dim()} dims")
    if word_bytes not in FLAT_WORDS:
        raise ValueError(f"word_bytes={word_bytes}; choose one of {sorted(FLAT_WORDS)}")
    words = values.view(getattr(torch, FLAT_WORDS[word_bytes]))
    partial = torch.empty(blocks * threads, dtype=torch.float32, device=values.device)
    from minipaged.lab.kernels.ceiling_kernels import make_flat_read

    kernel = make_flat_read(word_bytes, using_simulator())
    return partial, lambda: _launch(kernel, blocks, threads, words, partial)


def paged_read_call(k_cache, v_cache, block_tables, context_lens, partitions: int, threads: int):
    """(out [seqs, kv_heads, P, T] int64, the call that fills it) for an fp16 or fp32 paged cache."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    if (head_dim * k_cache.element_size()) % 8:
        raise ValueError(f"k_cache rows of {head_dim} x {k_cache.element_size()} B are not whole 8-byte words")
    k_words, v_words = k_cache.view(torch.int64), v_cache.view(torch.int64)
    row_words = k_words.shape[-1]
    max_context = int(context_lens.max())
    part_tokens = -(-max_context // partitions)
    num_seqs = block_tables.shape[0]
    out = torch.zeros(num_seqs, num_kv_heads, partitions, threads, dtype=torch.int64, device=k_cache.device)
    from minipaged.lab.kernels.ceiling_kernels import make_paged_read

    kernel = make_paged_read(block_size, row_words, threads)
    grid = (num_seqs, num_kv_heads, partitions)
    return out, lambda: _launch(kernel, grid, threads, k_words, v_words, block_tables, context_lens,
                                np.int32(part_tokens), out)


def xor_all(t: torch.Tensor) -> int:
    return int(np.bitwise_xor.reduce(t.detach().cpu().numpy().reshape(-1).astype(np.int64)))


def paged_reference_checksum(k_cache, v_cache, block_tables, context_lens) -> int:
    """The XOR of every K and V word of every visible token, gathered by torch (the oracle)."""
    acc = 0
    for s in range(block_tables.shape[0]):
        n = int(context_lens[s])
        if n == 0:
            continue
        blocks = block_tables[s, : -(-n // k_cache.shape[1])].long()
        for cache in (k_cache, v_cache):
            rows = cache[blocks].reshape(-1, *cache.shape[2:])[:n]  # [n, kv_heads, D]
            acc ^= xor_all(rows.contiguous().view(torch.int64))
    return acc


# ---------------------------------------------------------------- measuring (GPU)


def measure_flat(device, timer, iters=10) -> dict:
    n = FLAT_BYTES // 2
    values = torch.randn(n, dtype=torch.float16, device=device)
    dst = torch.empty_like(values)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = {"bytes": FLAT_BYTES,
           "torch_copy_gbps": 2 * FLAT_BYTES / (timer(lambda: dst.copy_(values), iters) * 1e3),
           "read_gbps": {}, "checksum_rel_err": {}}
    expected = float(values.sum(dtype=torch.float64))
    for word_bytes in FLAT_WORDS:
        partial, call = flat_read_sum(values, word_bytes, blocks=32 * sms, threads=256)
        us = timer(call, iters)
        out["read_gbps"][str(word_bytes)] = FLAT_BYTES / (us * 1e3)
        got = float(partial.sum(dtype=torch.float64))
        out["checksum_rel_err"][str(word_bytes)] = abs(got - expected) / max(abs(expected), 1.0)
    return out


def measure_paged(cfg, name, batch, context, timer, peak_gbps, iters=10, threads_tried=PAGED_THREADS,
                  partitions_tried=PAGED_PARTITIONS) -> dict:
    """The fastest paged read over the thread counts and partition counts tried, at one shape; its
    checksum checked against torch's where the shape is small enough to gather (at most 64 x 2,048)."""
    from minipaged.lab.bench.kernels import _uniform_decode_batch

    b = _uniform_decode_batch(cfg, batch, context, timer.device)
    args = (b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    nbytes = 2 * batch * context * cfg.num_kv_heads * cfg.head_dim * 2  # K and V, fp16
    want = paged_reference_checksum(*args) if batch * context <= 64 * 2048 else None
    tried = {}
    for threads in threads_tried:
        for parts in partitions_tried:
            if parts > 1 and context // parts < 64:
                continue
            out, call = paged_read_call(*args, parts, threads)
            tried[f"P{parts}_T{threads}"] = timer(call, iters, min(3, iters))
            if want is not None and xor_all(out) != want:
                raise AssertionError(f"paged read P={parts} T={threads}: wrong checksum at {name} {batch}x{context}")
    best = min(tried, key=tried.get)
    us = tried[best]
    return {"shape": name, "batch": batch, "context": context, "bytes": nbytes, "checked": want is not None,
            "best": best, "us": us, "gbps": nbytes / (us * 1e3), "fraction_of_peak": nbytes / (us * 1e3) / peak_gbps,
            "us_tried": tried}


def run(quick=False, out=None, iters=10, budget_s=None, device="cuda") -> dict:
    from minipaged.lab.bench import kernels as bk

    t0 = time.time()
    device = torch.device(device)
    name = torch.cuda.get_device_name(device)
    peaks = bk.device_peaks(name)
    peak = peaks[0] if peaks else None
    timer = bk.CudaTimer(device)
    result = {"device": name, "peak_gbps": peak, "flat": measure_flat(device, timer, iters), "paged": []}
    torch.cuda.empty_cache()
    grid = list(bk.QUICK_GRID)
    if not quick:
        grid += [(s, b, c) for s in bk.SHAPES for b in bk.BATCHES for c in bk.CONTEXTS if (s, b, c) not in grid]
    for shape, batch, context in grid:
        if budget_s is not None and time.time() - t0 > budget_s:
            result["cut_at"] = [shape, batch, context]
            break
        row = measure_paged(bk.SHAPES[shape], shape, batch, context, timer, peak or float("nan"), iters)
        result["paged"].append(row)
        torch.cuda.empty_cache()
        print(f"paged read {shape:8} {batch:>4} x {context:>5}: {row['us']:9.1f} us  {row['gbps']:7.0f} GB/s "
              f"({row['best']})", file=sys.stderr)
        if out:
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return result


# ---------------------------------------------------------------- compiling (no GPU)


def compile_ptx(cc=(9, 0)) -> dict:
    """name -> PTX of the ceiling kernels, compiled for cc with the real numba.cuda (no GPU needed)."""
    from minipaged.lab.kernels import ptx as ptx_mod  # noqa: I001  (first: it sets NUMBA_ENABLE_CUDASIM=0)
    from numba import types

    from minipaged.lab.kernels.ceiling_kernels import FLAT_WORDS, make_flat_read, make_paged_read

    out = {}
    with ptx_mod._assume_device(cc):
        for word_bytes, dtype in FLAT_WORDS.items():
            fn = make_flat_read(word_bytes, False).py_func
            sig = (types.Array(getattr(types, dtype), 1, "C"), types.Array(types.float32, 1, "C"))
            out[f"flat_read_{word_bytes}B"] = ptx_mod.cuda.compile_ptx(fn, sig, cc=cc)[0]
        words = types.Array(types.int64, 4, "C")
        sig = (words, words, types.Array(types.int32, 2, "C"), types.Array(types.int32, 1, "C"), types.int32,
               types.Array(types.int64, 4, "C"))
        out["paged_read"] = ptx_mod.cuda.compile_ptx(make_paged_read(16, 16, 128).py_func, sig, cc=cc)[0]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.kernels.ceilings",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="only the benchmark's quick grid of shapes")
    parser.add_argument("--out", default=None, help="write the JSON here (rewritten after each shape)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per measurement (default: 10)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no new shape after this many seconds")
    parser.add_argument("--ptx", action="store_true", help="compile the kernels for --cc and print their loads")
    parser.add_argument("--cc", default="9.0")
    args = parser.parse_args(argv)
    if args.ptx:
        from minipaged.lab.kernels.ptx import exit_without_toolchain
        from minipaged.lab.kernels.resources import global_loads

        exit_without_toolchain()
        ptx = compile_ptx(tuple(int(x) for x in args.cc.split(".")))
        print(json.dumps({name: {"loads_by_width": global_loads(text)[0], "loads_by_type": global_loads(text)[1],
                                 "f64_mentions": text.count(".f64"), "local_mentions": text.count(".local")}
                          for name, text in ptx.items()}, indent=1))
        return 0
    if not torch.cuda.is_available():
        print("ceilings: no CUDA GPU here; --ptx compiles the kernels without one, and "
              "tests/ch10_paged_attention_kernel/test_ceilings.py runs them in the simulator", file=sys.stderr)
        return 2
    r = run(quick=args.quick, out=args.out, iters=args.iters, budget_s=args.budget_s)
    if not args.out:
        print(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
