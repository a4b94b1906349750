"""Two commits' decode speed, measured back to back: what one change to the forward pass is worth.

    python scripts/ab_decode.py BASE HEAD [--batches 1,32] [--rounds 3] [--steps 16] [--context 128]

Each commit is checked out into a temporary git worktree. Then, ``--rounds`` times, alternating
BASE, HEAD, BASE, HEAD, ..., one ``python -m minipaged bench decode --no-hf --json`` runs with that
worktree first on the import path (the weights come from this machine's cache). Every batch size
keeps, per commit, its best round's tokens/s (each round already takes its median step), and the
script prints HEAD / BASE. A change is worth keeping when that ratio is clearly above 1 at the batch
sizes it targets; the GEMM probes of every run are summarised, so a noisy run is visible.

Not handled: commits whose ``bench decode`` does not exist yet (it arrived with the speed work).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def commit_trees(commits: dict[str, str]):
    """{side: commit} -> {side: a temporary detached worktree of that commit}, removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        try:
            for side, commit in commits.items():
                trees[side] = Path(tmp) / side
                subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[side]), commit],
                               cwd=ROOT, check=True)
            yield trees
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def bench_once(tree: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "minipaged", "bench", "decode", "--no-hf", "--json", "--rounds", "1",
           "--batches", args.batches, "--steps", str(args.steps), "--context", str(args.context),
           "--model", args.model]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the commit before the change")
    p.add_argument("head", help="the commit with the change")
    p.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default: 1,32)")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the two commits (default: 3)")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per run (default: 16)")
    p.add_argument("--context", type=int, default=128, help="prompt tokens per sequence (default: 128)")
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    best: dict[str, dict[int, float]] = {"base": {}, "head": {}}
    noisy = 0
    with commit_trees({"base": args.base, "head": args.head}) as trees:
        for i in range(args.rounds):
            for side in ("base", "head"):
                r = bench_once(trees[side], args)
                noisy += not r["probe"]["reliable"]
                for row in r["rows"]:
                    b, tps = row["batch"], row["engine"]["tokens_per_s"]
                    best[side][b] = max(best[side].get(b, 0.0), tps)
                    print(f"round {i + 1} {side} ({getattr(args, side)}): batch {b}: {tps:.1f} tok/s",
                          file=sys.stderr)
    print(f"{'batch':>5} {'base tok/s':>10} {'head tok/s':>10} {'head/base':>9}")
    for b in sorted(best["base"]):
        print(f"{b:>5} {best['base'][b]:>10.1f} {best['head'][b]:>10.1f} {best['head'][b] / best['base'][b]:>8.2f}x")
    print(f"(best of {args.rounds} alternated rounds per commit; {args.base} vs {args.head})")
    if noisy:
        print(f"WARNING: {noisy} of {2 * args.rounds} runs saw another process on the cores (GEMM probe)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
