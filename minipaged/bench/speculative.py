"""Chapter 09's benchmark: decoding with and without prompt-lookup speculation, on the real model.

    python -m minipaged bench speculative [--k 2 4 8] [--max-tokens 64] [--json]

Two kinds of chat request, greedy: "copy" requests whose answer repeats much of the prompt (repeat a
list, fix a typo in code, rewrite a sentence), where prompt lookup should guess well, and "open"
questions, where it mostly has nothing to copy. The same engine (on-demand blocks, the batched
attention) serves them with speculation off and with ``num_speculative_tokens`` = each of --k:

    one at a time   each request alone (the latency a single user sees); for each request the
                    systems take turns, in an order that rotates, so the machine's noise falls on all
    batched         all requests of a kind together (what a busy server sees)

Printed per system and kind: output tokens, forward passes, tokens per pass, the share of guessed
tokens accepted, wall time and the speedup over no speculation; the outputs must be identical. With
--plot-dir it draws spec_speedup.png. Not measured: sampling (only greedy requests speculate here),
a draft model.
"""

from __future__ import annotations

import json
import os
import time

COPY = [
    "Repeat this list exactly: apples, pears, plums, figs, dates, limes, cherries, grapes.",
    "Rewrite this sentence in the past tense: The library opens at nine, the staff unlock the doors, and "
    "the readers walk in.",
    "Fix the typo in this code and print the corrected code:\ndef add(a, b):\n    retrun a + b\n\nprint(add(2, 3))",
    "Repeat these steps exactly: open the lid, pour the water, wait two minutes, stir, and close the lid.",
    "Fix the spelling in this sentence: The quick brwn fox jumsp over the lazy dgo near the river bank.",
    "Rename the variable x to total in this code and print it:\nx = 0\nfor n in range(10):\n    x = x + n\nprint(x)",
]
OPEN = [
    "What is the capital of France?",
    "Write a haiku about memory.",
    "Give me three tips for a job interview.",
    "Why is the sky blue?",
    "Suggest a name for a small bakery.",
    "Explain what a library card is for.",
]


def _engine(model, k, attention):
    from minipaged import LLM

    spec = None if k == 0 else {"method": "ngram", "num_speculative_tokens": k}
    return LLM(model, kv_policy="on_demand", speculative_config=spec, attention_backend=attention, progress=False)


def _counters(llm) -> tuple[int, int, int]:
    s = llm.engine.stats
    return s["forward_passes"], s.get("spec_draft_tokens", 0), s["spec_accepted_tokens"]


def _serve(llm, chats, params) -> dict:
    before = _counters(llm)
    start = time.perf_counter()
    outs = llm.chat(chats, params, use_tqdm=False)
    wall = time.perf_counter() - start
    passes, drafted, accepted = (b - a for a, b in zip(before, _counters(llm)))
    return {"wall_s": wall, "passes": passes, "drafted": drafted, "accepted": accepted,
            "tokens": [o.outputs[0].token_ids for o in outs]}


def _total(runs: list[dict]) -> dict:
    total = {key: sum(r[key] for r in runs) for key in ("wall_s", "passes", "drafted", "accepted")}
    total["tokens"] = [t for r in runs for t in r["tokens"]]
    total["output_tokens"] = sum(len(t) for t in total["tokens"])
    total["tokens_per_pass"] = total["output_tokens"] / total["passes"]
    total["acceptance"] = total["accepted"] / total["drafted"] if total["drafted"] else None
    return total


def run(model="smollm2-135m", ks=(2, 4, 8), max_tokens=64, attention="torch_batched", progress=True,
        plot_dir=None) -> dict:
    from tqdm import tqdm

    from minipaged import SamplingParams

    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks={list(ks)} must be integers >= 1 (the numbers of guessed tokens to compare)")
    systems = {0: _engine(model, 0, attention), **{k: _engine(model, k, attention) for k in ks}}
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    for llm in systems.values():  # first-call overheads, not timed
        llm.generate(["Warm-up."], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    kinds = {"copy": COPY, "open": OPEN}
    alone = {kind: {k: [] for k in systems} for kind in kinds}
    todo = [(kind, i) for kind in kinds for i in range(len(kinds[kind]))]
    for turn, (kind, i) in enumerate(tqdm(todo, desc="bench speculative", unit="prompt", disable=not progress)):
        order = list(systems)
        order = order[turn % len(order):] + order[:turn % len(order)]  # rotate who goes first
        for k in order:
            alone[kind][k].append(_serve(systems[k], [[{"role": "user", "content": kinds[kind][i]}]], params))
    batched = {kind: {k: _serve(systems[k], [[{"role": "user", "content": q}] for q in kinds[kind]], params)
                      for k in systems} for kind in kinds}
    result = {"model": model, "max_tokens": max_tokens, "attention": attention, "ks": list(ks), "modes": {}}
    identical = True
    for mode, runs in (("one at a time", {kind: {k: _total(r) for k, r in by_k.items()} for kind, by_k in
                                          alone.items()}),
                       ("batched", {kind: {k: _total([r]) for k, r in by_k.items()} for kind, by_k in
                                    batched.items()})):
        for by_k in runs.values():
            base = by_k[0]
            for total in by_k.values():
                total["speedup"] = base["wall_s"] / total["wall_s"]
                identical &= total["tokens"] == base["tokens"]
        result["modes"][mode] = runs
    for llm in systems.values():
        policy = llm.engine.policy
        policy.check_invariants()
        assert not policy.seq_ids(), "KV memory left allocated after the run"
    result["identical_outputs"] = identical
    if plot_dir:
        from minipaged.plots import plot_spec_speedup

        os.makedirs(plot_dir, exist_ok=True)
        result["plot"] = os.path.join(plot_dir, "spec_speedup.png")
        plot_spec_speedup(result, path=result["plot"])
    return result


def format_result(r: dict) -> str:
    lines = [f"{r['model']}, greedy chat, max_tokens {r['max_tokens']}, attention {r['attention']}; "
             f"{len(COPY)} copy requests (the answer repeats the prompt), {len(OPEN)} open questions; "
             "k = tokens guessed per step by prompt lookup (0: no speculation)\n"]
    for mode, runs in r["modes"].items():
        lines.append(f"{mode}:")
        lines.append(f"{'kind':<6}{'k':>3}{'tokens':>8}{'passes':>8}{'tokens/pass':>13}{'accepted':>10}"
                     f"{'wall s':>9}{'speedup':>9}")
        for kind, by_k in runs.items():
            for k, t in by_k.items():
                acc = "-" if t["acceptance"] is None else f"{100 * t['acceptance']:.0f}%"
                lines.append(f"{kind:<6}{k:>3}{t['output_tokens']:>8}{t['passes']:>8}{t['tokens_per_pass']:>13.2f}"
                             f"{acc:>10}{t['wall_s']:>9.2f}{t['speedup']:>8.2f}x")
        lines.append("")
    lines.append("tokens/pass: output tokens per forward pass (one at a time: per step of the one request); "
                 "accepted: guessed tokens the model agreed with")
    lines.append(f"identical outputs, token for token, with and without speculation: "
                 f"{'yes' if r['identical_outputs'] else 'NO'}")
    if r.get("plot"):
        lines.append(f"saved {r['plot']}")
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4, 8],
                   help="num_speculative_tokens values to compare with no speculation (default: 2 4 8)")
    p.add_argument("--max-tokens", type=int, default=64, help="most new tokens per answer (default: 64)")
    p.add_argument("--attention", default="torch_batched", choices=["torch_batched", "torch"],
                   help="attention backend (default: torch_batched)")
    p.add_argument("--plot-dir", default=None, help="also save spec_speedup.png there")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def main(args) -> int:
    r = run(args.model, tuple(args.k), args.max_tokens, args.attention, progress=not args.json,
            plot_dir=args.plot_dir)
    print(json.dumps(r, indent=2) if args.json else format_result(r))
    return 0 if r["identical_outputs"] else 1
