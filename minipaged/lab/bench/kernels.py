"""Chapter 10's kernel benchmark: decode attention on a GPU, numba kernels vs the naive reference vs SDPA.

    python -m minipaged.lab.bench.kernels [--quick] [--json] [--peak-gbps 4800]
    python -m minipaged.lab.bench.kernels --roofline      # the arithmetic only, no GPU needed
    python -m minipaged.lab.bench.kernels --check         # kernels vs reference on the GPU only
                                                                # (= python -m minipaged.lab.kernels.check)

For each model shape (SmolLM2-135M: 9 query heads, 3 KV heads, head_dim 64; a Llama-3-8B layer: 32, 8,
128), each batch size and context length, in fp16, one decode step of one layer's attention:

1. builds a paged cache with a shuffled block table, checks every numba kernel against the reference
   (llm.c's rule: validate before timing);
2. times, with CUDA events after warm-up and with the L2 cache flushed before every call (a 1 GiB
   write, then a short GPU spin so the events see GPU time only): the numba backend ("auto": the
   v1/v2 rule), v1 and v2 forced, the naive reference, and torch's scaled_dot_product_attention on
   contiguous K/V (no paging);
3. reports achieved bandwidth, bytes that must move (K, V, Q in, output out) / time, as a fraction of
   the device's peak (from the table below, or --peak-gbps), and the speed ratios;
4. sweeps v2's partition count on a few shapes, to check the v1/v2 rule against measurements.

Host time per call (Python launch overhead) is reported apart (``host_us_per_call_numba``): the
flush and spin give the host time to queue the next call, so the events time the GPU's work only.

Without a CUDA GPU it prints how to get one and exits with status 2 (``--roofline`` still works).
Not handled yet: bf16, prefill-shaped batches (multi-token queries), CUDA graphs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from minipaged.lab import capture
from minipaged.lab.roofline import kv_bytes_per_token
from minipaged.model.config import LLAMA_8B, SMOLLM2_135M, ModelConfig

SHAPES: dict[str, ModelConfig] = {"smollm2": SMOLLM2_135M, "llama8b": LLAMA_8B}
BATCHES = (1, 4, 16, 64, 256)
CONTEXTS = (128, 512, 2048, 8192)
QUICK_GRID = [("smollm2", 1, 512), ("smollm2", 1, 8192), ("smollm2", 64, 512), ("smollm2", 64, 2048),
              ("llama8b", 64, 2048)]
TARGET = ("smollm2", 64, 2048)  # the chapter's headline shape: >= 50% of peak HBM bandwidth there
SWEEP = [("smollm2", 64, 2048), ("smollm2", 4, 8192), ("llama8b", 16, 2048)]
SWEEP_PARTITIONS = (1, 2, 4, 8, 16, 32)

# Vendor datasheet figures: peak HBM/GDDR bandwidth (GB/s) and fp32 non-tensor-core TFLOP/s.
# Matched against torch.cuda.get_device_name, longest key first.
DEVICE_PEAKS = {
    "H200": (4800, 67.0),
    "H100 NVL": (3900, 60.0),
    "H100 PCIe": (2000, 51.0),
    "H100": (3350, 67.0),
    "A100 80GB PCIe": (1935, 19.5),
    "A100-SXM4-80GB": (2039, 19.5),
    "A100": (1555, 19.5),
    "L40S": (864, 91.6),
    "L4": (300, 30.3),
    "A10G": (600, 31.2),
    "A10": (600, 31.2),
    "RTX 4090": (1008, 82.6),
    "RTX 3090": (936, 35.6),
    "V100": (900, 15.7),
    "T4": (320, 8.1),
}


def device_peaks(name: str) -> tuple[float, float] | None:
    """(peak GB/s, peak fp32 TFLOP/s) of a device by name, or None if it is not in the table."""
    for key in sorted(DEVICE_PEAKS, key=len, reverse=True):
        if key.lower() in name.lower():
            return DEVICE_PEAKS[key]
    return None


# ----------------------------------------------------------------------------------------------------
# inputs


def _uniform_decode_batch(cfg: ModelConfig, batch: int, context: int, device, block_size=16, seed=0):
    """Every sequence at `context` tokens, fp16, built on the device (fast even at gigabytes)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per_seq = math.ceil(context / block_size)
    num_blocks = batch * per_seq
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    f16 = dict(dtype=torch.float16, device=device, generator=gen)
    table = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32).view(batch, per_seq)
    return {
        "q": torch.randn(batch, cfg.num_heads, cfg.head_dim, **f16),
        "k_cache": torch.randn(*shape, **f16),
        "v_cache": torch.randn(*shape, **f16),
        "block_tables": table,
        "context_lens": torch.full((batch,), context, dtype=torch.int32, device=device),
        "query_lens": None,
    }


# ----------------------------------------------------------------------------------------------------
# arithmetic (no GPU)


def decode_attention_bytes(cfg: ModelConfig, batch: int, context: int, itemsize: int = 2) -> int:
    """Bytes one layer's decode attention must move: K and V of every cached token, Q in, output out."""
    kv = 2 * batch * context * cfg.num_kv_heads * cfg.head_dim * itemsize
    q_and_out = 2 * batch * cfg.num_heads * cfg.head_dim * itemsize
    return kv + q_and_out


def decode_attention_flops(cfg: ModelConfig, batch: int, context: int) -> int:
    """q.k and p.v: 2 multiply-adds per head dim, per cached token, per query head."""
    return 4 * batch * context * cfg.num_heads * cfg.head_dim


def roofline(peak_gbps: float = 4800, peak_tflops: float = 67.0) -> dict:
    """The chapter's arithmetic: bytes per token, FLOPs per byte, time a decode step needs at peak."""
    rows = []
    for name, cfg in SHAPES.items():
        for batch, context in [(1, 2048), (64, 2048), (256, 8192)]:
            nbytes = decode_attention_bytes(cfg, batch, context)
            flops = decode_attention_flops(cfg, batch, context)
            rows.append({"shape": name, "batch": batch, "context": context, "bytes": nbytes, "flops": flops,
                         "flop_per_byte": flops / nbytes, "us_at_peak_bandwidth": nbytes / (peak_gbps * 1e3),
                         "us_at_peak_flops": flops / (peak_tflops * 1e6)})
    return {
        "kv_bytes_per_token": {name: {"fp32_all_layers": kv_bytes_per_token(cfg, 4),
                                      "fp16_all_layers": kv_bytes_per_token(cfg, 2),
                                      "fp16_one_layer": kv_bytes_per_token(cfg, 2) // cfg.num_layers}
                               for name, cfg in SHAPES.items()},
        "peak_gbps": peak_gbps, "peak_fp32_tflops": peak_tflops,
        "ridge_flop_per_byte": peak_tflops * 1e12 / (peak_gbps * 1e9),
        "rows": rows,
    }


def print_roofline(r: dict) -> None:
    for name, b in r["kv_bytes_per_token"].items():
        print(f"{name}: K+V per token {b['fp32_all_layers']:,} B in fp32, {b['fp16_all_layers']:,} B in fp16 "
              f"(all layers); {b['fp16_one_layer']:,} B per layer in fp16")
    print(f"device: {r['peak_gbps']:,.0f} GB/s, {r['peak_fp32_tflops']} fp32 TFLOP/s -> ridge point "
          f"{r['ridge_flop_per_byte']:.1f} FLOP/B")
    print(f"{'shape':8} {'batch':>5} {'context':>7} {'MB moved':>9} {'FLOP/B':>7} {'us @ peak BW':>12} "
          f"{'us @ peak FLOP':>14}")
    for row in r["rows"]:
        print(f"{row['shape']:8} {row['batch']:>5} {row['context']:>7} {row['bytes'] / 1e6:>9.1f} "
              f"{row['flop_per_byte']:>7.2f} {row['us_at_peak_bandwidth']:>12.1f} {row['us_at_peak_flops']:>14.1f}")


# ----------------------------------------------------------------------------------------------------
# timing (GPU)


class CudaTimer:
    """Median GPU time of fn(), each call after an L2 flush, measured by CUDA events.

    Before each call the GPU writes a 1 GiB buffer (evicting L2) and then spins for about a
    millisecond (torch.cuda._sleep), so the host has queued fn's kernels before the start event
    fires: the events time the GPU's work, not the host's Python launch overhead (measured apart).
    """

    SLEEP_CYCLES = 2_000_000  # about 1 ms at 2 GHz

    def __init__(self, device, flush_bytes=2**30):
        self.device = device
        self.flush = torch.empty(flush_bytes // 4, dtype=torch.float32, device=device)

    def __call__(self, fn, iters=20, warmup=3) -> float:
        for _ in range(warmup):
            fn()
        events = []
        for _ in range(iters):
            self.flush.zero_()  # evicts L2
            if hasattr(torch.cuda, "_sleep"):
                torch.cuda._sleep(self.SLEEP_CYCLES)  # the GPU waits here while the host queues fn
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(self.device)
        times = sorted(s.elapsed_time(e) * 1e3 for s, e in events)  # microseconds
        return times[len(times) // 2]


class WallTimer:
    """CudaTimer's interface on the CPU (perf_counter, no flush): lets the benchmark's own code be
    tested where there is no GPU, under numba's simulator. Its times mean nothing for the chapter."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def __call__(self, fn, iters=20, warmup=3) -> float:
        import time

        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return sorted(times)[len(times) // 2]


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _num_sms(device) -> int:
    from minipaged.attention.kernels.config import DEFAULT_NUM_SMS

    device = torch.device(device)
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else DEFAULT_NUM_SMS


def host_us_per_call(fn, device, calls=50) -> float:
    """Wall time per call with calls queued back to back: launch overhead when the GPU is faster."""
    import time

    fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / calls * 1e6


def _sdpa_inputs(b):
    """Contiguous [batch, kv_heads, context, D] copies of the paged K and V, for torch's SDPA."""
    batch, per_seq = b["block_tables"].shape
    k = b["k_cache"][b["block_tables"].long()].reshape(batch, -1, *b["k_cache"].shape[2:])
    v = b["v_cache"][b["block_tables"].long()].reshape(batch, -1, *b["v_cache"].shape[2:])
    ctx = int(b["context_lens"][0])
    return (b["q"].unsqueeze(2), k[:, :ctx].transpose(1, 2).contiguous(),
            v[:, :ctx].transpose(1, 2).contiguous())


def _sdpa_call(q4, k4, v4):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        sdpa(q4[:1], k4[:1], v4[:1], enable_gqa=True)
        return lambda: sdpa(q4, k4, v4, enable_gqa=True)
    except TypeError:  # torch < 2.5: no GQA in SDPA, so widen K and V (more bytes than the kernels move)
        group = q4.shape[1] // k4.shape[1]
        k4, v4 = k4.repeat_interleave(group, 1), v4.repeat_interleave(group, 1)
        return lambda: sdpa(q4, k4, v4)


def bench_one(cfg: ModelConfig, name: str, batch: int, context: int, timer, peak_gbps: float,
              iters: int = 20, reference_iters: int = 3) -> dict:
    from minipaged.attention.kernels.config import KernelConfig, choose_num_partitions, num_row_tiles, plan_launch
    from minipaged.attention.numba_backend import paged_attention_numba
    from minipaged.attention.reference import paged_attention_reference

    device = timer.device
    b = _uniform_decode_batch(cfg, batch, context, device)
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    group = cfg.num_heads // cfg.num_kv_heads
    units = batch * cfg.num_kv_heads * num_row_tiles(1, group)
    auto_parts, _ = choose_num_partitions(units, context, _num_sms(device),
                                          KernelConfig.for_head_dim(cfg.head_dim).tile_tokens)
    v2_parts = auto_parts if auto_parts > 1 else (min(4, context // 256) if context >= 512 else None)
    auto = plan_launch(batch, cfg.num_kv_heads, group, 1, context, KernelConfig.for_head_dim(cfg.head_dim),
                       _num_sms(device), dtype="float16", simulator=device.type != "cuda")

    def numba_call(kernel="auto", parts=None):
        return lambda: paged_attention_numba(*args, kernel=kernel, num_partitions=parts, max_context_len=context,
                                             max_query_len=1, validate=False)

    calls = {"numba": numba_call(), "numba_v1": numba_call("v1")}
    if v2_parts:
        calls["numba_v2"] = numba_call("v2", v2_parts)
    calls["numba_v3"] = numba_call("v3")
    ref = paged_attention_reference(*args)
    errors = {k: float((fn().float() - ref.float()).abs().max()) for k, fn in calls.items()}
    for k, err in errors.items():
        if not err < 2e-2:
            raise AssertionError(f"{k} differs from the reference by {err} at {name} batch={batch} ctx={context}")

    q4, k4, v4 = _sdpa_inputs(b)
    calls["sdpa"] = _sdpa_call(q4, k4, v4)
    warmup = min(3, iters)
    us = {k: timer(fn, iters, warmup) for k, fn in calls.items()}
    us["reference"] = timer(lambda: paged_attention_reference(*args), min(reference_iters, iters), warmup=1)
    nbytes = decode_attention_bytes(cfg, batch, context)
    gbps = {k: nbytes / (t * 1e3) for k, t in us.items()}
    row = {
        "shape": name, "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "batch": batch, "context": context, "dtype": "float16", "bytes": nbytes,
        "auto_kernel": auto.kernel, "auto_partitions": auto.num_partitions,
        "v2_partitions": v2_parts, "max_abs_err_vs_reference": errors,
        "us": us, "gbps": gbps, "fraction_of_peak": {k: g / peak_gbps for k, g in gbps.items()},
        "speedup_vs_reference": us["reference"] / us["numba"], "speed_vs_sdpa": us["sdpa"] / us["numba"],
        "host_us_per_call_numba": host_us_per_call(calls["numba"], device, calls=max(iters, 2)),
    }
    return row


def sweep_partitions(cfg, name, batch, context, timer, peak_gbps, iters=20) -> dict:
    from minipaged.attention.numba_backend import paged_attention_numba

    b = _uniform_decode_batch(cfg, batch, context, timer.device)
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    nbytes = decode_attention_bytes(cfg, batch, context)
    us = {}
    for parts in SWEEP_PARTITIONS:
        if parts > 1 and context // parts < 64:
            continue
        kernel = "v1" if parts == 1 else "v2"
        us[parts] = timer(lambda k=kernel, p=parts: paged_attention_numba(
            *args, kernel=k, num_partitions=p, max_context_len=context, max_query_len=1, validate=False), iters,
            min(3, iters))
    return {"shape": name, "batch": batch, "context": context,
            "us_by_partitions": us, "fraction_of_peak": {p: nbytes / (t * 1e3) / peak_gbps for p, t in us.items()}}


def run(quick=False, peak_gbps=None, iters=20, progress=True, out=None, device="cuda", grid=None, sweeps=SWEEP,
        target=TARGET, shapes=None) -> dict:
    """The whole benchmark. On device="cpu" (tests only) it times with WallTimer under the simulator."""
    device = torch.device(device)
    shapes = shapes or SHAPES
    on_gpu = device.type == "cuda"
    dev_name = torch.cuda.get_device_name(device) if on_gpu else "cpu (numba simulator: times are meaningless)"
    if peak_gbps is None:
        peaks = device_peaks(dev_name)
        if peaks is None:
            raise SystemExit(f"'{dev_name}' is not in DEVICE_PEAKS; pass --peak-gbps")
        peak_gbps = peaks[0]
    timer = CudaTimer(device) if on_gpu else WallTimer(device)
    if grid is None:
        grid = QUICK_GRID if quick else [(s, b, c) for s in shapes for b in BATCHES for c in CONTEXTS]
    rows = []
    for name, batch, context in grid:
        rows.append(bench_one(shapes[name], name, batch, context, timer, peak_gbps, iters))
        if on_gpu:
            torch.cuda.empty_cache()  # this shape's caches are gone; give the next one the memory
        if progress:
            print_row(rows[-1], file=sys.stderr)
        if out:  # rows so far, in case the run is cut short
            with open(out, "w") as f:
                json.dump({"device": dev_name, "peak_gbps": peak_gbps, "partial": True, "rows": rows}, f, indent=2)
    swept = [sweep_partitions(shapes[n], n, b, c, timer, peak_gbps, iters) for n, b, c in sweeps]
    head = next(r for r in rows if (r["shape"], r["batch"], r["context"]) == tuple(target))
    import numba

    return {
        "device": dev_name, "peak_gbps": peak_gbps, "sms": _num_sms(device),
        "torch": torch.__version__, "numba": numba.__version__, "rows": rows, "partition_sweeps": swept,
        "target": {"shape": list(target), "fraction_of_peak": head["fraction_of_peak"]["numba"],
                   "speedup_vs_reference": head["speedup_vs_reference"],
                   "meets_50pct_of_peak": head["fraction_of_peak"]["numba"] >= 0.5,
                   "meets_10x_reference": head["speedup_vs_reference"] >= 10},
    }


HEADER = (f"{'shape':8} {'batch':>5} {'ctx':>5} {'kernel':>6} {'numba us':>9} {'%peak':>6} {'v1 us':>8} "
          f"{'v2 us':>8} {'sdpa us':>8} {'ref us':>9} {'x ref':>6} {'x sdpa':>6} {'host us':>7}")


def print_row(r, file=sys.stdout):
    us = r["us"]
    v2 = f"{us['numba_v2']:>8.1f}" if "numba_v2" in us else f"{'-':>8}"
    kernel = r["auto_kernel"] + (f"/{r['auto_partitions']}" if r["auto_partitions"] > 1 else "")
    print(f"{r['shape']:8} {r['batch']:>5} {r['context']:>5} {kernel:>6} {us['numba']:>9.1f} "
          f"{100 * r['fraction_of_peak']['numba']:>5.1f}% {us['numba_v1']:>8.1f} {v2} {us['sdpa']:>8.1f} "
          f"{us['reference']:>9.1f} {r['speedup_vs_reference']:>6.1f} {r['speed_vs_sdpa']:>6.2f} "
          f"{r['host_us_per_call_numba']:>7.1f}", file=file)


def add_arguments(p):
    p.add_argument("--quick", action="store_true", help=f"only {len(QUICK_GRID)} shapes, including the target")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")
    p.add_argument("--peak-gbps", type=float, default=None,
                   help="device peak bandwidth in GB/s (default: looked up by device name in DEVICE_PEAKS)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per measurement (default: 20)")
    p.add_argument("--roofline", action="store_true", help="print the arithmetic only (no GPU needed)")
    p.add_argument("--check", action="store_true",
                   help="only compare the kernels with the reference on the GPU (what test_gpu.py runs)")


def main(args) -> int:
    if args.roofline:
        peaks = device_peaks(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
        gbps = args.peak_gbps or (peaks[0] if peaks else DEVICE_PEAKS["H200"][0])
        r = roofline(gbps, peaks[1] if peaks else DEVICE_PEAKS["H200"][1])
        capture.publish(r)
        if args.json:
            print(json.dumps(r, indent=2))
        else:
            print_roofline(r)
        return 0
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA GPU here, and this benchmark times GPU kernels. Run it on a GPU machine "
              "(scripts/gpu_check.sh runs it with the chapter's tests), or use --roofline for the arithmetic "
              "alone. The kernels' correctness is checked without a GPU by "
              "`pytest tests/ch10_paged_attention_kernel` (numba's CUDA simulator).", file=sys.stderr)
        return 2
    if args.check:
        from minipaged.lab.kernels.check import main as check_main

        return check_main(["--out", args.out] if args.out else [])
    r = run(quick=args.quick, peak_gbps=args.peak_gbps, iters=args.iters, progress=not args.json, out=args.out)
    capture.publish(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{r['device']} ({r['sms']} SMs), peak {r['peak_gbps']:,.0f} GB/s; decode attention, fp16, one layer")
    print(HEADER)
    for row in r["rows"]:
        print_row(row)
    for s in r["partition_sweeps"]:
        cells = "  ".join(f"P={p}: {t:.1f} us ({100 * s['fraction_of_peak'][p]:.0f}%)"
                          for p, t in s["us_by_partitions"].items())
        print(f"partitions, {s['shape']} batch {s['batch']} ctx {s['context']}: {cells}")
    t = r["target"]
    print(f"target {t['shape']}: {100 * t['fraction_of_peak']:.1f}% of peak (goal >= 50%), "
          f"{t['speedup_vs_reference']:.1f}x the reference (goal >= 10x)")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
