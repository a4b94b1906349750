"""Two commits' whole-request throughput, back to back: what a change to the engine's structure costs.

    python scripts/ab_throughput.py BASE HEAD [--workloads readme,support] [--rounds 3]

``bench throughput`` measures the default ``LLM()`` against HF Transformers; this script measures
the engine's side only, for two commits. Each commit is checked out into a temporary git worktree
(``ab_decode.commit_trees``). Then, ``--rounds`` times, alternating BASE, HEAD, BASE, HEAD, ..., a
fresh Python process with that worktree first on the import path builds ``LLM("smollm2-135m")`` (the
weights come from this machine's cache), warms it up, and runs each workload of ``bench throughput``
once (its chat prompts, greedy, ``max_tokens`` as there). Per commit and workload the best round's
output tokens/s is kept, and the script prints HEAD / BASE and whether the greedy outputs are the
same token for token. Run it alone on the machine: a second process on the cores moves every figure.

Not handled: commits older than ``bench throughput`` (it arrived with the speed work).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ab_decode import commit_trees  # scripts/ is first on the path when a script runs

# What one round runs, in a process whose import path starts with the commit's worktree.
ROUND = """
import json, sys
from minipaged import LLM
from minipaged.lab.bench.throughput import chat_prompts, run_minipaged

llm = LLM("smollm2-135m", progress=False)
out = {}
for name in sys.argv[1].split(","):
    prompts, max_tokens = chat_prompts(llm.get_tokenizer(), name)
    run_minipaged(llm, prompts[:4], 4)  # warm-up: first calls build kernels and caches
    r = run_minipaged(llm, prompts, max_tokens)
    out[name] = {"seconds": r["seconds"], "output_tokens": r["output_tokens"], "tokens": r["tokens"]}
print(json.dumps(out))
"""


def round_once(tree: Path, workloads: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", ROUND, workloads], cwd=tree, env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="the commit before the change")
    p.add_argument("head", help="the commit with the change")
    p.add_argument("--workloads", default="readme,support", help="comma-separated (default: readme,support)")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the two commits (default: 3)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    best: dict[str, dict[str, float]] = {"base": {}, "head": {}}
    tokens: dict[str, dict[str, list]] = {"base": {}, "head": {}}
    with commit_trees({"base": args.base, "head": args.head}) as trees:
        for r in range(args.rounds):
            for side in ("base", "head"):
                result = round_once(trees[side], args.workloads)
                for name, w in result.items():
                    rate = w["output_tokens"] / w["seconds"]
                    best[side][name] = max(best[side].get(name, 0.0), rate)
                    tokens[side][name] = w["tokens"]
                    print(f"round {r + 1} {side} {name}: {rate:.1f} output tok/s ({w['seconds']:.2f} s)",
                          file=sys.stderr, flush=True)
    print(f"{'workload':10s} {'base tok/s':>11s} {'head tok/s':>11s} {'head/base':>10s}  greedy outputs")
    for name in args.workloads.split(","):
        b, h = best["base"][name], best["head"][name]
        same = "same" if tokens["base"][name] == tokens["head"][name] else "DIFFER"
        print(f"{name:10s} {b:11.1f} {h:11.1f} {h / b:10.3f}  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
