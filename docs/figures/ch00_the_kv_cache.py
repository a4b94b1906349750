"""Chapter 00's figure: the roofline of this CPU, with the measured decode steps on it.

    python -m minipaged bench cache --json    > chapters/00_the-kv-cache/measured/cache.json
    python -m minipaged bench roofline --json > chapters/00_the-kv-cache/measured/roofline.json
    python docs/figures/ch00_the_kv_cache.py  # -> chapters/00_the-kv-cache/roofline.png

The first two commands measure (a few minutes on a 2-core CPU); this script only draws what they
saved, so the figure and the numbers quoted in the chapter come from the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

CHAPTER = Path(__file__).resolve().parent.parent.parent / "chapters" / "00_the-kv-cache"


def draw(roofline: dict, out: Path) -> None:
    rows = roofline["rows"]
    peak, bandwidth, ridge = roofline["peak_gflops"], roofline["bandwidth_gbytes_s"], roofline["ridge_flop_per_byte"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))

    lo = min(0.1, min(r["flop_per_byte"] for r in rows) / 2)
    hi = max(100.0, max(r["flop_per_byte"] for r in rows) * 2)
    intensity = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax1.loglog(intensity, np.minimum(peak, bandwidth * intensity), color="black",
               label=f"roof: {peak:.0f} GFLOP/s peak, {bandwidth:.0f} GB/s")
    ax1.axvline(ridge, color="gray", ls="--", lw=1, label=f"ridge point {ridge:.1f} FLOP/B")
    for r in rows:
        ax1.plot(r["flop_per_byte"], r["achieved_gflops"], "o", ms=7, label=f"decode step, batch {r['batch']}")
    ax1.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax1.set_ylabel("achieved GFLOP/s")
    ax1.set_title(f"{roofline['model']}: decode steps on this CPU's roofline")
    ax1.legend(fontsize=8, loc="lower right")
    ax1.grid(True, which="major", alpha=0.3)

    batches = [r["batch"] for r in rows]
    ax2.plot(batches, [r["tokens_per_s"] for r in rows], "o-", color="tab:blue")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(batches, [str(b) for b in batches])
    ax2.set_xlabel("batch (sequences decoded in one step)")
    ax2.set_ylabel("decode tokens/s", color="tab:blue")
    ax2.set_title(f"one decode step, {roofline['context']} cached tokens per sequence")
    ax2.grid(True, alpha=0.3)
    twin = ax2.twinx()
    twin.plot(batches, [r["step_ms"] for r in rows], "s--", color="tab:orange")
    twin.set_ylabel("ms per step", color="tab:orange")

    fig.suptitle(f"measured with `python -m minipaged bench roofline` ({roofline['threads']} CPU threads)",
                 fontsize=9, y=0.02, va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--roofline", type=Path, default=CHAPTER / "measured" / "roofline.json",
                   help="output of `python -m minipaged bench roofline --json`")
    p.add_argument("--out", type=Path, default=CHAPTER / "roofline.png")
    args = p.parse_args(argv)
    draw(json.loads(args.roofline.read_text(encoding="utf-8")), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
