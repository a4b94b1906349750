"""Chapter 11's benchmark: the vLLM paper's headline figure (Fig. 12), normalized latency against
request rate, for five systems with the same KV memory.

    python -m minipaged bench online [--model smollm2-135m] [--requests 300] [--seeds 3]
                                     [--real-requests 48] [--real-seeds 2] [--plot-dir DIR] [--json]
    python -m minipaged bench online --model tiny            # the same on the tiny model, in about 4 minutes

The five systems are the paper's (section 6.2), each with the same model, max_model_len,
max_num_seqs and KV capacity in token slots (``minipaged/lab/simulator/online.py``'s ``SYSTEMS``):
static batching over max_model_len slabs; Orca (continuous batching) reserving max_model_len
("max"), the next power of two of prompt + max_tokens ("pow2"), or exactly what the request will
use ("oracle"); and vLLM, continuous batching over paged blocks of 16.

Requests arrive as a Poisson process (exponential gaps, seeded), open loop: each is sent at its
arrival time whether or not the earlier ones have finished, as real users do. The trace is chapter
06's ShareGPT-like lengths times --scale (``bench serving``'s ``make_trace``: random token ids as
prompts), every request decoding exactly its own output length (temperature 0, ``ignore_eos``).
The paper's y axis is the normalized latency: a request's end-to-end latency over its output
tokens (s/token), the mean over the finished requests.

The run has five parts, in this order:

1. Calibration. The paged engine, in this process, serves prompts of 8 to 240 tokens alone, then
   batches of 1 to 64 requests at once, and every step's time is recorded with the tokens it
   computed and the sequences in it. A step-time
   model, fixed + per_token x tokens + per_seq x sequences, is fitted to them (relative error).
2. The sweep, simulated. The model-free simulator (``simulator/online.py``: the real engine core,
   scheduler and KV policy, on a virtual clock that each step advances by the fitted time) serves
   --requests requests at each of --rates-count rates, for each system, over --seeds seeds (a seed
   draws both the trace and the arrivals). The rates are spaced evenly on a log scale, from 2% to
   150% of the paged system's all-at-once request rate (simulated). On two cores a real sweep this
   size would take hours; the simulator takes 25 to 45 s per system, all seeds and rates together,
   and its 48 rates are about 10% apart, so a knee is known to within 10%.
3. The real servers. Each system runs as a real server process (``python -m minipaged serve``),
   loaded at two rates, 0.6 and 1.5 times its simulated knee, over --real-seeds seeds of
   --real-requests requests; the client times each request's server-sent events. The simulator
   serves each of those exact traces too, so each real point has its simulated twin.
4. The server's price. The paged server and offline ``LLM.generate``, in turn, serve one trace all at
   once, twice each (each side keeps its better try: on two cores one noisy half minute would
   otherwise decide the ratio). Output tokens/s of both and the ratio, against a target of 90%.
5. Calibration again. The same steps, timed again at the end: how far the machine itself drifted
   while the servers ran (on a shared machine a step can slow by a tenth or more within minutes),
   which the simulated twins, priced by the first fit, cannot know.

With SmolLM2 on two cores the default run takes about 18 minutes: calibration a minute, the
simulated sweep two and a half, the rest the real servers (static batching's slow real rate alone
takes about six). With --model tiny it takes about 4 minutes (the simulated sweep costs the same
whatever the model), but the tiny model's steps cost less than the HTTP around them, so its real
servers sit far from the simulated ones.

Judging the sweep. The paper compares systems at the same latency, so there is one bar for all
five: the threshold is --sustain-factor (default 2) x the unloaded latency, the lowest mean normalized
latency any system shows at the lowest rate. A rate is *held* when, for every seed, the mean
normalized latency stays within the threshold (each simulated run goes on until every request has
finished, so every request counts). The sustained rate is an interval: the last rate held (with
every lower rate held too) and the first rate missed. Each seed is judged alone too (its own
unloaded latency, its last rate held): the spread.

What a client sees, measured on the client side from the server-sent events (one event per engine
step that produced text for a request): time to first token (TTFT), inter-token latency (ITL),
end-to-end latency, each from the request's *scheduled* arrival; their p50 and p99; achieved
requests/s and output tokens/s (finished requests over the time from the first arrival to the last
finish); goodput (requests/s that met both --slo-ttft and --slo-normalized). The simulator writes the
same records (each token's virtual time), so one summary reads both.

Noise: a GEMM of SmolLM2's shape is timed on all threads and on one before the run and after. If the
threads do not scale or the samples spread, another process is competing for the cores, and the
report says the numbers are unreliable.

With --plot-dir it draws online_latency.png from the result (``python -m minipaged.lab.plots.online
RECORD PNG`` draws it again from a record).

Not handled yet: real prompts (and so prefix-cache hits), sampling, requests that stop early, several
server processes, a load generator on another machine (here it shares the two cores), the server's
own time in the simulator (the real points show how far apart the two are).
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import random
import sys
import time

from minipaged.lab import capture
from minipaged.lab.bench import add_output_arguments
from minipaged.lab.bench.noise import describe_probe, gemm_probe, probe_pair
from minipaged.lab.bench.serving import add_trace_arguments, make_trace, random_prompt
from minipaged.lab.simulator.online import SYSTEMS, StepTimeModel, simulate
from minipaged.metrics_reader import percentile

OVERHEAD_TARGET = 0.9
OVERHEAD_PAIRS = 2  # offline, server, offline, server: the best of each side
CALIBRATION_BATCHES = (1, 2, 4, 8, 16, 32, 64)  # requests at once, for the step-time fit
PREFILL_LENGTHS = (8, 32, 64, 128, 240)  # prompt lengths served alone, for the step-time fit
RATE_SPAN = (0.02, 1.5)  # the sweep's rates, as fractions of the paged system's all-at-once rate
REAL_AT = (0.6, 1.5)  # the real servers' rates, as multiples of each system's simulated knee
RUN_KEYS = ("finished", "requests", "unfinished", "normalized_latency_s", "requests_per_s", "output_tokens_per_s",
            "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s", "e2e_p99_s",
            "goodput_requests_per_s", "duration_s")


# ---------------------------------------------------------------- the load generator (stdlib only)

def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """n arrival times (s): the first at 0, then exponential gaps of mean 1 / rate. The same seed
    gives the same gaps at every rate, stretched by 1 / rate; an infinite rate puts all at 0."""
    rng = random.Random(seed)
    gaps = [rng.expovariate(1.0) for _ in range(n - 1)]
    if math.isinf(rate):
        return [0.0] * n
    times, t = [0.0], 0.0
    for g in gaps:
        t += g / rate
        times.append(t)
    return times


async def _events(host: str, port: int, body: dict):
    """POST /v1/completions with ``body`` and yield each server-sent event's data (bytes) as it
    arrives. HTTP/1.1 by hand, over one connection per request (no client library: the generator
    shares the cores with the server, so it should cost little)."""
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                     % (host.encode(), port, len(payload)) + payload)
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip().lower()
        chunked = "chunked" in headers.get("transfer-encoding", "")
        if status != 200:
            rest = await reader.read(4096)
            raise RuntimeError(f"HTTP {status}: {rest.decode(errors='replace')[:300]}")
        buffer = b""
        while True:
            if chunked:
                size_line = await reader.readline()
                if not size_line:
                    break
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                piece = await reader.readexactly(size)
                await reader.readline()  # the CRLF after each chunk
            else:
                piece = await reader.read(65536)
                if not piece:
                    break
            buffer += piece
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.splitlines():
                    if line.startswith(b"data:"):
                        yield line[5:].strip()
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def _one_request(host, port, model, prompt, max_tokens, record, t0, cap):
    """Wait for the request's arrival time, send it, and fill ``record`` (times relative to t0)."""
    loop_now = time.perf_counter
    delay = t0 + record["arrival_s"] - loop_now()
    if delay > 0:
        await asyncio.sleep(delay)
    if loop_now() - t0 > cap:
        record["status"] = "not sent"
        return
    record["sent_s"] = loop_now() - t0
    record["status"] = "unfinished"
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    chunks, text = record["chunk_s"], []
    try:
        async for data in _events(host, port, body):
            now = loop_now() - t0
            if data == b"[DONE]":
                record["end_s"] = now
                break
            message = json.loads(data)
            if message.get("choices"):
                chunks.append(now)
                text.append(message["choices"][0].get("text") or "")
                if message["choices"][0].get("finish_reason") not in (None, "length", "stop"):
                    record["finish_reason"] = message["choices"][0]["finish_reason"]
            elif message.get("usage"):
                record["output_tokens"] = message["usage"]["completion_tokens"]
    except Exception as e:  # noqa: BLE001 - a failed request is reported, not fatal
        record["status"] = f"error: {e}"[:200]
        return
    record["text"] = "".join(text)
    if record.get("end_s") is None or not chunks:
        record["status"] = "error: the stream ended early"
    elif record.get("finish_reason"):
        record["status"] = f"error: finish_reason {record['finish_reason']}"
    elif record.get("output_tokens") != max_tokens:
        record["status"] = f"error: {record.get('output_tokens')} output tokens, asked for {max_tokens}"
    else:
        record["status"] = "ok"


async def _drive(url: str, model: str, trace, arrivals, cap: float) -> list[dict]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    records = [{"arrival_s": a, "expected_tokens": n, "prompt_tokens": len(p), "sent_s": None, "end_s": None,
                "output_tokens": None, "chunk_s": [], "status": "not sent"} for (p, n), a in zip(trace, arrivals)]
    t0 = time.perf_counter() + 0.05
    tasks = [asyncio.create_task(_one_request(host, int(port), model, p, n, r, t0, cap))
             for (p, n), r in zip(trace, records)]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, t0 + cap - time.perf_counter()))
    for task in pending:  # past the cap: hang up; the server aborts what it was computing
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return records


def send_load(server, model: str, trace, arrivals, cap: float) -> list[dict]:
    """One open-loop run against a running server; waits for it to be idle again afterwards."""
    records = asyncio.run(_drive(server.url, model, trace, arrivals, cap))
    server.wait_idle(60)
    return records


def summarize(records: list[dict], cap: float, slo_ttft: float, slo_normalized: float) -> dict:
    """What one run's records say (times in seconds)."""
    done = [r for r in records if r["status"] == "ok"]
    ttft = [r["chunk_s"][0] - r["arrival_s"] for r in done]
    e2e = [r["end_s"] - r["arrival_s"] for r in done]
    gaps = [b - a for r in done for a, b in zip(r["chunk_s"], r["chunk_s"][1:])]
    normalized = [(r["end_s"] - r["arrival_s"]) / r["output_tokens"] for r in done]
    good = sum(1 for t, n in zip(ttft, normalized) if t <= slo_ttft and n <= slo_normalized)
    duration = max((r["end_s"] for r in done), default=cap)
    tokens = sum(r["output_tokens"] for r in done)
    lags = [r["sent_s"] - r["arrival_s"] for r in records if r["sent_s"] is not None]
    return {"requests": len(records), "finished": len(done),
            "unfinished": sum(1 for r in records if r["status"] in ("unfinished", "not sent")),
            "errors": sorted({r["status"] for r in records if r["status"].startswith("error")}),
            "duration_s": duration, "requests_per_s": len(done) / duration if duration > 0 else 0.0,
            "output_tokens": tokens, "output_tokens_per_s": tokens / duration if duration > 0 else 0.0,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
            "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
            "normalized_latency_s": sum(normalized) / len(normalized) if normalized else None,
            "slo_met": good, "goodput_requests_per_s": good / duration if duration > 0 else 0.0,
            "max_send_lag_s": max(lags, default=0.0),
            "per_request": [{"arrival_s": r["arrival_s"], "status": r["status"], "prompt_tokens": r["prompt_tokens"],
                             "expected_tokens": r["expected_tokens"], "output_tokens": r["output_tokens"],
                             "chunks": len(r["chunk_s"]),
                             "ttft_s": r["chunk_s"][0] - r["arrival_s"] if r["chunk_s"] else None,
                             "e2e_s": r["end_s"] - r["arrival_s"] if r["end_s"] is not None else None}
                            for r in records]}


# ---------------------------------------------------------------- the benchmark

def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def _server_flags(fields: dict, max_model_len, max_num_seqs, kv_capacity) -> list[str]:
    """``python -m minipaged serve`` flags: the shared sizes, then the system's own EngineArgs fields
    (a bool as ``--name`` or ``--no-name``)."""
    flags = ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
             "--kv-capacity-tokens", str(kv_capacity)]
    for name, value in fields.items():
        flag = name.replace("_", "-")
        flags += [f"--{flag}" if value else f"--no-{flag}"] if isinstance(value, bool) else [f"--{flag}", str(value)]
    return flags


def _warm_up(server, model, trace) -> None:
    send_load(server, model, [(trace[0][0], 2), (trace[1 % len(trace)][0], 2)], [0.0, 0.0], cap=120.0)


def offline_run(llm, trace) -> dict:
    """The trace, all at once, through offline LLM.generate (greedy, exact lengths)."""
    from minipaged import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in trace]
    prompts = [p for p, _ in trace]
    llm.generate(prompts[:2], [SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)] * 2, use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert tokens == sum(n for _, n in trace), "offline generate did not produce every requested token"
    return {"seconds": seconds, "output_tokens": tokens, "output_tokens_per_s": tokens / seconds,
            "requests_per_s": len(trace) / seconds, "texts": [o.outputs[0].text for o in outs]}


def calibrate(llm, trace, batches=CALIBRATION_BATCHES, progress=False) -> tuple[StepTimeModel, list]:
    """Serve prompts alone (PREFILL_LENGTHS tokens, 1 and 4 at once), then ``trace``'s requests in
    groups of each size in ``batches``, all of a group at once, and fit the step-time model on every
    step's (tokens computed, sequences, seconds). A group's batch shrinks as its requests finish, so
    each group gives decode steps of many sizes; the prompts alone give the steps that price a token."""
    from minipaged import SamplingParams

    rows = []

    def keep(record):
        rows.append((record["num_tokens"], record["batch_size"], record["step_seconds"]))

    llm.generate([p for p, _ in trace[:2]], [SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)] * 2,
                 use_tqdm=False)  # warm-up, not fitted
    core = llm.engine.core
    core.metrics.steps.subscribe(keep)
    try:
        # prompts alone first, 1 to 4 at once and of several lengths: the steps that price a token
        rng = random.Random(len(trace))
        for length in PREFILL_LENGTHS:
            length = min(length, llm.max_model_len - 1)
            for size in (1, 4):
                prompts = [random_prompt(rng, length, llm.config.vocab_size) for _ in range(size)]
                llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
        _say(progress, f"  calibration: prompts of {', '.join(map(str, PREFILL_LENGTHS))} tokens, 1 and 4 at once")
        start = 0
        for size in batches:
            group = [trace[(start + i) % len(trace)] for i in range(size)]
            start += size
            t = time.perf_counter()
            llm.generate([p for p, _ in group],
                         [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in group],
                         use_tqdm=False)
            _say(progress, f"  calibration: {size} at once, {time.perf_counter() - t:.1f} s")
    finally:
        core.metrics.steps.unsubscribe(keep)
    return StepTimeModel.fit(rows), rows


def _stats(summary: dict) -> dict:
    return {k: summary[k] for k in RUN_KEYS}


def judge(systems: dict, factor: float) -> dict:
    """Mark each rate held or missed and give each system its sustained interval; returns the ratios.

    ``systems``: key -> {"runs": [{"rate", "seeds": [{"normalized_latency_s", "finished", "requests",
    "requests_per_s"}]}]}, the same rates ascending for every system. One bar for all: the baseline is
    the unloaded latency, the lowest over systems of the mean over seeds at the lowest rate, and a rate
    is held when, for every seed, all requests finished and the normalized latency is at most
    ``factor`` x the baseline. ``held_rate``: the highest rate held with every lower rate held (None
    if the lowest is missed); ``missed_rate``: the first rate missed (None if every rate was held).
    Each seed is judged alone too (``seed_held_rates``), against its own unloaded latency: the spread."""

    def ok(run, threshold):
        return (run["finished"] == run["requests"] and run["normalized_latency_s"] is not None
                and run["normalized_latency_s"] <= threshold)

    def mean(values):
        return sum(values) / len(values) if values and None not in values else None

    firsts = [mean([x["normalized_latency_s"] for x in s["runs"][0]["seeds"]]) for s in systems.values() if s["runs"]]
    base = min((x for x in firsts if x is not None), default=None)
    seeds = min((len(s["runs"][0]["seeds"]) for s in systems.values() if s["runs"]), default=0)
    seed_bases = [min((s["runs"][0]["seeds"][i]["normalized_latency_s"] for s in systems.values() if s["runs"]
                       and s["runs"][0]["seeds"][i]["normalized_latency_s"] is not None), default=None)
                  for i in range(seeds)]
    for s in systems.values():
        runs = s["runs"]
        s["baseline_s_per_token"] = base
        s["threshold_s_per_token"] = factor * base if base else None
        held, missed = None, None
        for run in runs:
            values = [x["normalized_latency_s"] for x in run["seeds"] if x["normalized_latency_s"] is not None]
            run["normalized_latency_s"] = sum(values) / len(values) if values else None
            run["normalized_min_s"], run["normalized_max_s"] = (min(values), max(values)) if values else (None, None)
            run["requests_per_s"] = sum(x["requests_per_s"] for x in run["seeds"]) / len(run["seeds"])
            run["held"] = bool(base) and missed is None and all(ok(x, s["threshold_s_per_token"]) for x in run["seeds"])
            if run["held"]:
                held = run["rate"]
            elif missed is None:
                missed = run["rate"]
        s["held_rate"], s["missed_rate"] = held, missed
        s["knee_rate"] = math.sqrt(held * missed) if held and missed else None
        s["seed_held_rates"] = []
        for i, base_i in enumerate(seed_bases):
            last = None
            for run in runs:
                if not (base_i and ok(run["seeds"][i], factor * base_i)):
                    break
                last = run["rate"]
            s["seed_held_rates"].append(last)
    ratios = {}
    paged = systems.get("paged")
    for key, s in systems.items():
        if key == "paged" or paged is None:
            continue
        h, o = paged["held_rate"], s["held_rate"]
        ratios[f"paged_vs_{key}"] = h / o if h and o else None
        # the interval the true ratio lies in: paged's knee is in [held, missed], the other's too
        low = h / s["missed_rate"] if h and s["missed_rate"] else None
        high = paged["missed_rate"] / o if paged["missed_rate"] and o else None
        ratios[f"paged_vs_{key}_low"], ratios[f"paged_vs_{key}_high"] = low, high
    return ratios


def _rates(saturation: float, count: int) -> list[float]:
    lo, hi = RATE_SPAN
    rates = [saturation * lo * (hi / lo) ** (i / (count - 1)) for i in range(count)]
    return sorted({float(f"{r:.2g}") for r in rates})


def run(model="smollm2-135m", requests=300, seeds=3, rates=None, rates_count=48, real_requests=48, real_seeds=2,
        scale=0.1, max_model_len=256, max_num_seqs=64, kv_capacity=1536, real_drain=30.0,
        slo_ttft=2.0, slo_normalized=0.25, sustain_factor=2.0, seed=0, systems=None, skip_real=False,
        skip_overhead=False, progress=True, plot_dir=None) -> dict:
    """The whole benchmark; returns one dict (``format_result`` prints it). ``rates``: the simulated
    sweep's requests/s (default: ``rates_count`` rates spanning RATE_SPAN of the paged system's
    all-at-once rate). ``systems``: keys of SYSTEMS (default all five)."""
    for name, value, low in (("requests", requests, 2), ("seeds", seeds, 1), ("real_requests", real_requests, 2),
                             ("real_seeds", real_seeds, 1), ("rates_count", rates_count, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    if rates is not None:
        rates = sorted(float(r) for r in rates)
        if len(rates) < 2 or rates[0] <= 0 or any(math.isinf(r) or math.isnan(r) for r in rates):
            raise ValueError(f"rates={rates!r} must be at least two positive, finite requests/s")
    for name, value in (("real_drain", real_drain), ("slo_ttft", slo_ttft),
                        ("slo_normalized", slo_normalized), ("sustain_factor", sustain_factor)):
        if not value > 0:
            raise ValueError(f"{name}={value!r} must be > 0")
    keys = list(SYSTEMS) if systems is None else list(systems)
    unknown = [k for k in keys if k not in SYSTEMS]
    if unknown or not keys:
        raise ValueError(f"systems={systems!r}: choose among {list(SYSTEMS)}")
    keys = [k for k in SYSTEMS if k in keys]  # the paper's order
    from minipaged import LLM

    started = time.perf_counter()
    probe_before = gemm_probe()
    if not probe_before["reliable"]:
        _say(progress, "warning: the GEMM probe ran slower than expected: another process is using the cores")
    # the paged system's engine, in this process: calibration, then the offline side of the overhead
    llm = LLM(model, max_model_len=max_model_len, max_num_seqs=max_num_seqs, kv_capacity_tokens=kv_capacity,
              progress=False, **SYSTEMS["paged"][1])
    vocab = llm.config.vocab_size
    shape = dict(kv_capacity=kv_capacity, max_model_len=max_model_len, max_num_seqs=max_num_seqs)

    # 1. calibration
    _say(progress, "1. calibration: the paged engine's steps, timed ...")
    step_model, rows = calibrate(llm, make_trace(64, scale, max_model_len, vocab, seed + 1000), progress=progress)
    _say(progress, f"  {_model_text(step_model)}")

    # 2. the simulated sweep
    traces = [make_trace(requests, scale, max_model_len, vocab, seed + i) for i in range(seeds)]
    unit = [poisson_arrivals(requests, 1.0, seed + i) for i in range(seeds)]
    saturation = summarize(simulate("paged", traces[0], [0.0] * requests, step_model, **shape),
                           math.inf, slo_ttft, slo_normalized)["requests_per_s"]
    rates_from = "given" if rates is not None else \
        f"{rates_count} rates from {RATE_SPAN[0]:g} to {RATE_SPAN[1]:g} x the paged system's all-at-once rate " \
        f"({saturation:.3g} req/s, simulated)"
    rates = rates if rates is not None else _rates(saturation, rates_count)
    _say(progress, f"2. the sweep, simulated: {len(keys)} systems x {seeds} seeds x {len(rates)} rates "
                   f"({rates[0]:g} to {rates[-1]:g} req/s), {requests} requests each ...")
    simulated = {}
    for key in keys:
        t = time.perf_counter()
        runs = []
        for rate in rates:
            per_seed = []
            for trace, gaps in zip(traces, unit):
                arrivals = [g / rate for g in gaps]
                out = simulate(key, trace, arrivals, step_model, **shape)  # until every request is done
                per_seed.append(_stats(summarize(out, math.inf, slo_ttft, slo_normalized)))
            runs.append({"rate": rate, "seeds": per_seed})
        simulated[key] = {"system": SYSTEMS[key][0], "key": key, "runs": runs}
        _say(progress, f"  {SYSTEMS[key][0]}: {time.perf_counter() - t:.1f} s")
    sim_ratios = judge(simulated, sustain_factor)
    for key in keys:
        s = simulated[key]
        _say(progress, f"  {s['system']}: held {_rate(s['held_rate'])}, missed {_rate(s['missed_rate'])}")

    # 3. the real servers, and 4. the server's price (with the paged server)
    real, overhead, offline_tries, server_tries = {}, None, [], []
    real_traces = [make_trace(real_requests, scale, max_model_len, vocab, seed + 100 + i) for i in range(real_seeds)]
    real_unit = [poisson_arrivals(real_requests, 1.0, seed + 100 + i) for i in range(real_seeds)]
    offline = None
    if not skip_overhead and "paged" in keys:
        offline = offline_run(llm, real_traces[0])
        offline_tries.append(offline["output_tokens_per_s"])
    for key in ([] if skip_real else keys):
        from minipaged.lab.server_process import ServerProcess

        s = simulated[key]
        knee = s["knee_rate"] or s["held_rate"] or s["missed_rate"] or rates[0]
        flags = _server_flags(SYSTEMS[key][1], max_model_len, max_num_seqs, kv_capacity)
        _say(progress, f"3. the real server: {s['system']} ({' '.join(flags)}) ...")
        runs = []
        with ServerProcess(model, *flags, startup_timeout=300) as server:
            _warm_up(server, model, real_traces[0])
            if key == "paged" and offline is not None:
                saturation_run, texts = None, None
                for attempt in range(OVERHEAD_PAIRS):
                    if attempt:
                        again = offline_run(llm, real_traces[0])  # the server idles meanwhile
                        offline_tries.append(again["output_tokens_per_s"])
                        offline = max(offline, again, key=lambda o: o["output_tokens_per_s"])
                    out = send_load(server, model, real_traces[0], [0.0] * real_requests, real_drain)
                    summary = summarize(out, real_drain, slo_ttft, slo_normalized)
                    server_tries.append(summary["output_tokens_per_s"])
                    if saturation_run is None or summary["output_tokens_per_s"] > saturation_run["output_tokens_per_s"]:
                        saturation_run, texts = summary, [r.get("text") for r in out]
                ratio = saturation_run["output_tokens_per_s"] / offline["output_tokens_per_s"]
                overhead = {"server_output_tokens_per_s": saturation_run["output_tokens_per_s"],
                            "offline_output_tokens_per_s": offline["output_tokens_per_s"],
                            "server_seconds": saturation_run["duration_s"], "offline_seconds": offline["seconds"],
                            "server_finished": saturation_run["finished"], "requests": real_requests,
                            "ratio": ratio, "target": OVERHEAD_TARGET, "meets_target": ratio >= OVERHEAD_TARGET,
                            "same_text_as_offline": sum(1 for a, b in zip(texts, offline["texts"]) if a == b),
                            "offline_tries": offline_tries, "server_tries": server_tries}
                _say(progress, f"  server {100 * ratio:.1f}% of offline LLM.generate's output tokens/s")
            for factor in REAL_AT:
                rate = float(f"{factor * knee:.2g}")
                per_seed, twins = [], []
                t = time.perf_counter()
                for trace, gaps in zip(real_traces, real_unit):
                    arrivals = [g / rate for g in gaps]
                    cap = arrivals[-1] + real_drain
                    summary = summarize(send_load(server, model, trace, arrivals, cap), cap, slo_ttft, slo_normalized)
                    per_seed.append(summary)
                    twin = simulate(key, trace, arrivals, step_model, drain=real_drain, **shape)
                    twins.append(_stats(summarize(twin, cap, slo_ttft, slo_normalized)))
                errors = sorted({e for x in per_seed for e in x["errors"]})
                real_norm = _mean([x["normalized_latency_s"] for x in per_seed])
                sim_norm = _mean([x["normalized_latency_s"] for x in twins])
                runs.append({"rate": rate, "times_knee": factor, "errors": errors,
                             "seeds": [_stats(x) for x in per_seed], "simulated": twins,
                             "normalized_latency_s": real_norm, "simulated_normalized_latency_s": sim_norm,
                             "real_over_simulated": real_norm / sim_norm if real_norm and sim_norm else None})
                _say(progress, f"  {rate:g} req/s ({factor:g} x knee): {_s(real_norm, 3)} s/token real, "
                               f"{_s(sim_norm, 3)} simulated ({time.perf_counter() - t:.0f} s)")
        real[key] = {"system": s["system"], "key": key, "flags": flags, "runs": runs,
                     "server_returncode": server.returncode}
    # the same calibration again: how far the machine itself drifted while the servers ran
    after, _ = calibrate(llm, make_trace(64, scale, max_model_len, vocab, seed + 1000))
    llm = None
    gc.collect()
    steps = {"decode_1": (1, 1), "decode_16": (16, 16), "prompt_128": (128, 1)}  # (tokens, sequences)
    drift = {name: after.seconds(*shape) / step_model.seconds(*shape) for name, shape in steps.items()}
    _say(progress, f"calibration again: {_model_text(after)}; a 1-sequence decode step now x{drift['decode_1']:.2f}, "
                   f"a 16-sequence one x{drift['decode_16']:.2f}, a 128-token prompt x{drift['prompt_128']:.2f}")
    probe_after = gemm_probe()
    ratios = [r["real_over_simulated"] for s in real.values() for r in s["runs"] if r["real_over_simulated"]]
    agreement = {"min": min(ratios), "max": max(ratios), "mean": sum(ratios) / len(ratios)} if ratios else None
    result = {"model": model, "scale": scale, "max_model_len": max_model_len, "max_num_seqs": max_num_seqs,
              "kv_capacity_tokens": kv_capacity, "seed": seed,
              "slo": {"ttft_s": slo_ttft, "normalized_s_per_token": slo_normalized}, "sustain_factor": sustain_factor,
              "trace": _trace_stats(traces[0]),
              "calibration": {"batches": list(CALIBRATION_BATCHES), "steps": len(rows),
                              "step_model": step_model.as_dict(), "step_model_after": after.as_dict(),
                              "drift": drift},
              "simulated": {"requests": requests, "seeds": seeds, "rates": rates, "rates_from": rates_from,
                            "baseline_s_per_token": simulated[keys[0]]["baseline_s_per_token"],
                            "threshold_s_per_token": simulated[keys[0]]["threshold_s_per_token"],
                            "paged_all_at_once_requests_per_s": saturation,
                            "systems": simulated, "ratios": sim_ratios},
              "real": {"requests": real_requests, "seeds": real_seeds, "times_knee": list(REAL_AT),
                       "drain_s": real_drain, "systems": real, "agreement": agreement},
              "overhead": overhead, "probe": probe_pair(probe_before, probe_after), "seconds": None}
    if plot_dir:
        from minipaged.lab.plots.online import plot_online_latency

        os.makedirs(plot_dir, exist_ok=True)
        path = os.path.join(plot_dir, "online_latency.png")
        plot_online_latency(result, path=path)
        result["plots"] = [path]
    result["seconds"] = time.perf_counter() - started
    return result


def _model_text(m: StepTimeModel) -> str:
    return (f"step = {1000 * m.fixed_s:.1f} ms + {1000 * m.per_token_s:.2f} ms x tokens + {1000 * m.per_seq_s:.2f} ms "
            f"x sequences ({m.steps} steps, median error {100 * m.median_error:.0f}%)")


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _trace_stats(trace) -> dict:
    outputs = [n for _, n in trace]
    return {"mean_prompt": sum(len(p) for p, _ in trace) / len(trace), "mean_output": sum(outputs) / len(trace),
            "max_output": max(outputs), "max_total": max(len(p) + n for p, n in trace)}


# ---------------------------------------------------------------- printing

def _ms(x) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def _s(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rate(value) -> str:
    return "none" if value is None else f"{value:g} req/s"


def format_result(r: dict) -> str:
    sim, real, c = r["simulated"], r["real"], r["calibration"]["step_model"]
    t = r["trace"]
    lines = [f"{r['model']}: ShareGPT-like requests x{r['scale']} (mean prompt {t['mean_prompt']:.1f}, mean output "
             f"{t['mean_output']:.1f}, longest output {t['max_output']} tokens), Poisson arrivals; KV capacity "
             f"{r['kv_capacity_tokens']} slots, max_model_len {r['max_model_len']}, max_num_seqs {r['max_num_seqs']}",
             "",
             "== calibration ==",
             f"(the paged engine in this process, {r['calibration']['steps']} steps)",
             f"step time = {1000 * c['fixed_s']:.1f} ms + {1000 * c['per_token_s']:.2f} ms x tokens computed + "
             f"{1000 * c['per_seq_s']:.2f} ms x sequences (median error {100 * c['median_error']:.0f}%)",
             "taken again at the end, the same steps took: " + ", ".join(
                 f"{name.replace('_', ' ')} x{value:.2f}" for name, value in r["calibration"]["drift"].items())
             + " (decode n: a step of n sequences; prompt 128: one prompt of 128 tokens)",
             "",
             "== simulated ==",
             f"({sim['requests']} requests x {sim['seeds']} seeds at each rate; rates: "
             f"{sim['rates_from']}; each run goes on until every request has finished)"]
    head = f"{'rate':>7}" + "".join(f"{s['key']:>13}" for s in sim["systems"].values())
    lines += [f"mean normalized latency, s/token (* = held: every seed stayed within {r['sustain_factor']:g} x "
              f"the unloaded {_s(sim['baseline_s_per_token'], 3)} = {_s(sim['threshold_s_per_token'], 3)})",
              head, "-" * len(head)]
    for i, rate in enumerate(sim["rates"]):
        cells = ""
        for s in sim["systems"].values():
            run = s["runs"][i]
            cells += f"{_s(run['normalized_latency_s'], 3) + ('*' if run['held'] else ' '):>13}"
        lines.append(f"{rate:>7g}{cells}")
    lines.append("")
    lines.append("sustained rate: last held -> first missed (each seed's last held)")
    for s in sim["systems"].values():
        seeds = ", ".join("-" if x is None else f"{x:g}" for x in s["seed_held_rates"])
        lines.append(f"  {s['system']:<40} {_rate(s['held_rate']):>12} -> {_rate(s['missed_rate']):<12} ({seeds})")
    for key, value in sim["ratios"].items():
        if key.endswith(("_low", "_high")):
            continue
        low, high = sim["ratios"][f"{key}_low"], sim["ratios"][f"{key}_high"]
        lines.append(f"  {key}: {'-' if value is None else f'{value:.2f}x'} of the held rate "
                     f"(between {'-' if low is None else f'{low:.2f}'} and {'-' if high is None else f'{high:.2f}'})")
    if real["systems"]:
        lines += ["", "== real ==", f"(real servers: {real['requests']} requests x {real['seeds']} seeds at "
                      f"{' and '.join(f'{x:g}' for x in real['times_knee'])} x each simulated knee; each run ends "
                      f"{real['drain_s']:g} s after its last arrival)"]
        head = (f"{'system':<40}{'rate':>6}{'done':>8}{'s/token':>9}{'sim':>7}{'real/sim':>9}{'TTFT p50':>9}"
                f"{'p99':>7}{'ITL p50':>8}{'req/s':>7}")
        lines += ["(s/token: mean over seeds; TTFT, ITL in ms, first seed)", head, "-" * len(head)]
        for s in real["systems"].values():
            for run in s["runs"]:
                first = run["seeds"][0]
                done = f"{sum(x['finished'] for x in run['seeds'])}/{sum(x['requests'] for x in run['seeds'])}"
                ratio = run["real_over_simulated"]
                lines.append(f"{s['system']:<40}{run['rate']:>6g}{done:>8}{_s(run['normalized_latency_s'], 3):>9}"
                             f"{_s(run['simulated_normalized_latency_s'], 3):>7}"
                             f"{'-' if ratio is None else f'{ratio:.2f}':>9}{_ms(first['ttft_p50_s']):>9}"
                             f"{_ms(first['ttft_p99_s']):>7}{_ms(first['itl_p50_s']):>8}{first['requests_per_s']:>7.2f}")
                if run["errors"]:
                    lines.append(f"        errors: {'; '.join(run['errors'])}")
        a = real["agreement"]
        if a:
            lines.append(f"real / simulated normalized latency, every real run: {a['min']:.2f} to {a['max']:.2f} "
                         f"(mean {a['mean']:.2f})")
    o = r["overhead"]
    if o:
        lines += ["", "== overhead ==", f"(the paged system, {o['requests']} requests at once; offline and "
                      f"server alternated, the best of each; tries: offline "
                      f"{', '.join(f'{x:.1f}' for x in o['offline_tries'])}, server "
                      f"{', '.join(f'{x:.1f}' for x in o['server_tries'])} tok/s)",
                  f"through the server {o['server_output_tokens_per_s']:.1f} output tok/s, offline LLM.generate "
                  f"{o['offline_output_tokens_per_s']:.1f}: server / offline = {100 * o['ratio']:.1f}% (target >= "
                  f"{100 * o['target']:.0f}%: {'met' if o['meets_target'] else 'NOT met'}); the same greedy text: "
                  f"{o['same_text_as_offline']}/{o['requests']} requests"]
    lines += ["", "== noise ==", *describe_probe(r["probe"])]
    for path in r.get("plots", []):
        lines.append(f"saved {path}")
    lines.append(f"({r['seconds']:.0f} s in all)")
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{text!r} must be comma-separated numbers, e.g. 0.5,1,2") from None
    if not values:
        raise ValueError(f"{text!r} lists no numbers")
    return values


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m; 'tiny' is fast)")
    p.add_argument("--requests", type=int, default=300, help="simulated requests at every rate (default: 300)")
    p.add_argument("--seeds", type=int, default=3, help="simulated repeats of every rate (default: 3)")
    p.add_argument("--rates", default=None,
                   help="the simulated sweep's request rates (requests/s), comma-separated (default: --rates-count "
                        f"rates from {RATE_SPAN[0]:g} to {RATE_SPAN[1]:g} x the paged all-at-once rate)")
    p.add_argument("--rates-count", type=int, default=48, help="how many rates the default sweep has (default: 48)")
    p.add_argument("--real-requests", type=int, default=48,
                   help="requests per real-server run (default: 48)")
    p.add_argument("--real-seeds", type=int, default=2, help="repeats of every real-server run (default: 2)")
    add_trace_arguments(p)
    p.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in a running batch (default: 64)")
    p.add_argument("--real-drain-seconds", type=float, default=30.0,
                   help="the real cap: requests not done this long after the last arrival are cancelled "
                        "(default: 30)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput's time-to-first-token target, s (default: 2)")
    p.add_argument("--slo-normalized", type=float, default=0.25,
                   help="goodput's normalized-latency target, s/token (default: 0.25)")
    p.add_argument("--sustain-factor", type=float, default=2.0,
                   help="a rate is held while every seed's mean normalized latency <= this x the unloaded "
                        "latency (the lowest any system shows at the lowest rate), one bar for all (default: 2)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"which systems, comma-separated among {', '.join(SYSTEMS)} (default: all)")
    p.add_argument("--skip-real", action="store_true", help="the simulated sweep only (no server is started)")
    p.add_argument("--skip-overhead", action="store_true", help="skip the server-vs-offline comparison")
    p.add_argument("--seed", type=int, default=0, help="the first trace and arrival seed (default: 0)")
    add_output_arguments(p, "online_latency.png")


def main(args) -> int:
    rates = _floats(args.rates) if args.rates else None
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise ValueError(f"--systems: unknown {unknown}; choose among {', '.join(SYSTEMS)}")
    r = run(args.model, requests=args.requests, seeds=args.seeds, rates=rates, rates_count=args.rates_count,
            real_requests=args.real_requests, real_seeds=args.real_seeds, scale=args.scale,
            max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs, kv_capacity=args.kv_capacity,
            real_drain=args.real_drain_seconds, slo_ttft=args.slo_ttft,
            slo_normalized=args.slo_normalized, sustain_factor=args.sustain_factor, seed=args.seed, systems=systems,
            skip_real=args.skip_real, skip_overhead=args.skip_overhead, progress=True, plot_dir=args.plot_dir)
    capture.publish(r)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(format_result(r))
    failed = any(run["errors"] for s in r["real"]["systems"].values() for run in s["runs"])
    return 1 if failed else 0
