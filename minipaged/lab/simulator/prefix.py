"""Chapter 07 without a model: how much prefill a prefix cache saves, and how that depends on memory.

A trace of chat requests that begin with one of a few system prompts (some far more popular than
others, as in a service hosting a few assistants) and end with a short user message of their own:

    make_prefix_workload(num_requests, num_prefixes, prefix_len, ...)    Requests with prompt_ids

``simulate_prefix_caching`` runs such a trace through chapter 06's scheduler (simulator/serving.py)
with the "prefix_caching" policy and with "shared" (the cold baseline), at the same KV capacity, and
reports the prompt tokens served from the cache. What limits the hit rate is memory: a cached block
that nobody holds is free memory, and a busy server hands it to the running requests (evicting it)
before the next request with that system prompt comes. ``sweep_capacity`` measures that.

The best any cache could do on the trace, ``ideal_hit_rate``: every full block computed once, ever.

Not modelled: time (a step here is a forward pass of any size), arrival over time (every request
arrives at once and the scheduler admits them in order), multi-turn conversations (see the benchmark,
``python -m minipaged bench prefix``, which runs those on the model).
"""

from __future__ import annotations

import random

from minipaged.kv import make_policy
from minipaged.kv.prefix_cache import block_keys
from minipaged.lab.simulator.serving import simulate_serving, text_table
from minipaged.lab.simulator.workloads import Request

DEFAULTS = dict(num_requests=400, num_prefixes=8, prefix_len=400, suffix_len=(8, 64), output_len=(16, 128),
                zipf=1.0, block_size=16, max_model_len=1024, max_num_seqs=64, seed=0)


def make_prefix_workload(num_requests: int = 400, num_prefixes: int = 8, prefix_len: int = 400,
                         suffix_len=(8, 64), output_len=(16, 128), zipf: float = 1.0, vocab: int = 49152,
                         seed: int = 0) -> list[Request]:
    """Requests whose prompt is system prompt k (chosen with probability ~ 1 / (k+1) ** zipf) and a
    random user message of suffix_len tokens (uniform in the range); each generates output_len tokens."""
    for name, value in (("num_requests", num_requests), ("num_prefixes", num_prefixes), ("prefix_len", prefix_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    rng = random.Random(seed)
    prefixes = [tuple(rng.randrange(vocab) for _ in range(prefix_len)) for _ in range(num_prefixes)]
    weights = [1 / (k + 1) ** zipf for k in range(num_prefixes)]
    requests = []
    for i in range(num_requests):
        system = rng.choices(range(num_prefixes), weights)[0]
        user = tuple(rng.randrange(vocab) for _ in range(rng.randint(*suffix_len)))
        out = rng.randint(*output_len)
        prompt = prefixes[system] + user
        requests.append(Request(i, 0, len(prompt), out, max_tokens=out, prompt_ids=prompt))
    return requests


def ideal_hit_rate(requests, block_size: int = 16) -> float:
    """Prompt tokens an unbounded cache would serve: every full block after its first computation
    (and never a prompt's last token, which is always computed)."""
    seen, hits, total = set(), 0, 0
    for r in requests:
        keys = block_keys(r.prompt_ids[:r.prompt_len - 1], block_size)
        total += r.prompt_len
        for key in keys:
            if key in seen:
                hits += block_size
            else:
                break
        seen.update(keys)
    return hits / total


def simulate_prefix_caching(requests, capacity: int, *, block_size: int = 16, max_model_len: int = 1024,
                            max_num_seqs: int = 64) -> dict:
    """The trace with and without the prefix cache, at one KV capacity (in token slots)."""
    row = {"capacity": capacity}
    for name in ("shared", "prefix_caching"):
        policy = make_policy(name, num_slots=capacity, block_size=block_size, max_model_len=max_model_len)
        run = simulate_serving("continuous", policy, requests, max_num_seqs=max_num_seqs)
        row[name] = {"steps": run.steps, "tokens_computed": run.tokens_computed, "mean_batch": run.mean_batch,
                     "preemptions": run.preemptions}
        if name == "prefix_caching":
            row["hit_rate"] = policy.hit_rate()
            row["evictions"] = policy.evictions
    row["compute_ratio"] = row["shared"]["tokens_computed"] / row["prefix_caching"]["tokens_computed"]
    return row


def sweep_capacity(requests, capacities, progress: bool = False, **options) -> list[dict]:
    from tqdm import tqdm

    return [simulate_prefix_caching(requests, c, **options)
            for c in tqdm(capacities, desc="capacities", disable=not progress)]


def format_sweep(rows, ideal: float) -> str:
    header = (f"{'KV slots':>9}{'hit rate':>10}{'evictions':>11}{'computed cold':>15}{'computed warm':>15}"
              f"{'ratio':>8}{'steps cold':>12}{'steps warm':>12}")
    lines = []
    for r in rows:
        cold, warm = r["shared"], r["prefix_caching"]
        lines.append(f"{r['capacity']:>9}{100 * r['hit_rate']:>9.1f}%{r['evictions']:>11}"
                     f"{cold['tokens_computed']:>15}{warm['tokens_computed']:>15}{r['compute_ratio']:>7.2f}x"
                     f"{cold['steps']:>12}{warm['steps']:>12}")
    return text_table(header, lines, f"an unbounded cache would serve {100 * ideal:.1f}% of the prompt tokens", LEGEND)


LEGEND = """\
hit rate   prompt tokens served from the cache / prompt tokens looked up (re-admissions included)
evictions  cached blocks handed to another request because no plain free block was left
computed   token positions the forward passes computed (prompts, re-prefills after preemption, decodes)
ratio      computed cold / computed warm; steps: forward passes to finish the trace"""
