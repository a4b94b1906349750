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

memory_saved.png comes from ``python -m minipaged simulate --sharing --plot-dir chapters/05_copy-on-write``
and the real-model memory per step (beam_blocks.png) from
``python -m minipaged bench sharing --plot-dir chapters/05_copy-on-write`` (about a minute and a half).
"""

from __future__ import annotations

import os

from minipaged import LLM
from minipaged.kv import SharedPolicy
from minipaged.lab.plots import plot_block_sharing, plot_refcount_map
from minipaged.metrics_reader import find
from minipaged.sampling_params import BeamSearchParams

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


def record_frames(llm) -> list[dict]:
    """Make llm's model runner keep a snapshot of the pool before each forward pass (slots handed
    out, copies not made yet), in the list returned; ``del llm.engine.runner.execute`` stops it."""
    runner, frames = llm.engine.runner, []
    execute = runner.execute

    def recording_execute(plan):
        frames.append(llm.engine.policy.snapshot())
        return execute(plan)

    runner.execute = recording_execute
    return frames


def beam_figures() -> None:
    llm = LLM("smollm2-135m", kv_policy="shared", block_size=4, kv_capacity_tokens=1024, attention_backend="torch",
              progress=False)
    prompt = llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": BEAM_QUESTION}]))
    frames = record_frames(llm)
    with llm.engine.metrics.steps.recording() as rec:  # one record per forward pass
        (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=4, max_tokens=24))
    del llm.engine.runner.execute
    print(f"beam search over a {len(prompt)}-token prompt:")
    for s in out.sequences:
        print(f"  {s.cum_logprob:8.3f}  {s.finish_reason:6}  {s.text!r}")
    physical, logical = sum(rec.series("blocks_physical")), sum(rec.series("blocks_logical"))
    print(f"  forks {llm.engine.stats['forks']}, copies on write {find(llm.get_metrics(), 'block_copies').value}, "
          f"blocks in use {physical} vs unshared {logical} (summed over steps): "
          f"{100 * (1 - physical / logical):.1f}% saved")
    plot_refcount_map(frames, path=os.path.join(OUT, "beam_refcounts.png"),
                      title=f"beam search, width 4, SmolLM2: reference counts ({len(prompt)}-token prompt, "
                            "blocks of 4)")
    def variety(i):  # a step with copies pending and blocks of several reference counts
        frame = frames[i]
        return (len(frame["copies"]) > 0, len(set(frame["refs"].values())), len(frame["copies"]), -i)

    step = max(range(len(frames)), key=variety)
    frame = frames[step]
    frame = {**frame, "tables": {f"b{i}": t for i, t in enumerate(frame["tables"].values())},
             "tokens": {f"b{i}": n for i, n in enumerate(frame["tokens"].values())}}
    print(f"  step {step}: {len(frame['copies'])} copies pending, reference counts {frame['refs']}")
    plot_block_sharing([frame], [f"beam search, step {step}: four beams b0..b3 before the forward pass, "
                                 f"{len(frame['copies'])} copies on write pending"],
                       path=os.path.join(OUT, "beam_cow_moment.png"))


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    by_hand()
    beam_figures()
