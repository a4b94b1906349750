"""Why model/llama.py's Linear splits thin products over the threads, and where its compiled product
stops: the measurements behind them.

    python scripts/thin_matmul.py [--rows 1,8,24,32,128,512,1024]

For SmolLM2-135M's shapes (30 layers of qkv, o, gate-up and down projections, with random weights
far larger than the caches, plus the vocabulary projection), it times, alternated and best of
several tries: the four projections of all 30 layers as plain ``F.linear`` with two threads and with
one, the same weights summed (a read-bandwidth yardstick), and, at each row count, ``F.linear``
against one ``torch.bmm`` over the weight's two row blocks (``Linear``'s blocked product) and against
the compiled product the engine uses for up to ``Linear.PACKED_ROWS`` rows (``packed_linear`` on the
weight in panels, model/kernels.py), when it is built.

Not handled: other models' shapes; more than two threads (the course's machine has two cores).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from minipaged.lab.bench.roofline import best_time
from minipaged.model import kernels
from minipaged.model.llama import Linear

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [out, in] of one layer's projections
VOCAB = (49152, 576)



def split_linear(w):
    """model/llama.py's Linear holding `w`, its row cut-off lifted so every row count takes the blocked product."""
    layer = Linear(w.shape[1], w.shape[0])
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.SPLIT_ROWS = 1 << 30
    return layer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,8,24,32,128,512,1024",
                   help="row counts to compare (default: 1,8,24,32,128,512,1024)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    layers = [[torch.randn(o, i) for o, i in SHAPES] for _ in range(30)]
    vocab = torch.randn(*VOCAB)
    split_layers = [[split_linear(w) for w in layer] for layer in layers]
    split_vocab = split_linear(vocab)
    nbytes = sum(w.numel() * 4 for layer in layers for w in layer)
    one = {i: torch.randn(1, i) for _, i in SHAPES}
    before = torch.get_num_threads()
    compiled = kernels.ops().packed_linear if kernels.ops() is not None else None
    with torch.inference_mode():
        print(f"the 30 layers' projections at one row ({nbytes / 1e6:.0f} MB of weights):")
        for threads in (2, 1):
            torch.set_num_threads(threads)
            t = best_time(lambda: [F.linear(one[w.shape[1]], w) for layer in layers for w in layer])
            print(f"  F.linear, {threads} thread(s): {t * 1e3:6.1f} ms  {nbytes / t / 1e9:5.1f} GB/s")
        torch.set_num_threads(2)
        t = best_time(lambda: [w.sum() for layer in layers for w in layer])
        print(f"  summing the same weights, 2 threads: {t * 1e3:6.1f} ms  {nbytes / t / 1e9:5.1f} GB/s")
        print("F.linear against the blocked product (2 threads), best of alternated tries:")
        for rows in [int(r) for r in args.rows.split(",")]:
            xs = {i: torch.randn(rows, i) for _, i in SHAPES}
            xv = torch.randn(rows, VOCAB[1])
            cases = {"layers F.linear": lambda xs=xs: [F.linear(xs[w.shape[1]], w) for layer in layers for w in layer],
                     "layers blocked": lambda xs=xs: [m(xs[m.in_features]) for layer in split_layers for m in layer],
                     "vocab F.linear": lambda xv=xv: F.linear(xv, vocab),
                     "vocab blocked": lambda xv=xv: split_vocab(xv)}
            if compiled is not None:
                cases["layers compiled"] = lambda xs=xs: [compiled(xs[m.in_features], m.packed(), m.out_features)
                                                          for layer in split_layers for m in layer]
                cases["vocab compiled"] = lambda xv=xv: compiled(xv, split_vocab.packed(), VOCAB[0])
            got = {k: float("inf") for k in cases}
            for _ in range(2):
                for k, fn in cases.items():
                    got[k] = min(got[k], best_time(fn, 5))
            print(f"  {rows:4} rows: " + "  ".join(f"{k} {v * 1e3:7.2f} ms" for k, v in got.items()))
            if rows == 1:
                rates = {k: nbytes / got[f"layers {k}"] / 1e9 for k in ("blocked", "compiled") if f"layers {k}" in got}
                print("         (one row: the 30 layers stream at "
                      + ", ".join(f"{v:.1f} GB/s {k}" for k, v in rates.items()) + ")")
    torch.set_num_threads(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
