"""Chapter 08 without a model: what chunked prefill does to the wait between tokens, and what it costs.

A trace of chat requests (short prompts) with a long "document" prompt every few requests, all
arriving at once, is served by chapter 06's continuous scheduler over on-demand blocks, first with
whole prefills and then chunked at several budgets (simulator/serving.py runs the real scheduler).

Time here is a cost model, not a clock: a step costs ``step_overhead + tokens computed`` units, one
unit being the cost of one token's forward pass. The overhead is what every step pays whatever its
size (reading all the weights once, launching the kernels); ``python -m minipaged bench chunked``
measures both parts on the real model, and on a CPU the overhead is worth a few dozen tokens. With it:

    inter-token latency  the cost of the step that brought a decoding request its next token
                         (p50, p99, max over every decoded token)
    TTFT                 the cost of all steps up to and including a request's first token
    total                the cost of the whole trace (the inverse of throughput)

Not modelled: attention's cost growing with the context (a token costs the same anywhere), arrivals
over time, memory pressure (the pool is large enough for the trace; chapter 06 studies preemption).
"""

from __future__ import annotations

import random

from minipaged.kv import make_policy
from minipaged.lab.simulator.serving import simulate_serving, text_table
from minipaged.lab.simulator.workloads import Request
from minipaged.metrics_reader import percentile

DEFAULTS = dict(num_requests=64, long_every=4, long_len=(1024, 2048), short_len=(16, 128), output_len=(64, 256),
                budgets=[2048, 1024, 512, 256, 128, 64], max_num_seqs=32, step_overhead=55, capacity=65536,
                block_size=16, max_model_len=4096, seed=0)


def make_chunked_workload(num_requests: int = 64, long_every: int = 4, long_len=(1024, 2048), short_len=(16, 128),
                          output_len=(64, 256), seed: int = 0) -> list[Request]:
    """Every ``long_every``-th request brings a long document (long_len tokens, uniform in the range);
    the others a short chat prompt. Each generates output_len tokens."""
    for name, value in (("num_requests", num_requests), ("long_every", long_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        prompt = rng.randint(*(long_len if i % long_every == long_every - 1 else short_len))
        out = rng.randint(*output_len)
        requests.append(Request(i, 0, prompt, out, max_tokens=out))
    return requests


def costs(run, requests, step_overhead: float, long_from: int = DEFAULTS["long_len"][0]) -> dict:
    """The cost model over one simulated run (see the module docstring); requests of at least
    ``long_from`` prompt tokens count as documents."""
    step_cost = [step_overhead + t for t in run.step_tokens]
    clock, ends = 0.0, []
    for cost in step_cost:
        clock += cost
        ends.append(clock)
    itl = [cost for cost, decodes in zip(step_cost, run.decodes) for _ in range(decodes)]
    long_ids = {r.request_id for r in requests if r.prompt_len >= long_from}
    ttft = {r: ends[step - 1] for r, step in run.first_token_step.items()}
    short = [t for r, t in ttft.items() if r not in long_ids]
    long = [t for r, t in ttft.items() if r in long_ids]
    return {"steps": run.steps, "max_step_tokens": max(run.step_tokens), "total": clock,
            "itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99), "itl_max": max(itl),
            "ttft_short_p50": percentile(short, 50), "ttft_long_p50": percentile(long, 50),
            "step_tokens": list(run.step_tokens), "decodes": list(run.decodes)}


def simulate_chunked(requests, budgets, *, step_overhead: float = DEFAULTS["step_overhead"], max_num_seqs: int = 32,
                     capacity: int = 65536, block_size: int = 16, max_model_len: int = 4096,
                     long_from: int = DEFAULTS["long_len"][0], progress: bool = False) -> list[dict]:
    """One row per system: whole prefills (budget None), then chunked at each budget."""
    from tqdm import tqdm

    rows = []
    for budget in tqdm([None, *budgets], desc="budgets", disable=not progress):
        policy = make_policy("on_demand", num_slots=capacity, block_size=block_size, max_model_len=max_model_len)
        run = simulate_serving("continuous", policy, requests, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=budget, enable_chunked_prefill=budget is not None)
        rows.append({"budget": budget, **costs(run, requests, step_overhead, long_from)})
    return rows


def _cost(x) -> str:
    return "-" if x is None else f"{x:.0f}"


def format_rows(rows, step_overhead: float) -> str:
    base = rows[0]
    header = (f"{'budget':>8}{'steps':>7}{'max step':>10}{'ITL p50':>9}{'ITL p99':>9}{'ITL max':>9}"
              f"{'p99 vs whole':>14}{'TTFT short':>12}{'TTFT long':>11}{'total':>10}{'vs whole':>10}")
    lines = []
    for r in rows:
        name = "whole" if r["budget"] is None else str(r["budget"])
        lines.append(f"{name:>8}{r['steps']:>7}{r['max_step_tokens']:>10}{r['itl_p50']:>9.0f}{r['itl_p99']:>9.0f}"
                     f"{r['itl_max']:>9.0f}{base['itl_p99'] / r['itl_p99']:>13.2f}x{_cost(r['ttft_short_p50']):>12}"
                     f"{_cost(r['ttft_long_p50']):>11}{r['total']:>10.0f}{r['total'] / base['total']:>9.3f}x")
    return text_table(header, lines,
                      f"cost units: one token's forward pass; every step also pays an overhead of {step_overhead:g}",
                      LEGEND)


LEGEND = """\
budget     max_num_batched_tokens with chunked prefill ("whole": no chunks, no budget)
max step   the most tokens any step computed
ITL        inter-token latency: the cost of the step that brought each decoded token (p50, p99, max)
TTFT       time to first token, median over the short chat requests and over the long documents
total      the cost of serving the whole trace; "vs whole" > 1 means slower than whole prefills"""
