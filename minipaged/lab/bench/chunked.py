"""Chapter 08's benchmark: the wait between tokens with whole and chunked prefills, on the real model.

    python -m minipaged bench chunked [--requests 24] [--budgets 256 128 64] [--repeats 2] [--json]

A trace like the simulator's (simulator/chunked.py), sized for two CPU cores: chat requests with
short prompts and, every fourth request, a long "document" prompt, all arriving at once; random token
ids, every request generating exactly its output length (ignore_eos). The same trace is served by the
same engine (on-demand blocks, continuous batching, at most --max-num-seqs running) with whole
prefills and then chunked at each budget. Systems take turns within a round, in an order that
alternates between rounds, and each figure is the median over the rounds.

Printed per system: inter-token latency (the gaps between consecutive tokens of a request: p50, p90,
p99, max), time to first token (median, chat and documents apart), wall time, output tokens/s, the
steps and the most tokens in one step. Then what one step costs: a straight line fitted to every
forward pass of the run (time against tokens computed), whose intercept over slope is the
``--step-overhead`` the simulator takes.

With --plot-dir it draws chunked_itl.png (the distribution of the gaps, per system) and
chunked_step_cost.png (the fitted step cost). Not measured here: arrivals over time, a GPU (where a
step's fixed part is worth hundreds of tokens, not dozens, so chunks come nearly free).
"""

from __future__ import annotations

import os
import random
import time
from statistics import median

from minipaged.lab.bench import add_attention_argument, add_output_arguments, finish, identical_outputs_line
from minipaged.lab.simulator.chunked import make_chunked_workload
from minipaged.metrics_reader import percentile

SHAPE = dict(long_every=4, long_len=(600, 900), short_len=(16, 96), output_len=(32, 64))


def make_trace(num_requests: int, vocab_size: int, seed: int = 0, shape: dict = SHAPE):
    """[(prompt token ids, output length, is a document)] after the simulator's trace, smaller."""
    rng = random.Random(seed)
    low = min(1000, vocab_size // 4)  # past the special tokens
    return [([rng.randrange(low, vocab_size) for _ in range(r.prompt_len)], r.output_len,
             r.prompt_len >= shape["long_len"][0])
            for r in make_chunked_workload(num_requests, seed=seed, **shape)]


def fit_line(points) -> tuple[float, float]:
    """Least squares y = a + b x over (x, y) points."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def serve(llm, trace) -> dict:
    """One run of the trace; everything measured from the engine's own records."""
    from minipaged import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n, _ in trace]
    start = time.perf_counter()
    with llm.engine.metrics.steps.recording() as rec:  # this run's steps
        outs = llm.generate([p for p, _, _ in trace], params, use_tqdm=False)
    wall = time.perf_counter() - start
    policy = llm.engine.policy
    policy.check_invariants()
    assert not policy.seq_ids(), "KV memory left allocated after the run"
    gaps, ttft = [], {True: [], False: []}
    for o, (_, _, is_doc) in zip(outs, trace):
        times = o.metrics["token_times"][0]
        gaps += [b - a for a, b in zip(times, times[1:])]
        ttft[is_doc].append(o.metrics["first_token_time"] - o.metrics["arrival_time"])
    return {"wall_s": wall, "tokens_per_s": sum(n for _, n, _ in trace) / wall,
            "itl_p50_s": percentile(gaps, 50), "itl_p90_s": percentile(gaps, 90),
            "itl_p99_s": percentile(gaps, 99), "itl_max_s": max(gaps, default=None),
            "ttft_chat_p50_s": median(ttft[False]) if ttft[False] else None,
            "ttft_doc_p50_s": median(ttft[True]) if ttft[True] else None,
            "steps": len(rec.records), "max_step_tokens": max(rec.series("num_tokens")),
            "gaps": gaps, "step_points": list(zip(rec.series("num_tokens"), rec.series("forward_seconds"))),
            "tokens": [o.outputs[0].token_ids for o in outs]}


TIMED = ("wall_s", "tokens_per_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s", "ttft_chat_p50_s",
         "ttft_doc_p50_s")


def run(model="smollm2-135m", requests=24, budgets=(256, 128, 64), max_num_seqs=8, repeats=2,
        kv_capacity=16384, attention="torch_batched", seed=0, progress=True, plot_dir=None, shape=None) -> dict:
    from tqdm import tqdm

    from minipaged import LLM, SamplingParams

    for name, value in (("requests", requests), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    if any(b < max_num_seqs for b in budgets):
        raise ValueError(f"budgets={list(budgets)} must each be >= max_num_seqs={max_num_seqs}")
    systems = {}
    for budget in (None, *budgets):
        label = "whole prefills" if budget is None else f"chunked {budget}"
        systems[label] = LLM(model, kv_policy="on_demand", kv_capacity_tokens=kv_capacity, max_num_seqs=max_num_seqs,
                             attention_backend=attention, enable_chunked_prefill=budget is not None,
                             max_num_batched_tokens=budget, progress=False)
    first = next(iter(systems.values()))
    shape = shape or SHAPE
    trace = make_trace(requests, first.config.vocab_size, seed, shape)
    for llm in systems.values():  # first-call overheads, not timed
        llm.generate([trace[0][0][:64]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    rounds = {label: [] for label in systems}
    todo = [label for r in range(repeats) for label in (list(systems) if r % 2 == 0 else list(systems)[::-1])]
    for label in tqdm(todo, desc="bench chunked", unit="run", disable=not progress):
        rounds[label].append(serve(systems[label], trace))
    result_systems = {}
    for label, runs in rounds.items():
        merged = {key: None if runs[0][key] is None else median(run[key] for run in runs) for key in TIMED}
        merged.update(budget=systems[label].args.batched_tokens if systems[label].args.enable_chunked_prefill else None,
                      steps=runs[0]["steps"], max_step_tokens=runs[0]["max_step_tokens"])
        result_systems[label] = merged
    reference = rounds["whole prefills"][0]["tokens"]
    identical = all(run["tokens"] == reference for runs in rounds.values() for run in runs)
    points = [p for runs in rounds.values() for run in runs for p in run["step_points"]]
    overhead_s, per_token_s = fit_line(points)
    result = {"model": model, "requests": requests, "documents": sum(1 for t in trace if t[2]),
              "prompt_tokens": sum(len(t[0]) for t in trace), "output_tokens": sum(t[1] for t in trace),
              "max_num_seqs": max_num_seqs, "attention": attention, "repeats": repeats, "shape": shape,
              "systems": result_systems, "identical_outputs": identical,
              "step_cost": {"overhead_s": overhead_s, "per_token_s": per_token_s,
                            "overhead_tokens": overhead_s / per_token_s if per_token_s > 0 else None}}
    if plot_dir:
        from minipaged.lab.plots import plot_itl_cdf, plot_step_cost

        os.makedirs(plot_dir, exist_ok=True)
        result["plots"] = [os.path.join(plot_dir, "chunked_itl.png"), os.path.join(plot_dir, "chunked_step_cost.png")]
        plot_itl_cdf({label: [g for run in runs for g in run["gaps"]] for label, runs in rounds.items()},
                     path=result["plots"][0], title=f"{model}: the time between two tokens of a request")
        plot_step_cost(points, (overhead_s, per_token_s), path=result["plots"][1],
                       title=f"{model} on this machine: what one forward pass costs")
    return result


def _than(whole: float, chunked: float) -> str:
    """A time with chunks against the same time without, in words."""
    if whole is None or chunked is None:
        return "-"
    return f"{whole / chunked:.2f}x shorter" if chunked <= whole else f"{chunked / whole:.2f}x longer"


def format_result(r: dict) -> str:
    s = r["shape"]
    lines = [f"{r['model']}, greedy, {r['requests']} requests at once ({r['documents']} documents of "
             f"{s['long_len'][0]}-{s['long_len'][1]} tokens, chat prompts of {s['short_len'][0]}-{s['short_len'][1]}, "
             f"outputs of {s['output_len'][0]}-{s['output_len'][1]}): {r['prompt_tokens']} prompt and "
             f"{r['output_tokens']} output tokens; max_num_seqs {r['max_num_seqs']}, attention {r['attention']}; "
             f"medians of {r['repeats']} rounds\n",
             f"{'system':<16}{'ITL p50':>9}{'p90':>7}{'p99':>7}{'max':>7}{'TTFT chat':>11}{'TTFT doc':>10}"
             f"{'wall s':>8}{'tok/s':>7}{'steps':>7}{'max step':>10}"]
    lines.append("-" * len(lines[-1]))
    for label, m in r["systems"].items():
        ms = {k: "-" if m[k] is None else f"{1000 * m[k]:.0f}" for k in TIMED if k.endswith("_s") and k != "wall_s"}
        lines.append(f"{label:<16}{ms['itl_p50_s']:>9}{ms['itl_p90_s']:>7}{ms['itl_p99_s']:>7}"
                     f"{ms['itl_max_s']:>7}{ms['ttft_chat_p50_s']:>11}{ms['ttft_doc_p50_s']:>10}"
                     f"{m['wall_s']:>8.1f}{m['tokens_per_s']:>7.1f}{m['steps']:>7}{m['max_step_tokens']:>10}")
    lines.append("(times in ms except wall; ITL: gaps between consecutive tokens of a request)\n")
    base = r["systems"]["whole prefills"]
    for label, m in r["systems"].items():
        if m["budget"] is None:
            continue
        lines.append(f"{label}: ITL p99 {_than(base['itl_p99_s'], m['itl_p99_s'])}, max "
                     f"{_than(base['itl_max_s'], m['itl_max_s'])}, p50 {_than(base['itl_p50_s'], m['itl_p50_s'])}; "
                     f"TTFT chat {_than(base['ttft_chat_p50_s'], m['ttft_chat_p50_s'])}, documents "
                     f"{_than(base['ttft_doc_p50_s'], m['ttft_doc_p50_s'])}; throughput "
                     f"{m['tokens_per_s'] / base['tokens_per_s']:.2f}x")
    c = r["step_cost"]
    lines.append(f"\none forward pass costs {1000 * c['overhead_s']:.1f} ms + {1000 * c['per_token_s']:.2f} ms per "
                 f"token (fitted over every step): the fixed part is worth {c['overhead_tokens']:.0f} tokens "
                 f"(the simulator's --step-overhead)")
    lines.append(identical_outputs_line(r, "in every run"))
    for path in r.get("plots", []):
        lines.append(f"saved {path}")
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--requests", type=int, default=24, help="requests in the trace (default: 24)")
    p.add_argument("--budgets", type=int, nargs="+", default=[256, 128, 64],
                   help="max_num_batched_tokens of the chunked systems (default: 256 128 64)")
    p.add_argument("--max-num-seqs", type=int, default=8, help="most requests running at once (default: 8)")
    p.add_argument("--repeats", type=int, default=2, help="rounds; figures are the medians (default: 2)")
    add_attention_argument(p)
    p.add_argument("--seed", type=int, default=0, help="trace seed (default: 0)")
    add_output_arguments(p, "chunked_itl.png and chunked_step_cost.png")


def main(args) -> int:
    r = run(args.model, args.requests, tuple(args.budgets), args.max_num_seqs, args.repeats, attention=args.attention,
            seed=args.seed, progress=not args.json, plot_dir=args.plot_dir)
    return finish(r, args.json, format_result)
