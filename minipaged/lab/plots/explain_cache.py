"""Chapter 00's picture: prefill, then decode, and the KV cache growing, drawn from a real run.

    trace_generate(prompt_len, new_tokens, use_cache)   runs chapter 00's NaiveEngine on the tiny
                                                        random model and records every forward pass:
                                                        the positions it computed and the tokens cached
                                                        after it
    plot_prefill_decode(cached, recomputed)             one row per forward pass, one column per token
                                                        position: computed in this pass, or read from the
                                                        cache; beside it, the bytes SmolLM2-135M's cache
                                                        would hold after each pass

The engine is wrapped, not changed: the trace records what ``NaiveEngine._forward`` was asked to do and
asks the cache how many tokens it holds afterwards. The tests check the trace against the engine's
own counters (``stats["tokens_computed"]``), so the figure cannot drift from the code.

Not handled: a batch of several sequences (chapter 00's engine runs one at a time).
"""
from __future__ import annotations

from dataclasses import dataclass

from minipaged.lab.plots.style import save


@dataclass
class Pass:
    start: int  # first position computed in this pass
    computed: int  # positions computed (fed through the model) in this pass
    cached_after: int  # tokens whose K/V the cache holds after the pass (0 without a cache)


@dataclass
class Trace:
    prompt_len: int
    passes: list[Pass]
    tokens_computed: int  # the engine's own count, for the tests


def trace_generate(prompt_len: int = 6, new_tokens: int = 6, use_cache: bool = True) -> Trace:
    import torch

    from minipaged.engine import NaiveEngine
    from minipaged.model.config import TINY
    from minipaged.model.random import ByteTokenizer, random_model
    from minipaged.request import Sequence
    from minipaged.sampling import make_generator
    from minipaged.sampling_params import SamplingParams

    tok = ByteTokenizer()
    engine = NaiveEngine(random_model(TINY, seed=0), tok, use_cache=use_cache)
    passes: list[Pass] = []
    forward = engine._forward

    def recording(ids, start_pos, kv):
        out = forward(ids, start_pos, kv)
        passes.append(Pass(start_pos, len(ids), getattr(kv, "num_tokens", 0)))
        return out

    engine._forward = recording
    ids = list(range(65, 65 + prompt_len))
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    with torch.no_grad():
        engine.run_sequence(Sequence(0, ids, params, tok.eos_token_id, TINY.max_model_len), make_generator(0))
    return Trace(prompt_len, passes, engine.stats["tokens_computed"])


def plot_prefill_decode(cached: Trace, recomputed: Trace | None = None, bytes_per_token: int | None = None,
                        path=None):
    """Left: which positions each pass computes with the cache (and, faded, without it); right: the
    cache's size after each pass, in KB of SmolLM2-135M's K and V (46,080 bytes a token in fp32)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    if bytes_per_token is None:
        from minipaged.lab.roofline import kv_bytes_per_token
        from minipaged.model.config import SMOLLM2_135M
        bytes_per_token = kv_bytes_per_token(SMOLLM2_135M, 4)
    rows = len(cached.passes)
    width = cached.passes[-1].start + cached.passes[-1].computed
    fig = Figure(figsize=(10, 0.42 * rows + 1.6))
    grid, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1.3]})
    for r, p in enumerate(cached.passes):
        y = rows - 1 - r
        for pos in range(width):
            if p.start <= pos < p.start + p.computed:
                colour = "#1565c0" if r == 0 else "#ef6c00"
            elif pos < p.start:
                colour = "#bbdefb"
            else:
                continue
            grid.add_patch(Rectangle((pos, y + 0.1), 0.9, 0.8, color=colour, lw=0))
        if recomputed is not None and r < len(recomputed.passes):
            q = recomputed.passes[r]
            grid.text(width + 0.3, y + 0.5, f"without a cache: all {q.computed}", va="center", fontsize=8,
                      color="#757575")
        grid.text(-0.4, y + 0.5, "prefill" if r == 0 else f"decode {r}", ha="right", va="center", fontsize=8)
    grid.axvline(cached.prompt_len - 0.05, color="#424242", lw=0.8, ls="--")
    grid.text(cached.prompt_len / 2, rows + 0.2, "prompt", ha="center", fontsize=8)
    grid.text(cached.prompt_len + (width - cached.prompt_len) / 2, rows + 0.2, "generated", ha="center", fontsize=8)
    grid.set_xlim(-3.2, width + (4.5 if recomputed is not None else 0.5))
    grid.set_ylim(0, rows + 0.7)
    grid.set_axis_off()
    grid.legend(handles=[Rectangle((0, 0), 1, 1, color="#1565c0", label="computed in the prefill pass"),
                         Rectangle((0, 0), 1, 1, color="#ef6c00", label="computed in a decode pass"),
                         Rectangle((0, 0), 1, 1, color="#bbdefb", label="read from the KV cache")],
                loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    grid.set_title("one forward pass per row: token positions computed, and read from the cache", fontsize=10)
    kb = [p.cached_after * bytes_per_token / 1e3 for p in cached.passes]
    bars.barh(range(rows - 1, -1, -1), kb, color="#90caf9", height=0.7)
    for r, value in enumerate(kb):
        bars.text(value, rows - 1 - r, f" {cached.passes[r].cached_after} tok", va="center", fontsize=7)
    bars.set_ylim(-0.5, rows + 0.2)
    bars.set_yticks([])
    bars.set_xlabel("KV cache after the pass, KB (SmolLM2-135M, fp32)", fontsize=8)
    bars.spines[["top", "right", "left"]].set_visible(False)
    bars.set_title("the cache grows one token a step", fontsize=10)
    return save(fig, path)
