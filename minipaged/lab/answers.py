"""The computations behind the numbers in the chapters' worked answers (their "Open questions").

A worked answer quotes two kinds of numbers. A timed one (seconds, tokens per second) comes from a
results record, through a ``<!-- fig: -->`` marker (records.py). A deterministic one (a simulator
run, arithmetic on a model's shapes or on a record's figures, the tokens a tiny model picks greedily)
comes from a function here, registered under ``NN/name``, and is tied to the text by a marker:

    100<!-- calc: 06/saw_tooth steps d -->

The marker is read like a figure's (records.py): the value at that path of the function's results,
written with that format spec. ``python -m minipaged.lab.records render`` runs the functions the chapters
name and rewrites the numbers; ``render --check`` (and tests/test_answers.py) fails when one differs.
The text names the command that prints the results:

    python -m minipaged.lab.answers 06/saw_tooth  prints one computation's results as JSON
    python -m minipaged.lab.answers --list        every name, with the first line of its docstring

A function may read a record (``_record("06/bench_serving")``) and compute from its figures, which is
how an answer does arithmetic on a measurement without copying its numbers. Every function together
must stay fast (the test runs them all: well under a minute); a number that needs a slow or timed run
belongs in a record instead.

Some answers change the library to see what breaks (a different victim, no reversal before a release).
The library offers each such choice as a named option (``PrefixCachingPolicy.promise``) or a small
method that holds just the rule (``ContinuousScheduler._victim``); the answer sets the option or
replaces the method with its own rule, only inside the function (``_patched``), so that the numbers
it gives can be checked like the others. No answer copies a method of the library.

Not handled: numbers that only a GPU or a run of the test suite gives (test counts, error messages);
the answers quote those as text.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import sys
from collections.abc import Callable

REGISTRY: dict[str, Callable[[], dict]] = {}


def answer(name: str):
    """Register a function of no arguments returning a dict of JSON values, as ``NN/name``."""
    def register(fn):
        if name in REGISTRY:
            raise ValueError(f"answer {name!r} is registered twice")
        REGISTRY[name] = fn
        return fn
    return register


@functools.cache
def _computed(name: str) -> str:
    return json.dumps(REGISTRY[name](), sort_keys=True)


def compute(name: str) -> dict:
    """The results of ``name``, computed once per process."""
    if name not in REGISTRY:
        raise ValueError(f"no answer computation named {name!r}; the names are: {', '.join(sorted(REGISTRY))}")
    return json.loads(_computed(name))


def _record(name: str) -> dict:
    from minipaged.lab import capture

    return capture.load(None, name)["results"]


@contextlib.contextmanager
def _patched(owner, attr: str, value):
    """``owner.attr = value`` inside the block only."""
    saved = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, saved)


def _simulate(*argv: str) -> dict:
    """What ``python -m minipaged simulate ARGV --json`` prints, run in this process."""
    from minipaged.lab.simulator import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if cli.main([*argv, "--json"]):
            raise RuntimeError(f"simulate {' '.join(argv)} failed")
    return json.loads(out.getvalue())


# ---------------------------------------------------------------- chapter 06


def _serve(requests, slots, *, watermark=0.01, **kw):
    from minipaged.kv import make_policy
    from minipaged.lab.simulator.serving import simulate_serving

    policy = make_policy("on_demand", num_slots=slots, block_size=16, max_model_len=2048, watermark=watermark)
    return simulate_serving("continuous", policy, requests, **kw)


def _sharegpt_200():
    from minipaged.lab.simulator.workloads import make_workload

    return make_workload("sharegpt", 200, max_model_len=2048, seed=0)


@answer("06/saw_tooth")
def saw_tooth() -> dict:
    """A static batch of 8 requests wanting 5, 5, 5, 5, 5, 5, 5 and 100 tokens (question 1)."""
    from minipaged.kv import make_policy
    from minipaged.lab.simulator.serving import simulate_serving
    from minipaged.lab.simulator.workloads import Request

    reqs = [Request(i, 0, 10, n, n) for i, n in enumerate([5] * 7 + [100])]
    policy = make_policy("on_demand", num_slots=4096, block_size=16, max_model_len=2048)
    run = simulate_serving("static", policy, reqs, max_num_seqs=8)
    return {"steps": run.steps, "mean_batch": run.mean_batch, "first_batches": run.batch_sizes[:8],
            "sequence_steps": sum(run.batch_sizes), "alone_steps": run.batch_sizes.count(1)}


def _row(run) -> dict:
    return {"steps": run.steps, "preemptions": run.preemptions, "tokens_computed": run.tokens_computed}


@answer("06/watermark")
def watermark() -> dict:
    """The 200-request ShareGPT-like trace in two tight pools at three watermarks (question 2)."""
    trace = _sharegpt_200()
    keys = {0: "w0", 0.01: "w0_01", 0.1: "w0_1"}  # a path's keys hold no dots
    out = {str(slots): {keys[w]: _row(_serve(trace, slots, watermark=w)) for w in keys} for slots in (2048, 4096)}
    for rows in out.values():
        rows["steps_w0_01_minus_w0"] = rows["w0_01"]["steps"] - rows["w0"]["steps"]
        rows["saved_at_w0_1"] = 1 - rows["w0_1"]["tokens_computed"] / rows["w0"]["tokens_computed"]
    return out


def _largest_victim(self):
    """ContinuousScheduler._victim with question 3's rule: the request holding the most blocks."""
    return max(self.running, key=lambda r: sum(len(self.policy.block_table(s.seq_id)) for s in r.seqs))


@answer("06/largest_victim")
def largest_victim() -> dict:
    """Preempting the request that holds the most blocks instead of the newest (question 3), on the
    200-request trace in a 4,096-slot pool; the default watermark, 0.01."""
    from minipaged.scheduler.continuous import ContinuousScheduler

    trace = _sharegpt_200()
    longest = sorted(trace, key=lambda r: r.prompt_len + r.output_len)[-5:]  # the five longest requests
    out = {"longest_tokens": [r.prompt_len + r.output_len for r in longest]}
    newest = _serve(trace, 4096)
    with _patched(ContinuousScheduler, "_victim", _largest_victim):
        largest = _serve(trace, 4096)
    for name, run in (("newest", newest), ("largest", largest)):
        out[name] = {**_row(run), "longest_finished_at": [run.finish_step[r.request_id] for r in longest],
                     "longest_last_finished_at": max(run.finish_step[r.request_id] for r in longest)}
    out["longest_all_later"] = all(b > a for a, b in zip(out["newest"]["longest_finished_at"],
                                                        out["largest"]["longest_finished_at"]))
    return out


@answer("06/swap_cost")
def swap_cost() -> dict:
    """The bandwidth the swap copies of `bench serving` reached, and the bandwidth below which
    recompute would win (question 4): arithmetic on chapter 06's and chapter 08's records."""
    from minipaged.model.config import SMOLLM2_135M

    recompute, swap = _record("06/bench_serving")["pressure"][:2]
    per_token_s = _record("08/bench_chunked")["step_cost"]["per_token_s"]
    kv_per_token = SMOLLM2_135M.kv_bytes_per_token(4)
    block_bytes = 16 * kv_per_token
    copies = 2 * swap["blocks_swapped_out"]  # out and back in: every request finished
    moved = copies * block_bytes
    extra_tokens = recompute["tokens_computed"] - swap["tokens_computed"]
    recompute_s = extra_tokens * per_token_s
    return {"kv_bytes_per_token": kv_per_token, "block_bytes": block_bytes, "copies": copies,
            "moved_mb": moved / 1e6, "swap_gb_per_s": moved / swap["swap_seconds"] / 1e9,
            "extra_tokens": extra_tokens, "recompute_s": recompute_s, "break_even_mb_per_s": moved / recompute_s / 1e6}


@answer("06/token_budget")
def token_budget() -> dict:
    """`bench serving`'s trace in a 1,536-slot pool with and without a budget of 64 tokens (question 5)."""
    import statistics

    from minipaged.kv import make_policy
    from minipaged.lab.bench import serving
    from minipaged.lab.simulator.serving import simulate_serving
    from minipaged.lab.simulator.workloads import Request

    reqs = [Request(i, 0, len(p), n, n) for i, (p, n) in enumerate(serving.make_trace(64, 0.1, 256, 49152))]
    out = {}
    for name, budget in (("none", None), ("64", 64)):
        policy = make_policy("on_demand", num_slots=1536, block_size=16, max_model_len=256)
        run = simulate_serving("continuous", policy, reqs, max_num_seqs=32, max_num_batched_tokens=budget)
        longest = max(reqs, key=lambda r: r.prompt_len)
        mixed = [t for t, d in zip(run.step_tokens, run.decodes) if d]  # steps that decode someone
        out[name] = {"steps": run.steps, "mean_batch": run.mean_batch,
                     "ttft_step_p50": statistics.median(run.first_token_step.values()),
                     "longest_prompt": longest.prompt_len,
                     "longest_first_step": run.first_token_step[longest.request_id],
                     "longest_step_batch": run.batch_sizes[run.first_token_step[longest.request_id] - 1],
                     "most_tokens_beside_decodes": max(mixed)}
    return out


# ---------------------------------------------------------------- chapter 07


@answer("07/evict_front")
def evict_front() -> dict:
    """The warm runs of `simulate --prefix --capacities 1024 2048 4096` with a finished request's blocks
    going to the LRU list first block first (question 2); the runs as they are are chapter 07's record."""
    from minipaged.kv import make_policy
    from minipaged.kv.prefix_cache import PrefixCachingPolicy
    from minipaged.lab.simulator import prefix
    from minipaged.lab.simulator.serving import simulate_serving

    d = prefix.DEFAULTS  # as the command builds its trace
    requests = prefix.make_prefix_workload(d["num_requests"], d["num_prefixes"], d["prefix_len"], d["suffix_len"],
                                           d["output_len"], d["zipf"], seed=d["seed"])
    rows = []
    with _patched(PrefixCachingPolicy, "evict_last_block_first", False):
        for capacity in (1024, 2048, 4096):
            policy = make_policy("prefix_caching", num_slots=capacity, block_size=d["block_size"],
                                 max_model_len=d["max_model_len"])
            run = simulate_serving("continuous", policy, requests, max_num_seqs=d["max_num_seqs"])
            rows.append({"capacity": capacity, "hit_rate": policy.hit_rate(), "evictions": policy.evictions,
                         "tokens_computed": run.tokens_computed})
    return {"after": rows}


def _tiny_with_cache():
    from minipaged import LLM

    return LLM("tiny", enable_prefix_caching=True, kv_policy="shared", kv_capacity_tokens=4096, block_size=4,
               max_model_len=128, attention_backend="torch", progress=False)


@answer("07/no_promises")
def no_promises() -> dict:
    """`num_cached_tokens` of the eight prompts of tests/ch07_prefix_caching/test_engine.py (a 37-token
    system prompt, block size 4), served twice, with the promise and without it (question 3)."""
    import random

    from minipaged import SamplingParams
    from minipaged.kv.prefix_cache import PrefixCachingPolicy

    rng = random.Random(7)  # the test's prompts, built the same way
    system = [rng.randrange(1, 250) for _ in range(37)]
    prompts = [system + [rng.randrange(1, 250) for _ in range(rng.randrange(1, 14))] for _ in range(8)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)

    def twice():
        llm = _tiny_with_cache()
        return [[o.num_cached_tokens for o in llm.generate(prompts, params, use_tqdm=False)] for _ in range(2)]

    promise = twice()
    with _patched(PrefixCachingPolicy, "promise", "written"):
        none = twice()
    return {"promise": {"cold": promise[0], "again": promise[1]}, "no_promise": {"cold": none[0], "again": none[1]}}


def _whole_prompt(hits):
    """PrefixCachingPolicy._hits walking every full block, the last prompt token's included (question 4):
    ``hits``, the real one, asked about one token more walks exactly those blocks (it stops one short)."""
    def hits_whole_prompt(self, token_ids):
        return hits(self, list(token_ids) + [0])
    return hits_whole_prompt


@answer("07/whole_prompt")
def whole_prompt() -> dict:
    """An 8-token prompt (two full blocks of 4) and a 13-token one on the tiny model, served twice, with
    `_hits` serving a whole block-aligned prompt from the cache (question 4)."""
    from minipaged import SamplingParams
    from minipaged.kv.prefix_cache import PrefixCachingPolicy

    short, other = list(range(1, 9)), list(range(20, 33))
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    def outputs(llm, prompts, p=params):
        return [o.outputs[0].token_ids for o in llm.generate(prompts, p, use_tqdm=False)]

    right = outputs(_tiny_with_cache(), [short, other])
    llm = _tiny_with_cache()
    with _patched(PrefixCachingPolicy, "_hits", _whole_prompt(PrefixCachingPolicy._hits)):
        outputs(llm, [short, other])
        again = outputs(llm, [short, other])
    follows = outputs(_tiny_with_cache(), [short + again[0][:1]], SamplingParams(temperature=0, max_tokens=4,
                                                                                   ignore_eos=True))[0]
    return {"right": right[0], "other_right": right[1], "again": again[0], "other_again": again[1],
            "follows_first": follows}


@answer("07/promise_early")
def promise_early() -> dict:
    """Two sequences admitted with the same 10-token prompt before the first one's slots are planned,
    with the promise where it is and with it made at admission (question 5)."""
    from minipaged.kv.prefix_cache import PrefixCachingPolicy

    def run():
        p = PrefixCachingPolicy(64, block_size=4, watermark=0)
        prompt = list(range(100, 110))
        p.allocate("a", 10, 5, token_ids=prompt)
        p.allocate("b", 10, 5, token_ids=prompt)
        b_tokens = p.num_tokens("b")
        p.append_slots("a", 10)
        return {"b_tokens": b_tokens, "copies": [list(c) for c in p.drain_copies()],
                "table_a": p.block_table("a"), "table_b": p.block_table("b")}

    as_it_is = run()
    with _patched(PrefixCachingPolicy, "promise", "admitted"):
        early = run()
    return {"as_it_is": as_it_is, "early": early}


# ---------------------------------------------------------------- chapter 08


@answer("08/sample_every_chunk")
def sample_every_chunk() -> dict:
    """A 20-token prompt in chunks of 8, 8 and 4 on the tiny model, greedy, 6 tokens: as it is, and with
    every chunk sampling a token (question 2); then what the answer says the wrong tokens are."""
    from minipaged import LLM, SamplingParams
    from minipaged.step import ScheduledSeq

    def greedy(llm, prompt, n):
        params = SamplingParams(temperature=0, max_tokens=n)
        return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids

    prompt = list(range(1, 21))
    llm = LLM("tiny", kv_policy="on_demand", enable_chunked_prefill=True, max_num_batched_tokens=8, max_num_seqs=4)
    right = greedy(llm, prompt, 6)
    with _patched(ScheduledSeq, "completes", property(lambda self: True)):  # `if not work.completes` never skips
        wrong = greedy(llm, prompt, 6)
    whole = LLM("tiny", kv_policy="on_demand")  # no chunks: the oracle
    after_chunks = [greedy(whole, prompt[:8], 1)[0], greedy(whole, prompt[:16], 1)[0]]
    return {"right": right, "wrong": wrong, "after_chunks": after_chunks,
            "answer_to_them": greedy(whole, prompt + after_chunks, 4)}


def _half_while_one_waits(self, plan) -> int:
    """ChunkedPrefillScheduler._prefill_budget where a prompt part-way through gets at most half of what
    the decodes leave while a waiting request could be admitted (question 4), so that the admission
    after it takes the other half."""
    left = self._budget_left(plan)
    if self.waiting and self.num_running_seqs() + self.waiting[0].num_seqs <= self.max_num_seqs:
        return max(1, left // 2)
    return left


def _chunked_trace(capacity=65536, budget=256, **kw):
    from minipaged.kv import make_policy
    from minipaged.lab.simulator.chunked import make_chunked_workload
    from minipaged.lab.simulator.serving import simulate_serving

    policy = make_policy("on_demand", num_slots=capacity, block_size=16, max_model_len=4096)
    requests = make_chunked_workload()
    return requests, simulate_serving("continuous", policy, requests, max_num_seqs=32, max_num_batched_tokens=budget,
                                      enable_chunked_prefill=True, **kw)


@answer("08/two_partials")
def two_partials() -> dict:
    """Median times to first token, chat requests and documents, on `simulate --chunked`'s trace at four
    budgets, with two prompts allowed part-way at once (question 4); the runs as they are are the record."""
    from minipaged.lab.simulator.chunked import DEFAULTS, costs
    from minipaged.scheduler.chunked import ChunkedPrefillScheduler

    requests, run = _chunked_trace(budget=256)  # as it is: the record's row, to show the runs compare
    out = {"unchanged_256": {k: costs(run, requests, DEFAULTS["step_overhead"])[k]
                             for k in ("ttft_short_p50", "ttft_long_p50")}}
    with _patched(ChunkedPrefillScheduler, "_prefill_budget", _half_while_one_waits):
        for budget in (512, 256, 128, 64):
            requests, run = _chunked_trace(budget=budget)
            row = costs(run, requests, DEFAULTS["step_overhead"])
            out[str(budget)] = {"ttft_short_p50": row["ttft_short_p50"], "ttft_long_p50": row["ttft_long_p50"]}
    return out


def _one_block_at_admission(self, prompt_len, max_new_tokens, final_len) -> int:
    """OnDemandPolicy._slots_needed taking one block at admission (question 5)."""
    return self.block_size


def _what_fits(schedule_chunks):
    """ChunkedPrefillScheduler._schedule_chunks shortening each chunk to what the pool can give
    (question 5); ``schedule_chunks``: the real one, given one chunk at a time."""
    def schedule_what_fits(self, request, chunks, plan) -> None:
        for seq_id, n in chunks:
            while n > 1 and not self.policy.can_append_slots(seq_id, n):
                n -= 1
            schedule_chunks(self, request, [(seq_id, n)], plan)
    return schedule_what_fits


@answer("08/allocate_late")
def allocate_late() -> dict:
    """`simulate --chunked`'s trace at a budget of 256 in two small pools, with a prompt's blocks taken at
    admission (as it is) and chunk by chunk (question 5)."""
    from minipaged.kv.on_demand import OnDemandPolicy
    from minipaged.scheduler.chunked import ChunkedPrefillScheduler

    def row(run):
        return {"steps": run.steps, "mean_batch": run.mean_batch, "preemptions": run.preemptions,
                "tokens_computed": run.tokens_computed}

    out, what_fits = {}, _what_fits(ChunkedPrefillScheduler._schedule_chunks)
    for capacity in (8192, 16384):
        out[str(capacity)] = {"admission": row(_chunked_trace(capacity)[1])}
        with _patched(OnDemandPolicy, "_slots_needed", _one_block_at_admission), \
                _patched(ChunkedPrefillScheduler, "_schedule_chunks", what_fits):
            out[str(capacity)]["chunks"] = row(_chunked_trace(capacity)[1])
    return out


@answer("08/step_overhead")
def step_overhead() -> dict:
    """The budgets of `simulate --chunked --step-overhead 300` against the 5% mark, and the extra cost
    of budget 256 as extra steps times the overhead (question 3): arithmetic on chapter 08's records."""
    rows = _record("08/simulate_chunked_overhead_300")["rows"]
    default = _record("08/simulate_chunked")["rows"]
    overhead = _record("08/simulate_chunked_overhead_300")["config"]["step_overhead"]
    default_overhead = _record("08/simulate_chunked")["config"]["step_overhead"]
    whole, by_budget = rows[0], {r["budget"]: r for r in rows}
    mark = 0.05 * whole["total"]
    inside = [r for r in rows[1:] if r["total"] - whole["total"] <= mark]
    extra_steps = by_budget[256]["steps"] - whole["steps"]
    return {"mark": mark, "best_inside": min(inside, key=lambda r: r["itl_p99"])["budget"],
            "extra_512": by_budget[512]["total"] - whole["total"],
            "extra_256": by_budget[256]["total"] - whole["total"],
            "extra_steps_256": extra_steps, "extra_steps_256_cost": extra_steps * overhead,
            "extra_steps_256_default_cost": extra_steps * default_overhead,
            "default_256_inside": default[4]["total"] - default[0]["total"] <= 0.05 * default[0]["total"]}


# ---------------------------------------------------------------- chapter 09


@answer("09/longer_look")
def longer_look() -> dict:
    """Tokens per drafted step by the notebook's formula, 1 + a + ... + a^k, with `a` the acceptance that
    `bench speculative --k 1 2 4 8 16 --repeats 1` measured at k = 1 (question 4)."""
    modes = _record("09/bench_speculative_k")["modes"]["one at a time"]
    out = {}
    for kind in ("open", "copy"):
        a = modes[kind]["1"]["acceptance"]
        passes = {k: modes[kind][str(k)]["passes"] for k in (2, 4, 8, 16)}
        out[kind] = {"a": a, "ceiling": 1 / (1 - a),
                     "tokens": {str(k): sum(a ** i for i in range(k + 1)) for k in (1, 2, 4, 8, 16)},
                     "saved_2_to_4": passes[2] - passes[4], "saved_8_to_16": passes[8] - passes[16]}
    return out


# ---------------------------------------------------------------- chapter 10


@answer("10/count_reads")
def count_reads() -> dict:
    """Bytes one layer's decode attention fetches at SmolLM2, batch 64, 2,048 tokens, fp16 (question 1):
    v1 reads each KV head once, the classic kernel once per query head."""
    from minipaged.lab.bench.kernels import decode_attention_bytes
    from minipaged.model.config import SMOLLM2_135M as m

    batch, context, itemsize = 64, 2048, 2
    per_token_head = 2 * m.head_dim * itemsize  # K and V of one token, one KV head
    v1_kv = batch * context * m.num_kv_heads * per_token_head
    classic = batch * context * m.num_heads * per_token_head
    return {"per_token_head": per_token_head, "v1_kv_mb": v1_kv / 1e6,
            "q_and_out_mb": (decode_attention_bytes(m, batch, context) - v1_kv) / 1e6,
            "v1_mb": decode_attention_bytes(m, batch, context) / 1e6, "classic_mb": classic / 1e6,
            "ratio": classic / v1_kv, "difference_mb": (classic - v1_kv) / 1e6,
            "difference_all_layers_gb": m.num_layers * (classic - v1_kv) / 1e9}


@answer("10/half_shared")
def half_shared() -> dict:
    """Shared memory of a v1 block when the K and V tiles are kept in fp16, padded by two (question 2)."""
    from minipaged.attention.kernels.config import KernelConfig

    out = {}
    for d in (64, 128):
        cfg = KernelConfig.for_head_dim(d)
        fp32_tiles = 4 * 2 * cfg.tile_tokens * (d + 1)
        fp16_tiles = 2 * 2 * cfg.tile_tokens * (d + 2)
        out[str(d)] = {"tile_tokens": cfg.tile_tokens, "shared_bytes": cfg.shared_bytes, "fp32_tiles": fp32_tiles,
                       "fp16_tiles": fp16_tiles, "fp16_shared_bytes": cfg.shared_bytes - fp32_tiles + fp16_tiles,
                       "blocks_ratio": cfg.shared_bytes / (cfg.shared_bytes - fp32_tiles + fp16_tiles)}
    out["padded_row_words"] = (64 + 1) * 2 / 4
    return out


@answer("10/prefetch")
def prefetch() -> dict:
    """Registers each thread needs to hold the next tile at head_dim 64 (question 3)."""
    from minipaged.attention.kernels.config import KernelConfig

    cfg = KernelConfig.for_head_dim(64)
    return {"tile_tokens": cfg.tile_tokens, "next_tile_per_thread": 2 * cfg.tile_tokens * 64 // cfg.num_threads,
            "acc_slots": cfg.acc_slots}


@answer("10/parallel_softmax")
def parallel_softmax() -> dict:
    """Threads per row, and the two shared arrays of partial results, when every row's softmax step is
    shared by ``num_threads // max_rows`` threads (question 4)."""
    from minipaged.attention.kernels.config import KernelConfig

    configs = {"64": KernelConfig.for_head_dim(64), "128": KernelConfig.for_head_dim(128),
               "simulator": KernelConfig.for_simulator(64)}
    out = {name: {"threads_per_row": c.num_threads // c.max_rows, "max_rows": c.max_rows}
           for name, c in configs.items()}
    out["64"]["arrays_bytes"] = 2 * 4 * configs["64"].max_rows * out["64"]["threads_per_row"]  # two fp32 arrays
    return out


@answer("10/tune_rule")
def tune_rule() -> dict:
    """The v1/v2 rule's partition count on the benchmark's three swept shapes, at 132 SMs, as is and with
    one of its two constants changed (question 5)."""
    from minipaged.attention.kernels import config
    from minipaged.model.config import LLAMA_8B, SMOLLM2_135M

    shapes = {"smollm2_64x2048": (SMOLLM2_135M, 64, 2048), "smollm2_4x8192": (SMOLLM2_135M, 4, 8192),
              "llama8b_16x2048": (LLAMA_8B, 16, 2048)}

    def parts(m, batch, context):
        cfg = config.KernelConfig.for_head_dim(m.head_dim)
        plan = config.plan_launch(batch, m.num_kv_heads, m.num_heads // m.num_kv_heads, 1, context, cfg,
                                  num_sms=132, kernel="v2")
        return {"partitions": plan.num_partitions, "partition_tokens": plan.partition_tokens}

    out = {}
    for name, shape in shapes.items():
        row = {"rule": parts(*shape)}
        for value in (2, 4, 8, 16, 32):
            with _patched(config, "BLOCKS_PER_SM", value):
                row[f"blocks_per_sm_{value}"] = parts(*shape)["partitions"]
        for value in (128, 256, 512, 1024):
            with _patched(config, "MIN_PARTITION_TOKENS", value):
                row[f"min_tokens_{value}"] = parts(*shape)["partitions"]
        out[name] = row
    return out


# ---------------------------------------------------------------- the command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.answers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NN/NAME", help="the computations to run")
    parser.add_argument("--list", action="store_true", help="list every computation")
    args = parser.parse_args(argv)
    if args.list or not args.names:
        for name, fn in sorted(REGISTRY.items()):
            print(f"{name:24} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    try:
        results = {name: compute(name) for name in args.names}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(results[args.names[0]] if len(args.names) == 1 else results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
