"""Draw the explanatory figures of chapters 06-11: the PNG files beside each chapter's README.

    .venv/bin/python docs/figures_06_11.py                  every chapter, beside its README
    .venv/bin/python docs/figures_06_11.py --chapter 7      one chapter
    .venv/bin/python docs/figures_06_11.py --out-dir DIR    under DIR/chapters/NN_slug/ instead
                                                            (what docs/build.py does for the site)

Every picture is drawn from the real engine's state or trace of a small, fixed run (no model but
the tiny one, so the whole script takes seconds); the drawing code is in minipaged/lab/plots/explain_*.py,
and this script only picks the file names:

    06  scheduler_steps.png   six requests through chapter 06's scheduler (EngineCore + SyntheticRunner,
                              a pool of 12 blocks of 4): each request's state at each step (waiting,
                              prefill, decode, preempted, finished) and the blocks held; request E is
                              preempted when the pool runs dry and prefilled again
    07  hash_chain.png        three requests sharing an 8-token system prompt (PrefixCachingPolicy,
                              blocks of 4): each full block's key (parent's hash, tokens), the hits,
                              and the LRU list of cached blocks nobody holds
    08  chunk_packing.png     chapter 08's scheduler with a budget of 16 tokens: per step, the decodes
                              first, then the prompt chunks, under the budget line
    09  spec_rollback.png     one request through chapter 09's scheduler with a draft of 4 that is wrong
                              after its second guess: the block table before the step, with the
                              draft's slots, and after verification (2 kept, 2 slots given back)
    10  kernel_grid.png       the real plan_launch for a small decode batch (kernel v2, 2 partitions):
                              the grid, and how thread block (0, 0, p) walks the block table in tiles
    10  online_softmax.png    the same input: one row's running max and sum tile by tile, and v2's merge
                              of the partitions (values from the kernel run in numba's CUDA simulator)
    11  server_swimlanes.png  three streaming requests through the real FastAPI app and AsyncLLMEngine
                              (tiny model): arrival, queueing, engine steps, outputs put on each
                              request's queue, SSE events sent. Wall-clock times differ per run.
"""

from __future__ import annotations

import argparse
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHAPTERS = {
    6: "chapters/06_continuous-batching",
    7: "chapters/07_prefix-caching",
    8: "chapters/08_chunked-prefill",
    9: "chapters/09_speculative-decoding",
    10: "chapters/10_paged-attention-kernel",
    11: "chapters/11_serving",
}
FIGURES = {  # chapter -> the PNG files this script writes there
    6: ["scheduler_steps.png"],
    7: ["hash_chain.png"],
    8: ["chunk_packing.png"],
    9: ["spec_rollback.png"],
    10: ["kernel_grid.png", "online_softmax.png"],
    11: ["server_swimlanes.png"],
}


def draw(chapter: int, folder: str) -> list[str]:
    """Draw one chapter's figures into folder; returns the paths written."""
    from minipaged.lab.plots import explain_kernel, explain_prefix, explain_serving, explain_steps

    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, name) for name in FIGURES[chapter]]
    if chapter == 6:
        trace = explain_steps.trace_continuous()
        explain_steps.plot_request_states(trace, path=paths[0])
        print(f"06: {len(trace.states)} steps, {trace.stats['preemptions']} preemption(s)")
    elif chapter == 7:
        trace = explain_prefix.trace_prefix_cache()
        explain_prefix.plot_hash_chain(trace, path=paths[0])
        print(f"07: hits per request {[sum(b.hit for b in c) for c in trace.chains.values()]}, LRU list {trace.lru}")
    elif chapter == 8:
        trace = explain_steps.trace_chunked()
        explain_steps.plot_chunk_packing(trace, path=paths[0])
        print(f"08: tokens per step {[sum(n for _, n, _ in s) for s in trace.steps]} (budget {trace.budget})")
    elif chapter == 9:
        trace = explain_steps.trace_speculative()
        explain_steps.plot_spec_rollback(trace, path=paths[0])
        print(f"09: draft {trace.draft}, emitted {trace.emitted}, blocks given back {trace.freed_blocks}")
    elif chapter == 10:
        trace = explain_kernel.trace_kernel()
        explain_kernel.plot_kernel_grid(trace, path=paths[0])
        explain_kernel.plot_online_softmax(trace, path=paths[1])
        print(f"10: {trace.plan}, grid {trace.grid}")
    elif chapter == 11:
        trace = explain_serving.trace_server()
        explain_serving.plot_server_swimlanes(trace, path=paths[0])
        print(f"11: {len(trace.requests)} streams, {len(trace.times('step_start'))} engine steps")
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/figures_06_11.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", type=int, action="append", choices=sorted(CHAPTERS),
                        help="draw only this chapter's figures (repeatable)")
    parser.add_argument("--out-dir", default=ROOT,
                        help="write under OUT_DIR/chapters/NN_slug/ (default: this repository)")
    args = parser.parse_args(argv)
    for chapter in args.chapter or sorted(CHAPTERS):
        t0 = time.perf_counter()
        for path in draw(chapter, os.path.join(args.out_dir, CHAPTERS[chapter])):
            print(f"    saved {os.path.relpath(path, args.out_dir)} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
