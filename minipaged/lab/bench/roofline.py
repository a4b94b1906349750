"""Chapter 00's roofline measurement: on this machine, decoding moves bytes, not FLOPs.

    python -m minipaged bench roofline [--model smollm2-135m] [--context 256] [--batches 1,4,16,64]

It measures, in one run:
1. this CPU's matmul peak (a large fp32 matmul) in FLOP/s and its memory bandwidth (a large copy)
   in bytes/s; their ratio is the ridge point: below it a computation is memory-bound;
2. one decode step of the model at several batch sizes, each sequence with `context` cached tokens.
   From roofline.decode_step_cost it prints the FLOPs done, the bytes read, the arithmetic intensity
   and the achieved FLOP/s and bytes/s as fractions of the measured peaks.

At batch 1 a decode step does about half a FLOP per byte it reads; batching shares each weight
read between sequences, which is why servers want many sequences at once, and why their K/V must fit.
"""

from __future__ import annotations

import json
import time

import torch

from minipaged.kv.per_request import BatchOfCaches, PerRequestKVCache
from minipaged.lab import capture
from minipaged.lab.roofline import decode_step_cost
from minipaged.model import load_model


def best_time(fn, repeats=5):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure_peak_flops(n=2048) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / best_time(lambda: a @ b)


def measure_bandwidth(nbytes=512 * 2**20) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / best_time(lambda: dst.copy_(src))  # read + write


def measure_decode(loaded, batch: int, context: int, repeats: int = 3) -> float:
    """Seconds for one decode step of `batch` sequences with `context` cached tokens each."""
    model, cfg = loaded.model, loaded.config
    gen = torch.Generator().manual_seed(0)
    caches = [PerRequestKVCache(cfg.num_layers) for _ in range(batch)]
    prompt = torch.randint(0, cfg.vocab_size, (batch * context,), generator=gen)
    model(prompt, torch.arange(context).repeat(batch), BatchOfCaches(caches, [context] * batch),
          logits_rows=[-1])
    snapshot = [(list(c.k), list(c.v)) for c in caches]
    tokens = torch.randint(0, cfg.vocab_size, (batch,), generator=gen)
    positions = torch.full((batch,), context)

    def step():
        for c, (k, v) in zip(caches, snapshot):  # reset so every timed step sees `context` tokens
            c.k, c.v = list(k), list(v)
        model(tokens, positions, BatchOfCaches(caches, [1] * batch))

    return best_time(step, repeats)


def run(model="smollm2-135m", context=256, batches=(1, 4, 16, 64), progress=True):
    torch.manual_seed(0)
    peak_flops, bandwidth = measure_peak_flops(), measure_bandwidth()
    loaded = load_model(model, progress=progress)
    rows = []
    for b in batches:
        seconds = measure_decode(loaded, b, context)
        cost = decode_step_cost(loaded.config, b, context)
        rows.append({
            "batch": b, "step_ms": seconds * 1e3, "tokens_per_s": b / seconds,
            "gflop": cost.flops / 1e9, "mbytes_read": cost.bytes / 1e6, "flop_per_byte": cost.intensity,
            "achieved_gflops": cost.flops / seconds / 1e9, "achieved_gbytes_s": cost.bytes / seconds / 1e9,
            "fraction_of_peak_flops": cost.flops / seconds / peak_flops,
            "fraction_of_bandwidth": cost.bytes / seconds / bandwidth,
        })
    return {"model": model, "context": context, "threads": torch.get_num_threads(),
            "peak_gflops": peak_flops / 1e9, "bandwidth_gbytes_s": bandwidth / 1e9,
            "ridge_flop_per_byte": peak_flops / bandwidth, "rows": rows}


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--context", type=int, default=256, help="cached tokens per sequence (default: 256)")
    p.add_argument("--batches", default="1,4,16,64", help="comma-separated batch sizes (default: 1,4,16,64)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args) -> int:
    batches = tuple(int(b) for b in args.batches.split(","))
    r = run(args.model, args.context, batches, progress=not args.json)
    capture.publish(r)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"this CPU ({r['threads']} threads): matmul peak {r['peak_gflops']:.1f} GFLOP/s, "
          f"copy bandwidth {r['bandwidth_gbytes_s']:.1f} GB/s, ridge point {r['ridge_flop_per_byte']:.1f} FLOP/B")
    print(f"one decode step of {r['model']}, {r['context']} cached tokens per sequence:")
    print(f"{'batch':>6} {'ms':>8} {'tok/s':>8} {'FLOP/B':>7} {'GFLOP/s':>8} {'%peak':>6} {'GB/s':>6} {'%bw':>6}")
    for row in r["rows"]:
        print(f"{row['batch']:>6} {row['step_ms']:>8.1f} {row['tokens_per_s']:>8.1f} "
              f"{row['flop_per_byte']:>7.2f} {row['achieved_gflops']:>8.1f} "
              f"{100 * row['fraction_of_peak_flops']:>5.1f}% {row['achieved_gbytes_s']:>6.1f} "
              f"{100 * row['fraction_of_bandwidth']:>5.1f}%")
    return 0
