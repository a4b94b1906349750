"""The kernels against the reference: random paged inputs, the comparison, and the GPU check.

    python -m minipaged.lab.kernels.check [--out results.json]      # needs a CUDA GPU

``random_paged_batch`` lays out a paged KV cache the way the engine leaves it (shuffled, possibly
shared blocks); ``check_against_reference`` runs the numba backend and the PyTorch reference on it and
asserts they agree within ``TOLERANCES``. The chapter's tests use both; ``device_check`` runs the
on-GPU matrix (``device_check_cases``) without pytest, for machines that lack it.

Not handled: bf16 (the kernels do not take it yet).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch


def random_paged_batch(context_lens, query_lens=None, *, num_heads=9, num_kv_heads=3, head_dim=64,
                       block_size=16, dtype=torch.float32, device="cpu", seed=0, share_first_block=False,
                       spare_blocks=3, pad_value=None):
    """A random paged KV cache and queries, laid out the way the engine would leave them.

    Each sequence's blocks are drawn from a shuffled pool, so block tables are non-contiguous and out
    of order. share_first_block: every sequence reuses sequence 0's first block (as after a fork or a
    prefix-cache hit). Unused table columns hold pad_value (default: num_blocks, out of range, so a
    kernel that reads past a sequence's blocks fails loudly in the simulator).

    Returns dict(q, k_cache, v_cache, block_tables, context_lens, query_lens):
        q [sum(query_lens) or num_seqs, num_heads, head_dim]; caches [num_blocks, block_size, kv, D]
    """
    gen = torch.Generator().manual_seed(seed)
    ctx = [int(c) for c in context_lens]
    blocks_per_seq = [max(1, math.ceil(c / block_size)) for c in ctx]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq)
    pad = num_blocks if pad_value is None else pad_value
    table = torch.full((len(ctx), width), pad, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        table[i, :n] = torch.tensor(pool[:n], dtype=torch.int32)
        pool = pool[n:]
        if share_first_block and i > 0:
            table[i, 0] = table[0, 0]
    num_tokens = len(ctx) if query_lens is None else int(sum(query_lens))

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    return {
        "q": randn(num_tokens, num_heads, head_dim).to(device),
        "k_cache": randn(num_blocks, block_size, num_kv_heads, head_dim).to(device),
        "v_cache": randn(num_blocks, block_size, num_kv_heads, head_dim).to(device),
        "block_tables": table.to(device),
        "context_lens": torch.tensor(ctx, dtype=torch.int32, device=device),
        "query_lens": None if query_lens is None else torch.tensor(query_lens, dtype=torch.int32, device=device),
    }


# Both sides compute in fp32; they differ only in summation order (fp32) and, for fp16, in the final
# rounding to fp16, at most about one fp16 ulp (2**-10 for outputs of magnitude below 2).
TOLERANCES = {torch.float32: dict(atol=2e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


def check_against_reference(batch: dict, **options) -> float:
    """Run the numba backend and the reference on one batch (from random_paged_batch); raise
    AssertionError unless they agree within TOLERANCES; return the largest absolute difference."""
    from minipaged.attention.numba_backend import paged_attention_numba
    from minipaged.attention.reference import paged_attention_reference

    args = (batch["q"], batch["k_cache"], batch["v_cache"], batch["block_tables"], batch["context_lens"])
    ref = paged_attention_reference(*args, query_lens=batch["query_lens"])
    out = paged_attention_numba(*args, query_lens=batch["query_lens"], **options)
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.device == ref.device
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCES[batch["q"].dtype])
    return float((out.float() - ref.float()).abs().max())


DEVICE_CONTEXTS = [1, 15, 16, 17, 1000, 4099]
DEVICE_GQA = {1: (8, 8), 3: (9, 3), 4: (32, 8)}  # ratio -> (query heads, KV heads)
DEVICE_KERNELS = [("auto", None), ("v1", None), ("v2", 2), ("v2", 7), ("v3", None), ("v3", 5)]
DEVICE_HEAD_DIMS = (64, 128)
# prefill over the cache, a prefill chunk, a speculative verification, a decode token, no query
DEVICE_MULTI = dict(context_lens=[300, 517, 64, 9, 2000], query_lens=[300, 100, 5, 1, 0], num_heads=32,
                    num_kv_heads=8, head_dim=128)


def device_check_cases():
    """(name, batch arguments, kernel options) of the on-GPU comparison: every kernel, GQA 1/3/4,
    head_dim 64/128, fp32/fp16, contexts around a block edge and long ones, shared blocks, and
    multi-token causal queries. test_gpu.py and `--check` both run exactly these."""
    for kernel, parts in DEVICE_KERNELS:
        for gqa, (heads, kv_heads) in DEVICE_GQA.items():
            for head_dim in DEVICE_HEAD_DIMS:
                for dtype in (torch.float32, torch.float16):
                    name = f"decode-{kernel}{parts or ''}-gqa{gqa}-d{head_dim}-{str(dtype)[6:]}"
                    yield name, dict(context_lens=DEVICE_CONTEXTS, num_heads=heads, num_kv_heads=kv_heads,
                                     head_dim=head_dim, dtype=dtype, share_first_block=True), \
                        dict(kernel=kernel, num_partitions=parts)
    for kernel, parts in [("v1", None), ("v2", 3), ("v3", None), ("v3", 3)]:
        for dtype in (torch.float32, torch.float16):
            yield f"multi-{kernel}{parts or ''}-{str(dtype)[6:]}", dict(**DEVICE_MULTI, dtype=dtype), \
                dict(kernel=kernel, num_partitions=parts)


def device_check(device="cuda") -> list[dict]:
    """Run device_check_cases on `device`; one result dict per case (ok, max_abs_err or error)."""
    results = []
    for name, batch_args, options in device_check_cases():
        batch = random_paged_batch(**batch_args, device=device)
        try:
            results.append({"case": name, "ok": True, "max_abs_err": check_against_reference(batch, **options)})
        except AssertionError as e:
            results.append({"case": name, "ok": False, "error": str(e)[:500]})
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.kernels.check",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_kernels: no CUDA GPU here. Without one, run `pytest tests/ch10_paged_attention_kernel` "
              "(numba's CUDA simulator).", file=sys.stderr)
        return 2
    results = device_check()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    for c in results:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['case']:32s} {c.get('max_abs_err', c.get('error'))}")
    failed = sum(not c["ok"] for c in results)
    print(f"{len(results) - failed} of {len(results)} cases match the reference")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
