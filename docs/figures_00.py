"""Draw chapter 00's explanatory figure: prefill, decode and the KV cache growing.

    .venv/bin/python docs/figures_00.py                  beside chapter 00's README
    .venv/bin/python docs/figures_00.py --out-dir DIR    under DIR/chapters/00_the-kv-cache/ instead
                                                         (what docs/build.py does for the site)

    00  prefill_decode.png   chapter 00's NaiveEngine on the tiny model, a 6-token prompt and 6 new
                             tokens: which positions each forward pass computes with the cache (and how
                             many without it), and the bytes SmolLM2-135M's cache would hold after each

The drawing is minipaged/lab/plots/explain_cache.py; the run takes a second.
"""

from __future__ import annotations

import argparse
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAPTER = os.path.join("chapters", "00_the-kv-cache")
FIGURE = "prefill_decode.png"


def main(argv=None) -> int:
    from minipaged.lab.plots.explain_cache import plot_prefill_decode, trace_generate

    parser = argparse.ArgumentParser(prog="python docs/figures_00.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=ROOT, help="write under OUT_DIR/chapters/00_the-kv-cache/")
    args = parser.parse_args(argv)
    folder = os.path.join(args.out_dir, CHAPTER)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, FIGURE)
    plot_prefill_decode(trace_generate(), trace_generate(use_cache=False), path=path)
    print(f"    saved {os.path.relpath(path, args.out_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
