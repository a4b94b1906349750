"""The decode attention alone: chapter 06's batched PyTorch path against the compiled kernel.

    python scripts/decode_attention.py [--batch 32] [--context 140] [--rounds 3]

SmolLM2-135M's attention shapes (9 query heads, 3 K/V heads of 64, blocks of 16), one decode token
per sequence, a shuffled block table, and 30 layers of caches, so that, as in a real step, each
layer's K and V come from memory rather than from the CPU's caches (at batch 32 and 140 keys, 6.9 MB a
layer, 207 MB in all). Each round times the 30 layers through ``BatchedAttention`` (gather, SDPA)
and through the "cpu" backend's kernel (``paged_attention`` in minipaged/csrc/cpu_ops.cpp), after
checking both against the reference.

Not handled: prompts (the kernel takes short queries only; prompts go to SDPA either way).
"""

from __future__ import annotations

import argparse
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=140)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)

    from minipaged.attention.batched import BatchedAttention, KernelAttention
    from minipaged.attention.reference import paged_attention_reference
    from minipaged.model import kernels

    if kernels.ops() is None:
        print("the compiled kernels are not available here: nothing to compare")
        return 1
    gen = torch.Generator().manual_seed(0)
    block_size, kv_heads, heads, head_dim, layers = 16, 3, 9, 64, 30
    per_seq = -(-args.context // block_size)
    num_blocks = args.batch * per_seq + 8
    caches = [(torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen),
               torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)) for _ in range(layers)]
    order = torch.randperm(num_blocks, generator=gen)[:args.batch * per_seq]
    tables = order.view(args.batch, per_seq).to(torch.int32)
    lengths = torch.full((args.batch,), args.context, dtype=torch.int32)
    q = torch.randn(args.batch, heads, head_dim, generator=gen)
    paths = {"batched (gather + SDPA)": BatchedAttention(tables, lengths, None, block_size),
             "compiled kernel": KernelAttention(tables, lengths, None, block_size)}
    want = paged_attention_reference(q, *caches[0], tables, lengths)
    for attend in paths.values():
        torch.testing.assert_close(attend(q, *caches[0]), want, rtol=1e-5, atol=1e-5)
    megabytes = sum(k.numel() + v.numel() for k, v in caches) * 4 / 1e6
    print(f"batch {args.batch}, {args.context} keys each, {layers} layers ({megabytes:.0f} MB of K/V); "
          f"both equal the reference")
    best = {name: float("inf") for name in paths}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, attend in paths.items():
                start = time.perf_counter()
                for k, v in caches:
                    attend(q, k, v)
                best[name] = min(best[name], time.perf_counter() - start)
    for name, seconds in best.items():
        print(f"  {name:24} {seconds * 1e3:7.2f} ms for {layers} layers  "
              f"({megabytes / seconds / 1e3:5.1f} GB/s of K/V)")
    print(f"  the kernel: {best['batched (gather + SDPA)'] / best['compiled kernel']:.2f}x the batched path's speed "
          f"(best of {args.rounds} alternated rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
