"""Does torch.compile speed up the decode step's thin matmuls? The measurement behind docs/pages/speed.md.

    python scripts/compile_probe.py [--autotune]

Builds 30 small modules with SmolLM2-135M's four projection shapes (random weights), runs them on one
row in eager mode, then compiles each with inductor and runs them again; it prints both times and
the compile time. ``--autotune`` turns on ``max_autotune`` with inductor's C++ GEMM kernels (which
need ``freezing``), as an engineer would try next.

Not handled: the attention and the paged cache (they stay eager; the engine does not compile).
"""

import argparse
import time

import torch
import torch.nn.functional as F

from minipaged.lab.bench.roofline import best_time

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]


class Projections(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(o, i), requires_grad=False)
                                         for o, i in SHAPES)

    def forward(self, x):  # chained so each output feeds the next projection's input width
        a = F.linear(x, self.ws[0])[:, :576]
        a = F.linear(a, self.ws[1])
        a = F.linear(a, self.ws[2])[:, :1536]
        return F.linear(a, self.ws[3])



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--autotune", action="store_true", help="max_autotune with inductor's C++ GEMM kernels")
    args = p.parse_args(argv)
    if args.autotune:
        import torch._inductor.config as cfg

        cfg.max_autotune, cfg.freezing, cfg.max_autotune_gemm_backends = True, True, "CPP,ATEN"
    torch.manual_seed(0)
    mods = [Projections().eval() for _ in range(30)]
    x = torch.randn(1, 576)

    def run(ms):
        y = x
        for m in ms:
            y = m(y) / 30
        return y

    with torch.no_grad():
        print(f"eager:    {best_time(lambda: run(mods)) * 1e3:.1f} ms")
        t0 = time.perf_counter()
        compiled = [torch.compile(m) for m in mods]
        run(compiled)
        took = time.perf_counter() - t0
        print(f"compiled: {best_time(lambda: run(compiled)) * 1e3:.1f} ms (compiling took {took:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
