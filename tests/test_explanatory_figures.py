"""The explanatory figures of chapters 06-11 (docs/figures_06_11.py, minipaged/lab/plots/explain_*.py):
each is drawn, and what it draws agrees with the engine's own books."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import numpy as np
import pytest

from minipaged.lab.plots import explain_kernel, explain_prefix, explain_serving, explain_steps

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location("figures_06_11", ROOT / "docs" / "figures_06_11.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes"


# ---- the script, and the chapters that show its figures -------------------------------------------


def test_script_draws_every_figure(tmp_path):
    script = load_script()
    script.main(["--out-dir", str(tmp_path)])
    for chapter, names in script.FIGURES.items():
        for name in names:
            assert_png(tmp_path / script.CHAPTERS[chapter] / name)


def test_every_chapter_links_its_figures():
    script = load_script()
    for chapter, folder in script.CHAPTERS.items():
        readme = (ROOT / folder / "README.md").read_text(encoding="utf-8")
        images = set(re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme))
        for name in script.FIGURES[chapter]:
            assert name in images, f"{folder}/README.md does not show {name}"
            assert (ROOT / folder / name).exists(), f"{folder}/{name} is linked but not committed"
        assert "python docs/figures_06_11.py" in readme, f"{folder}/README.md does not name the command"


# ---- chapter 06 -------------------------------------------------------------------------------------


def test_continuous_trace_preempts_and_recovers(tmp_path):
    trace = explain_steps.trace_continuous()
    assert trace.stats["preemptions"] >= 1
    preempted = [(s, r) for s, row in enumerate(trace.states) for r, state in row.items() if state == "preempted"]
    assert len(preempted) == trace.stats["preemptions"]
    for step, rid in preempted:
        later = [row[rid] for row in trace.states[step + 1:]]
        assert "prefill" in later, f"request {rid} was preempted and never prefilled again"
        assert later[-1] == "finished"
    assert len(trace.blocks_used) == len(trace.states)
    assert all(used <= trace.num_blocks for used in trace.blocks_used)
    assert max(trace.blocks_used) == trace.num_blocks  # it is the full pool that forces the preemption
    for rid in trace.requests:  # each request: waiting, then it runs, and the run starts with a prefill
        run = [row[rid] for row in trace.states if row[rid] not in ("", "waiting")]
        assert run[0] == "prefill"
    explain_steps.plot_request_states(trace, path=tmp_path / "a.png")
    assert_png(tmp_path / "a.png")


# ---- chapter 07 -------------------------------------------------------------------------------------


def test_hash_chain_matches_the_policy(tmp_path):
    from minipaged.kv.prefix_cache import next_key

    trace = explain_prefix.trace_prefix_cache()
    parent_of = {}
    for chain in trace.chains.values():
        parent = None
        for b in chain:
            assert b.key == next_key(parent, b.tokens), "a block's key is not (parent's hash, its tokens)"
            parent = b.key
            assert b.block is not None
            parent_of.setdefault(b.key, b.block)
            assert parent_of[b.key] == b.block, "one key, two blocks"
    a, b, c = (trace.chains[r] for r in "ABC")
    assert [x.hit for x in a] == [False] * len(a)  # the first request finds nothing
    assert [x.hit for x in b][:2] == [True, True] and not b[2].hit  # the system prompt only
    assert [x.hit for x in c] == [True, True, True]  # the system prompt and A's next block
    assert [x.block for x in c] == [x.block for x in a[:3]]
    assert trace.held["C"][:3] == [x.block for x in c]
    # the LRU list: cached blocks nobody holds, each still findable by its key
    held = {blk for table in trace.held.values() for blk in table}
    assert trace.lru and not set(trace.lru) & held
    keys = {x.key: x.block for chain in trace.chains.values() for x in chain}
    for block, key in trace.lru_keys.items():
        assert keys[key] == block
    explain_prefix.plot_hash_chain(trace, path=tmp_path / "b.png")
    assert_png(tmp_path / "b.png")


# ---- chapter 08 -------------------------------------------------------------------------------------


def test_chunks_stay_under_the_budget(tmp_path):
    trace = explain_steps.trace_chunked()
    assert any(kind == "chunk" for step in trace.steps for _, _, kind in step), "no prompt was chunked"
    for step in trace.steps:
        assert sum(n for _, n, _ in step) <= trace.budget
        kinds = [kind for _, _, kind in step]
        decodes = kinds.count("decode")
        assert kinds[:decodes] == ["decode"] * decodes, f"a chunk was planned before a decode: {step}"
        assert all(n == 1 for _, n, kind in step if kind == "decode")
    prompts = {rid: prompt for rid, _, prompt, _ in explain_steps.CHUNKED_REQUESTS}
    for rid, prompt in prompts.items():  # every prompt token computed once, in chunks ending with the last
        chunks = [(n, kind) for step in trace.steps for r, n, kind in step if r == rid and kind != "decode"]
        assert sum(n for n, _ in chunks) == prompt
        assert chunks[-1][1] == "last chunk"
    explain_steps.plot_chunk_packing(trace, path=tmp_path / "c.png")
    assert_png(tmp_path / "c.png")


# ---- chapter 09 -------------------------------------------------------------------------------------


def test_rollback_leaves_the_table_the_policy_has(tmp_path):
    trace = explain_steps.trace_speculative()
    before, drafted, after = trace.frames
    k, bs = explain_steps.SPEC_K, trace.block_size
    assert len(trace.draft) == k
    assert after.accepted == 2 and trace.emitted[:2] == trace.draft[:2] and trace.emitted[2] != trace.draft[2]
    assert drafted.num_tokens == before.num_tokens + 1 + k
    assert after.num_tokens == before.num_tokens + 1 + after.accepted
    assert len(after.blocks) == math.ceil(after.num_tokens / bs)
    assert drafted.blocks[:len(after.blocks)] == after.blocks and drafted.blocks[:len(before.blocks)] == before.blocks
    assert trace.freed_blocks == drafted.blocks[len(after.blocks):] and trace.freed_blocks
    assert trace.tokens[-len(trace.emitted):] == trace.emitted
    explain_steps.plot_spec_rollback(trace, path=tmp_path / "d.png")
    assert_png(tmp_path / "d.png")


# ---- chapter 10 -------------------------------------------------------------------------------------


def test_online_softmax_equals_plain_softmax(tmp_path):
    trace = explain_kernel.trace_kernel()
    assert trace.plan.kernel == "v2" and trace.grid == (2, 2, trace.plan.num_partitions)
    # the replica's values at the end of each partition are the kernel's own partials
    last = {}
    for step in trace.steps:
        last[step["partition"]] = step
    for p, step in last.items():
        assert step["m"] == pytest.approx(float(trace.part_max[p]), rel=1e-6)
        assert step["l"] == pytest.approx(float(trace.part_sum[p]), rel=1e-5)
    # merged, they give the plain softmax over the whole row, and the kernel's output is the reference's
    M = float(trace.part_max.max())
    assert M == pytest.approx(float(trace.scores.max()))
    merged = float((trace.part_sum * np.exp(trace.part_max - M)).sum())
    assert merged == pytest.approx(float(np.exp(trace.scores - trace.scores.max()).sum()), rel=1e-5)
    np.testing.assert_allclose(trace.out, trace.reference, atol=1e-5)
    explain_kernel.plot_kernel_grid(trace, path=tmp_path / "e.png")
    explain_kernel.plot_online_softmax(trace, path=tmp_path / "f.png")
    assert_png(tmp_path / "e.png")
    assert_png(tmp_path / "f.png")


def test_online_softmax_steps_by_hand():
    scores = np.array([1.0, 3.0, 2.0, 0.0, 5.0], dtype=np.float32)
    steps = explain_kernel.online_softmax_steps(scores, tile_tokens=2, partition_tokens=5)
    assert [(s["start"], s["end"]) for s in steps] == [(0, 2), (2, 4), (4, 5)]
    assert [s["m"] for s in steps] == [3.0, 3.0, 5.0]
    assert steps[1]["alpha"] == 1.0 and steps[2]["alpha"] == pytest.approx(math.exp(-2.0))
    assert steps[-1]["l"] == pytest.approx(float(np.exp(scores - 5.0).sum()), rel=1e-6)


# ---- chapter 11 -------------------------------------------------------------------------------------


def test_server_trace_hands_off_in_order(tmp_path):
    trace = explain_serving.trace_server()
    assert len(trace.requests) == len(explain_serving.SERVER_PROMPTS)
    steps = list(zip(trace.times("step_start"), trace.times("step_end")))
    assert steps and all(a <= b for a, b in steps)
    for r in trace.requests:
        queued, added = trace.times("queued", r), trace.times("added", r)
        puts, gots, sent = trace.times("put", r), trace.times("got", r), trace.times("sent", r)
        assert len(queued) == len(added) == 1 and queued[0] <= added[0]
        assert len(puts) == len(gots) == explain_serving.SERVER_MAX_TOKENS  # one delta per token (ignore_eos)
        assert all(p <= g for p, g in zip(puts, gots)) and added[0] <= puts[0]
        assert sent and sent[-1] >= puts[-1]  # the last event follows the last output
    # the engine thread's events, in the order it made them: each output is put after a step has ended
    last = None
    for event, _, _ in trace.events:
        if event in ("step_start", "step_end"):
            last = event
        elif event == "put":
            assert last == "step_end", "an output was put on a queue during a step"
    explain_serving.plot_server_swimlanes(trace, path=tmp_path / "g.png")
    assert_png(tmp_path / "g.png")


def test_trace_hook_does_not_change_outputs():
    import asyncio

    from minipaged.async_engine import AsyncLLMEngine
    from minipaged.config import EngineArgs
    from minipaged.sampling_params import SamplingParams

    engine = AsyncLLMEngine(EngineArgs(model="tiny", max_model_len=64, kv_capacity_tokens=512))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    async def run(request_id):
        return [out.outputs[0].token_ids async for out in engine.generate("abc", params, request_id=request_id)]

    try:
        plain = asyncio.run(run("plain"))
        events = []
        engine.trace = lambda event, request_id, seconds: events.append((event, request_id))
        traced = asyncio.run(run("traced"))
    finally:
        engine.shutdown()
    assert traced == plain
    mine = [e for e, r in events if r == "traced"]
    assert mine[:2] == ["queued", "added"] and mine.count("put") == mine.count("got") == len(traced)
    assert ("step_start", None) in events


# ---- chapter 00 (docs/figures_00.py) ----------------------------------------------------------------


def test_prefill_decode_trace_agrees_with_the_engines_counts(tmp_path):
    from minipaged.lab.plots import explain_cache

    cached = explain_cache.trace_generate(prompt_len=6, new_tokens=6)
    recomputed = explain_cache.trace_generate(prompt_len=6, new_tokens=6, use_cache=False)
    # with the cache: the prompt in one pass, then one position a pass, each after the last
    assert [p.computed for p in cached.passes] == [6, 1, 1, 1, 1, 1]
    assert [p.start for p in cached.passes] == [0, 6, 7, 8, 9, 10]
    assert [p.cached_after for p in cached.passes] == [6, 7, 8, 9, 10, 11]
    # without it: every pass starts again from position 0
    assert [p.computed for p in recomputed.passes] == [6, 7, 8, 9, 10, 11]
    for trace in (cached, recomputed):
        assert sum(p.computed for p in trace.passes) == trace.tokens_computed  # the engine's own count
    spec = importlib.util.spec_from_file_location("figures_00", ROOT / "docs" / "figures_00.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--out-dir", str(tmp_path)])
    assert_png(tmp_path / script.CHAPTER / script.FIGURE)
    readme = (ROOT / script.CHAPTER / "README.md").read_text(encoding="utf-8")
    assert f"]({script.FIGURE})" in readme and "python docs/figures_00.py" in readme
