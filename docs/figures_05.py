"""Regenerate the figures of chapter 05 (copy-on-write): the PNG files beside its README.

    .venv/bin/python docs/figures_05.py

Everything is drawn by minipaged's own policy, engine, simulator and plots; this script only picks
the scenarios, titles and file names, and prints the numbers the chapter quotes.

    cow_by_hand.png       three samples forked from a 6-token prompt (blocks of 4): after the fork,
                          the first write (copy on write), every sample written, one sample freed.
                          The notebook steps through the same calls.
    beam_refcounts.png    SmolLM2 beam search (width 4, 24 tokens, blocks of 4) over one chat prompt:
                          every block's reference count at every step.
    beam_cow_moment.png   one step of that search, as the engine sees it before the forward pass:
                          tables, reference counts, and the copies about to be made.
    memory_saved.png      the same runs as ``python -m minipaged.simulator --sharing``.

The real-model memory per step (beam_blocks.png) comes from
``python -m minipaged.bench.sharing --plot-dir chapters/05_copy-on-write`` (about six minutes).
Takes about a minute and a half on two cores (most of it the sharing simulation).
"""

from __future__ import annotations

import os

from minipaged import LLM
from minipaged.beam_search import BeamSearch, BeamSearchParams, PagedBeams
from minipaged.kv import SharedPolicy
from minipaged.plots import plot_block_sharing, plot_memory_saved, plot_refcount_map
from minipaged.simulator.cli import DEFAULTS
from minipaged.simulator.sharing_report import DEFAULT_REQUESTS, DEFAULT_SIZES, format_sharing_table, run_sharing_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "chapters", "05_copy-on-write")
BEAM_QUESTION = "Name a fruit that is yellow."


def by_hand() -> None:
    """The chapter's by-hand scenario."""
    p = SharedPolicy(12 * 4, block_size=4, max_model_len=32, watermark=0)
    p.allocate("A", 6, 8)
    p.append_slots("A", 6)  # the prompt, prefilled once: block 0 full, block 1 holds 2 tokens
    p.fork("A", "B")
    p.fork("A", "C")
    frames = [p.snapshot()]
    p.append_slots("B", 1)  # B writes into shared block 1: copy first
    frames.append(p.snapshot())
    print("B's first write asks for:", p.drain_copies())
    p.append_slots("A", 1)
    p.drain_copies()
    p.append_slots("C", 1)  # C is block 1's last holder by now: it writes in place
    frames.append(p.snapshot())
    print("C's write asks for:", p.drain_copies(), " tables:", p.snapshot()["tables"])
    p.free("A")
    frames.append(p.snapshot())
    titles = ["1. fork: B and C share A's blocks", "2. B appends: copy block 1, then write",
              "3. A and C append (C in place)", "4. A finishes: block 0 ref 2, block 3 free"]
    plot_block_sharing(frames, titles, path=os.path.join(OUT, "cow_by_hand.png"))


class RecordingBeams(PagedBeams):
    """PagedBeams that keeps a snapshot of the pool before each forward pass."""

    def __init__(self, engine):
        super().__init__(engine)
        self.frames = []

    def forward(self, work, width, temperature):
        self.frames.append(self.policy.snapshot())  # slots handed out, copies not made yet
        return super().forward(work, width, temperature)


def beam_figures() -> None:
    llm = LLM("smollm2-135m", kv_policy="shared", block_size=4, kv_capacity_tokens=1024, progress=False)
    prompt = llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": BEAM_QUESTION}]))
    backend = RecordingBeams(llm.engine)
    params = BeamSearchParams(beam_width=4, max_tokens=24)
    (out,) = BeamSearch(backend, params, llm.tokenizer.eos_token_id).run([prompt], llm.max_model_len, llm.tokenizer)
    print(f"beam search over a {len(prompt)}-token prompt:")
    for s in out.sequences:
        print(f"  {s.cum_logprob:8.3f}  {s.finish_reason:6}  {s.text!r}")
    stats = llm.engine.stats
    print(f"  forks {stats['forks']}, copies on write {stats['block_copies']}, "
          f"blocks in use {sum(stats['blocks_physical'])} vs unshared {sum(stats['blocks_logical'])} "
          f"(summed over steps): {100 * (1 - sum(stats['blocks_physical']) / sum(stats['blocks_logical'])):.1f}% saved")
    plot_refcount_map(backend.frames, path=os.path.join(OUT, "beam_refcounts.png"),
                      title=f"beam search, width 4, SmolLM2: reference counts ({len(prompt)}-token prompt, "
                            "blocks of 4)")
    def variety(i):  # a step with copies pending and blocks of several reference counts
        frame = backend.frames[i]
        return (len(frame["copies"]) > 0, len(set(frame["refs"].values())), len(frame["copies"]), -i)

    step = max(range(len(backend.frames)), key=variety)
    frame = backend.frames[step]
    frame = {**frame, "tables": {f"b{i}": t for i, t in enumerate(frame["tables"].values())},
             "tokens": {f"b{i}": n for i, n in enumerate(frame["tokens"].values())}}
    print(f"  step {step}: {len(frame['copies'])} copies pending, reference counts {frame['refs']}")
    plot_block_sharing([frame], [f"beam search, step {step}: four beams b0..b3 before the forward pass, "
                                 f"{len(frame['copies'])} copies on write pending"],
                       path=os.path.join(OUT, "beam_cow_moment.png"))


def memory_saved() -> None:
    rows = run_sharing_table(["alpaca", "sharegpt"], DEFAULT_SIZES, DEFAULT_SIZES, num_requests=DEFAULT_REQUESTS,
                             capacity=DEFAULTS["capacity"],
                             block_size=DEFAULTS["block_size"], max_model_len=DEFAULTS["max_model_len"],
                             arrival_rate=DEFAULTS["arrival_rate"], seed=DEFAULTS["seed"])
    print(format_sharing_table(rows))
    plot_memory_saved(rows, path=os.path.join(OUT, "memory_saved.png"))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    by_hand()
    beam_figures()
    memory_saved()
