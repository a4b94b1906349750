"""Chapter 09's benchmark: decoding with and without prompt-lookup speculation, on the real model.

    python -m minipaged bench speculative [--k 2 4 8] [--max-tokens 64] [--repeats 3] [--json]

Two kinds of chat request, greedy: "copy" requests whose answer repeats much of the prompt (repeat a
list, fix a typo in code, rewrite a sentence), where prompt lookup should guess well, and "open"
questions, where it mostly has nothing to copy. The same engine (on-demand blocks, the batched
attention) serves them with speculation off and with ``num_speculative_tokens`` = each of --k:

    one at a time   each request alone (the latency a single user sees); for each request the
                    systems take turns, in an order that rotates, so the machine's noise falls on all
    batched         all requests of a kind together (what a busy server sees)

The whole is done --repeats times (the rotation starting elsewhere each round), and each wall time
is the median over the rounds; the token counts are the same in every round.

Printed per system and kind: output tokens, forward passes, tokens per step (per request and
forward pass), the share of guessed tokens accepted, wall time and the speedup over no
speculation; the outputs must be identical. Then the cost of one request's forward pass computing
1 .. max(k) + 1 tokens, which is what a step with a draft costs. With --plot-dir it draws
spec_speedup.png.

Not measured: sampled requests (they speculate too, tested in tests/ch09_speculative_decoding), a
draft model.
"""

from __future__ import annotations

import os
import time
from statistics import median

from minipaged.lab.bench import add_attention_argument, add_output_arguments, finish, identical_outputs_line

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


def _counters(llm) -> tuple[int, int]:
    from minipaged.metrics_reader import find

    metrics = llm.get_metrics()
    return (find(metrics, "spec_decode_num_draft_tokens").value, find(metrics, "spec_decode_num_accepted_tokens").value)


def _serve(llm, chats, params) -> dict:
    before = _counters(llm)
    start = time.perf_counter()
    with llm.engine.metrics.steps.recording() as rec:  # this call's forward passes
        outs = llm.chat(chats, params, use_tqdm=False)
    wall = time.perf_counter() - start
    drafted, accepted = (b - a for a, b in zip(before, _counters(llm)))
    return {"wall_s": wall, "passes": len(rec.records), "seq_steps": sum(rec.series("batch_size")),
            "drafted": drafted, "accepted": accepted, "tokens": [o.outputs[0].token_ids for o in outs]}


def pass_cost(llm, max_tokens: int, repeats: int = 5) -> dict[int, float]:
    """Seconds of one request's forward pass computing 1 .. max_tokens tokens (a prompt of that
    length, median of ``repeats``): what a step with a draft of k costs, at k + 1."""
    from minipaged import SamplingParams

    params, cost = SamplingParams(temperature=0, max_tokens=1), {}
    for n in range(1, max_tokens + 1):
        vocab = llm.config.vocab_size
        ids = [[(vocab // 4 + 7 * j) % vocab for j in range(n)]]  # ordinary tokens, past the special ones
        llm.generate(ids, params, use_tqdm=False)  # once untimed
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            llm.generate(ids, params, use_tqdm=False)
            times.append(time.perf_counter() - start)
        cost[n] = median(times)
    return cost


def _total(runs: list[dict]) -> dict:
    total = {key: sum(r[key] for r in runs) for key in ("wall_s", "passes", "seq_steps", "drafted", "accepted")}
    total["tokens"] = [t for r in runs for t in r["tokens"]]
    total["output_tokens"] = sum(len(t) for t in total["tokens"])
    total["tokens_per_step"] = total["output_tokens"] / total["seq_steps"]  # per request, per forward pass
    total["acceptance"] = total["accepted"] / total["drafted"] if total["drafted"] else None
    return total


def run(model="smollm2-135m", ks=(2, 4, 8), max_tokens=64, attention="torch_batched", progress=True,
        plot_dir=None, repeats=3) -> dict:
    from tqdm import tqdm

    from minipaged import SamplingParams

    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"--k / ks={list(ks)} must be integers >= 1 (the numbers of guessed tokens to compare)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an integer >= 1")
    systems = {0: _engine(model, 0, attention), **{k: _engine(model, k, attention) for k in ks}}
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    for llm in systems.values():  # first-call overheads, not timed
        llm.generate(["Warm-up."], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    kinds = {"copy": COPY, "open": OPEN}
    todo = [(r, kind, i) for r in range(repeats) for kind in kinds for i in range(len(kinds[kind]))]
    alone = [{kind: {k: [] for k in systems} for kind in kinds} for _ in range(repeats)]
    batched = [{kind: {} for kind in kinds} for _ in range(repeats)]
    bar = tqdm(total=len(todo) + repeats * len(kinds), desc="bench speculative", unit="run", disable=not progress)
    for turn, (r, kind, i) in enumerate(todo):
        order = list(systems)
        order = order[turn % len(order):] + order[:turn % len(order)]  # rotate who goes first
        for k in order:
            alone[r][kind][k].append(_serve(systems[k], [[{"role": "user", "content": kinds[kind][i]}]], params))
        bar.update(1)
        if i == len(kinds[kind]) - 1:  # the kind's batch, once its requests have run one at a time
            for k in order:
                batched[r][kind][k] = _serve(systems[k], [[{"role": "user", "content": q}] for q in kinds[kind]],
                                             params)
            bar.update(1)
    bar.close()
    result = {"model": model, "max_tokens": max_tokens, "attention": attention, "ks": list(ks),
              "repeats": repeats, "modes": {}}
    identical = True
    for mode, rounds in (("one at a time", [{kind: {k: _total(x) for k, x in by_k.items()}
                                             for kind, by_k in rnd.items()} for rnd in alone]),
                         ("batched", [{kind: {k: _total([x]) for k, x in by_k.items()}
                                       for kind, by_k in rnd.items()} for rnd in batched])):
        runs = {kind: dict(sorted(by_k.items())) for kind, by_k in rounds[0].items()}
        for kind, by_k in runs.items():
            for k, total in by_k.items():
                total["wall_s"] = median(rnd[kind][k]["wall_s"] for rnd in rounds)
                identical &= all(rnd[kind][k]["tokens"] == rounds[0][kind][0]["tokens"] for rnd in rounds)
            for total in by_k.values():
                total["speedup"] = by_k[0]["wall_s"] / total["wall_s"]
                total["ms_per_pass"] = 1000 * total["wall_s"] / total["passes"]
        result["modes"][mode] = runs
    for llm in systems.values():
        policy = llm.engine.policy
        policy.check_invariants()
        assert not policy.seq_ids(), "KV memory left allocated after the run"
    result["identical_outputs"] = identical
    result["pass_cost_s"] = pass_cost(systems[0], max(ks) + 1)
    if plot_dir:
        from minipaged.lab.plots import plot_spec_speedup

        os.makedirs(plot_dir, exist_ok=True)
        result["plot"] = os.path.join(plot_dir, "spec_speedup.png")
        plot_spec_speedup(result, path=result["plot"])
    return result


def format_result(r: dict) -> str:
    lines = [f"{r['model']}, greedy chat, max_tokens {r['max_tokens']}, attention {r['attention']}; "
             f"{len(COPY)} copy requests (the answer repeats the prompt), {len(OPEN)} open questions; "
             f"k = tokens guessed per step by prompt lookup (0: no speculation); wall times are medians of "
             f"{r['repeats']} rounds\n"]
    for mode, runs in r["modes"].items():
        lines.append(f"{mode}:")
        lines.append(f"{'kind':<6}{'k':>3}{'tokens':>8}{'passes':>8}{'tokens/step':>13}{'accepted':>10}"
                     f"{'ms/pass':>9}{'wall s':>9}{'speedup':>9}")
        for kind, by_k in runs.items():
            for k, t in by_k.items():
                acc = "-" if t["acceptance"] is None else f"{100 * t['acceptance']:.0f}%"
                lines.append(f"{kind:<6}{k:>3}{t['output_tokens']:>8}{t['passes']:>8}{t['tokens_per_step']:>13.2f}"
                             f"{acc:>10}{t['ms_per_pass']:>9.1f}{t['wall_s']:>9.2f}{t['speedup']:>8.2f}x")
        lines.append("")
    lines.append("tokens/step: output tokens per request per forward pass (1.00 without speculation); "
                 "accepted: guessed tokens the model agreed with; ms/pass: wall time per forward pass")
    cost = r["pass_cost_s"]
    lines.append("one request's forward pass computing n tokens (a step with a draft of n - 1), ms: " +
                 ", ".join(f"{n}: {1000 * s:.0f}" for n, s in cost.items()))
    lines.append(identical_outputs_line(r, "with and without speculation"))
    if r.get("plot"):
        lines.append(f"saved {r['plot']}")
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--k", type=int, nargs="+", default=[2, 4, 8],
                   help="num_speculative_tokens values to compare with no speculation (default: 2 4 8)")
    p.add_argument("--max-tokens", type=int, default=64, help="most new tokens per answer (default: 64)")
    add_attention_argument(p)
    p.add_argument("--repeats", type=int, default=3, help="rounds; wall times are the medians (default: 3)")
    add_output_arguments(p, "spec_speedup.png")


def main(args) -> int:
    r = run(args.model, tuple(args.k), args.max_tokens, args.attention, progress=not args.json,
            plot_dir=args.plot_dir, repeats=args.repeats)
    return finish(r, args.json, format_result)
