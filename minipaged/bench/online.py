"""Chapter 11's benchmark: the vLLM paper's headline figure, measured through the HTTP server.

    python -m minipaged bench online [--model smollm2-135m] [--requests 24] [--rates 0.4,0.8,1.5]
                                     [--drain-seconds 60] [--systems static,orca,paged] [--plot-dir DIR] [--json]
    python -m minipaged bench online --model tiny            # the same on the tiny model, in under a minute

An open-loop load generator. Requests arrive as a Poisson process (exponential gaps, seeded) at each
of several rates, and each is sent at its arrival time whether or not the earlier ones have finished,
as real users do. Each rate replays the same trace: chapter 06's ShareGPT-like lengths scaled by
--scale (``bench serving``'s ``make_trace``: seeded random token ids as prompts), every request
streaming exactly its own output length (temperature 0, ``ignore_eos``), and the same seeded gaps,
only stretched by 1 / rate. Three systems, each a real server process (``python -m minipaged serve``)
with the same model, max_model_len, max_num_seqs and KV capacity:

    static + contiguous            --kv-policy contiguous --scheduler static: a batch runs until its
                                   longest request ends; every request holds a slab of max_model_len
    Orca: continuous + contiguous  --kv-policy contiguous --scheduler continuous: requests join and
                                   leave at every step (iteration-level scheduling), but each still
                                   holds a max_model_len slab, so few fit at once
    vLLM: continuous + paged       the engine's defaults: blocks of 16 taken as tokens arrive (the
                                   prefix cache is on, but random-token prompts never hit it)

What a client sees, measured on the client side from the server-sent events (one event per engine
step that produced text for a request): time to first token (TTFT), inter-token latency (ITL: the
gaps between a request's events; a step whose bytes the detokenizer holds back sends nothing, so a
gap can span two steps), end-to-end latency, each from the request's *scheduled* arrival (a late
send counts against the server's numbers, not in their favour), and their p50 and p99; the achieved
requests/s and output tokens/s (finished requests over the time from the first arrival to the last
finish); the paper's y axis, normalized latency (a request's end-to-end latency over its output
tokens, in s/token, the mean over finished requests); and goodput: finished requests per second that
met both --slo-ttft and --slo-normalized. Token counts come from the stream's last chunk
(``stream_options.include_usage``); a request whose count differs from what it asked for is an error.

Summary: the rate each system *sustains* before its latency climbs: the highest tested rate at which
it, and every lower tested rate, finished every request within the cap with a mean normalized
latency at most --sustain-factor (default 2) times its own at the lowest tested rate (each system's
own baseline: static batching is slower even when nearly idle, since a request that arrives during
a batch waits for the whole batch, and what is asked here is where each curve bends). Then the
ratios of the sustained rates, paged over static and paged over Orca (">=" when paged sustained the
highest rate tried, so the true ratio may be larger), and of the goodputs at the highest rate.

Server overhead: the same trace, all at once (saturation), through the paged server and through
offline ``LLM(model, same options).generate`` in this process, alternated: offline, server,
offline (while the server idles), server. Each side keeps its better try, since one noisy half
minute on two cores would otherwise decide the ratio; the report prints every try. Output tokens/s
of both and the ratio, against a target of at least 90%. The server pays for HTTP, JSON, streaming,
the asyncio engine loop, and the load generator itself, which shares this machine's cores. The
server steps the engine on its main thread (serve.py): from any other thread the same step runs
about 1.5x slower on two cores, because torch's OpenMP workers spin for the main thread's team only.

Noise: a GEMM of SmolLM2's shape (512 x 576 @ 576 x 576, fp32), timed on all torch threads and on
one before the runs and again after. If all threads together are not clearly faster than one (the
expectation: one thread's best time divided by the threads, for perfect scaling), or the samples
spread widely, another process is competing for the cores and the warning says the numbers are
unreliable. The 1-minute load average is printed beside it.

Defaults and why. 24 requests at x0.1 of ShareGPT's lengths (mean prompt 16 tokens, mean output 34,
the longest 150; max_model_len 256), KV capacity 1536 slots (six slabs of 256, as in ``bench
serving``), max_num_seqs 32. Without --rates the rates are fractions of the paged server's
saturation request rate, measured first (--rate-fractions 0.25,0.5,0.75,1,1.5,2.5): from a nearly
idle server to a paged system well past its capacity, so that each system's knee falls inside the
range whatever the machine's speed. With SmolLM2-135M on two CPU cores the whole default run took
14 minutes (836 s, on a machine busy with other work); most of it is the lowest rate's arrival span
(about 60 s per system) and the static
system's queue (it drains about 0.5 requests/s). With --model tiny it takes under a minute, but the
tiny model's steps cost less than the HTTP around them, so its figure measures the server, not
the KV policy. The SLOs (TTFT 2 s, 0.25 s/token) are loose for SmolLM2 on two cores at light load
(about 0.1 s/token and TTFT under 0.5 s); a queue breaks them. The cap: each (system, rate) run ends
--drain-seconds (default 60) after its last arrival; requests still running then are cancelled (the
server aborts them) and counted as unfinished, in the table's "done" column, and a run with any
unfinished request is not sustained. Few requests keep the run short, at a price: p99 is nearly the
maximum, and the longest request's own decode (about 11 s alone) ends every run, so achieved
requests/s stay below the offered rate even when a system keeps up.

With --plot-dir it draws online_latency.png: normalized latency against request rate, one line per
system, each with its sustain threshold (dashed), and achieved against offered requests/s.

Not handled yet: real prompts (and so prefix-cache hits), sampling, requests that stop early, several
server processes, a load generator on another machine (here it shares the two cores), repeats (each
point is one run: the numbers are noisy on a shared machine).
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

from minipaged import records
from minipaged.bench.noise import describe_probe, gemm_probe, probe_pair
from minipaged.bench.serving import make_trace
from minipaged.metrics import percentile

SYSTEMS = [  # (label, key, server flags)
    ("static + contiguous", "static", ("--kv-policy", "contiguous", "--scheduler", "static")),
    ("Orca: continuous + contiguous", "orca", ("--kv-policy", "contiguous", "--scheduler", "continuous")),
    ("vLLM: continuous + paged", "paged", ()),
]
RATE_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.5)
OVERHEAD_TARGET = 0.9
OVERHEAD_PAIRS = 2  # offline, server, offline, server: the best of each side


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


def _server_flags(extra, max_model_len, max_num_seqs, kv_capacity, attention) -> list[str]:
    return ["--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--kv-capacity-tokens", str(kv_capacity), "--attention-backend", attention, *extra]


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


def judge(systems: list[dict], factor: float) -> dict:
    """Mark each run sustained or not, set each system's sustained rate, and return the ratios.

    A system's baseline is its mean normalized latency at the lowest tested rate; a run is sustained
    when every request finished within the cap and its mean normalized latency is at most
    ``factor`` x the baseline; the sustained rate is the highest rate whose run, and every run at a
    lower rate, is sustained (None if the lowest is not)."""
    for s in systems:
        base = s["runs"][0]["normalized_latency_s"] if s["runs"] else None
        s["baseline_s_per_token"] = base
        s["threshold_s_per_token"] = factor * base if base else None
        sustained, climbing = None, False
        for r in s["runs"]:
            r["sustained"] = bool(not climbing and s["threshold_s_per_token"] and r["finished"] == r["requests"]
                                  and r["normalized_latency_s"] <= s["threshold_s_per_token"])
            climbing = climbing or not r["sustained"]
            if r["sustained"]:
                sustained = r["rate"]
        s["sustained_rate"] = sustained
        s["sustained_all"] = bool(s["runs"]) and sustained == s["runs"][-1]["rate"]
    by_key = {s["key"]: s for s in systems}
    ratios = {}
    if "paged" not in by_key:
        return ratios
    paged = by_key["paged"]
    for other in ("static", "orca"):
        if other not in by_key:
            continue
        p, o = paged["sustained_rate"], by_key[other]["sustained_rate"]
        ratios[f"paged_vs_{other}_sustained_rate"] = (p / o) if p and o else None
        ratios[f"paged_vs_{other}_at_least"] = bool(p and o and paged["sustained_all"])
        ratios[f"paged_vs_{other}_both_sustain_all"] = paged["sustained_all"] and by_key[other]["sustained_all"]
        gp, go = paged["runs"][-1]["goodput_requests_per_s"], by_key[other]["runs"][-1]["goodput_requests_per_s"]
        ratios[f"paged_vs_{other}_goodput_at_top_rate"] = gp / go if go > 0 else None
    return ratios


def run(model="smollm2-135m", rates=None, requests=24, scale=0.1, max_model_len=256, max_num_seqs=32,
        kv_capacity=1536, drain=60.0, slo_ttft=2.0, slo_normalized=0.25, sustain_factor=2.0,
        rate_fractions=RATE_FRACTIONS, attention="torch_batched", seed=0, progress=True, plot_dir=None,
        systems=None, skip_overhead=False) -> dict:
    """The whole benchmark; returns one dict (``format_result`` prints it). ``rates``: requests/s,
    or None for ``rate_fractions`` of the paged server's measured saturation rate. ``systems``: the
    keys to run (default all three: "static", "orca", "paged")."""
    from minipaged.server.process import ServerProcess

    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 2:
        raise ValueError(f"requests={requests!r} must be an integer >= 2")
    if rates is not None:
        rates = sorted(float(r) for r in rates)
        if not rates or rates[0] <= 0 or any(math.isinf(r) or math.isnan(r) for r in rates):
            raise ValueError(f"rates={rates!r} must be positive, finite requests/s")
    elif not rate_fractions or min(rate_fractions) <= 0:
        raise ValueError(f"rate_fractions={rate_fractions!r} must be positive")
    for name, value in (("drain", drain), ("slo_ttft", slo_ttft), ("slo_normalized", slo_normalized),
                        ("sustain_factor", sustain_factor)):
        if not value > 0:
            raise ValueError(f"{name}={value!r} must be > 0")
    chosen = [s for s in SYSTEMS if systems is None or s[1] in systems]
    if not chosen:
        raise ValueError(f"systems={systems!r}: choose among {[s[1] for s in SYSTEMS]}")
    started = time.perf_counter()
    probe_before = gemm_probe()
    if not probe_before["reliable"]:
        _say(progress, "warning: the GEMM probe ran slower than expected: another process is using the cores")

    rates_from = "given" if rates is not None else \
        f"fractions {', '.join(f'{f:g}' for f in rate_fractions)} of the paged server's saturation rate"
    # offline first, then the paged server and offline again, alternated (see "Server overhead" above)
    from minipaged import LLM

    llm = LLM(model, max_model_len=max_model_len, max_num_seqs=max_num_seqs, kv_capacity_tokens=kv_capacity,
              attention_backend=attention, progress=False)
    trace = make_trace(requests, scale, max_model_len, llm.config.vocab_size, seed)
    offline = None
    if not skip_overhead:
        _say(progress, f"offline LLM.generate: {requests} requests at once ...")
        offline = offline_run(llm, trace)
        _say(progress, f"  {offline['output_tokens_per_s']:.1f} output tok/s ({offline['seconds']:.0f} s)")
    else:
        llm = None
    need_saturation = not skip_overhead or rates is None
    unit_gaps = poisson_arrivals(requests, 1.0, seed)
    saturation = None
    offline_tries, server_tries = ([offline["output_tokens_per_s"]] if offline else []), []
    results = {key: {"system": label, "key": key, "flags": list(flags), "runs": []} for label, key, flags in chosen}
    order = [s for s in chosen if s[1] == "paged"] + [s for s in chosen if s[1] != "paged"]
    if need_saturation and not any(s[1] == "paged" for s in chosen):
        order = [SYSTEMS[2]] + order  # the saturation run needs the paged server, even if it is not swept
    for label, key, flags in order:
        _say(progress, f"starting the server: {label} ...")
        with ServerProcess(model, *_server_flags(flags, max_model_len, max_num_seqs, kv_capacity, attention),
                           startup_timeout=300) as server:
            _warm_up(server, model, trace)
            if key == "paged" and need_saturation:
                t = time.perf_counter()
                # OVERHEAD_PAIRS alternations of offline and server, each side's best kept: one noisy
                # second on two cores would otherwise decide the ratio
                for attempt in range(OVERHEAD_PAIRS if offline else 1):
                    if attempt:
                        again = offline_run(llm, trace)  # the server idles meanwhile
                        offline_tries.append(again["output_tokens_per_s"])
                        offline = max(offline, again, key=lambda o: o["output_tokens_per_s"])
                    records = send_load(server, model, trace, [0.0] * requests, drain)
                    run = summarize(records, drain, slo_ttft, slo_normalized)
                    server_tries.append(run["output_tokens_per_s"])
                    if saturation is None or run["output_tokens_per_s"] > saturation["output_tokens_per_s"]:
                        saturation, texts = run, [r.get("text") for r in records]
                saturation["cap_s"] = drain
                saturation["same_text_as_offline"] = (sum(1 for a, b in zip(texts, offline["texts"]) if a == b)
                                                      if offline else None)
                llm = None  # the offline engine is done: its memory goes before the sweeps
                gc.collect()
                _say(progress, f"  saturation (all {requests} at t=0): {saturation['output_tokens_per_s']:.1f} "
                               f"output tok/s, {saturation['requests_per_s']:.2f} req/s "
                               f"({time.perf_counter() - t:.0f} s)")
                if rates is None:
                    base = saturation["requests_per_s"]
                    if not base > 0:
                        raise RuntimeError("the saturation run finished no request; pass --rates")
                    rates = sorted({float(f"{f * base:.2g}") for f in rate_fractions})
            if key not in results:
                continue
            for rate in rates:
                t = time.perf_counter()
                arrivals = [g / rate for g in unit_gaps]
                cap = arrivals[-1] + drain
                records = send_load(server, model, trace, arrivals, cap)
                s = summarize(records, cap, slo_ttft, slo_normalized)
                s["rate"], s["cap_s"] = rate, cap
                results[key]["runs"].append(s)
                norm = s["normalized_latency_s"]
                _say(progress, f"  {rate:g} req/s: {s['finished']}/{requests} done, "
                               f"{'-' if norm is None else f'{norm:.3f}'} s/token, "
                               f"{s['output_tokens_per_s']:.1f} tok/s ({time.perf_counter() - t:.0f} s)")
        if key in results:
            results[key]["server_returncode"] = server.returncode
    probe_after = gemm_probe()

    systems_out = [results[key] for _, key, _ in chosen]
    ratios = judge(systems_out, sustain_factor)
    overhead = None
    if offline and saturation:
        ratio = saturation["output_tokens_per_s"] / offline["output_tokens_per_s"]
        overhead = {"server_output_tokens_per_s": saturation["output_tokens_per_s"],
                    "offline_output_tokens_per_s": offline["output_tokens_per_s"],
                    "server_requests_per_s": saturation["requests_per_s"],
                    "offline_requests_per_s": offline["requests_per_s"],
                    "server_seconds": saturation["duration_s"], "offline_seconds": offline["seconds"],
                    "server_finished": saturation["finished"], "ratio": ratio, "target": OVERHEAD_TARGET,
                    "meets_target": ratio >= OVERHEAD_TARGET,
                    "same_text_as_offline": saturation["same_text_as_offline"],
                    "offline_tries": offline_tries, "server_tries": server_tries}
    lens = [n for _, n in trace]
    result = {"model": model, "requests": requests, "scale": scale, "max_model_len": max_model_len,
              "max_num_seqs": max_num_seqs, "kv_capacity_tokens": kv_capacity, "attention_backend": attention,
              "seed": seed, "mean_prompt": sum(len(p) for p, _ in trace) / requests,
              "mean_output": sum(lens) / requests, "max_output": max(lens), "output_tokens": sum(lens),
              "rates": rates, "rates_from": rates_from,
              "drain_s": drain, "slo": {"ttft_s": slo_ttft, "normalized_s_per_token": slo_normalized},
              "sustain_factor": sustain_factor,
              "probe": probe_pair(probe_before, probe_after),
              "systems": systems_out, "ratios": ratios, "saturation": saturation, "overhead": overhead,
              "seconds": None}
    if plot_dir:
        from minipaged.plots.online import plot_online_latency

        os.makedirs(plot_dir, exist_ok=True)
        path = os.path.join(plot_dir, "online_latency.png")
        plot_online_latency(systems_out, path=path,
                            title=f"{model} through the server: {requests} ShareGPT-like requests x{scale}, "
                                  f"{kv_capacity} KV slots")
        result["plots"] = [path]
    result["seconds"] = time.perf_counter() - started
    return result


# ---------------------------------------------------------------- printing

def _ms(x) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def _s(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _rate(value, at_least=False) -> str:
    return "none" if value is None else (">" if at_least else "") + f"{value:g} req/s"


def format_result(r: dict) -> str:
    slo = r["slo"]
    lines = [f"{r['model']}: {r['requests']} ShareGPT-like requests x{r['scale']} (mean prompt {r['mean_prompt']:.1f},"
             f" mean output {r['mean_output']:.1f}, longest output {r['max_output']} tokens), Poisson arrivals; "
             f"KV capacity {r['kv_capacity_tokens']} slots, max_model_len {r['max_model_len']}, max_num_seqs "
             f"{r['max_num_seqs']}, attention {r['attention_backend']!r}",
             f"rates {', '.join(f'{x:g}' for x in r['rates'])} req/s ({r['rates_from']}); each run ends "
             f"{r['drain_s']:g} s after its last arrival (the cap); SLO: TTFT <= {slo['ttft_s']:g} s and "
             f"<= {slo['normalized_s_per_token']:g} s/token\n"]
    head = (f"{'rate':>6}{'done':>7}{'req/s':>7}{'tok/s':>8}{'TTFT p50':>9}{'p99':>7}{'ITL p50':>8}{'p99':>6}"
            f"{'e2e p50':>8}{'p99':>7}{'s/token':>8}{'goodput':>8}{'sustained':>10}")
    for s in r["systems"]:
        lines += [f"{s['system']}   (TTFT, ITL in ms; e2e in s; goodput in req/s)", head, "-" * len(head)]
        for run in s["runs"]:
            done = f"{run['finished']}/{run['requests']}"
            lines.append(f"{run['rate']:>6g}{done:>7}{run['requests_per_s']:>7.2f}{run['output_tokens_per_s']:>8.1f}"
                         f"{_ms(run['ttft_p50_s']):>9}{_ms(run['ttft_p99_s']):>7}{_ms(run['itl_p50_s']):>8}"
                         f"{_ms(run['itl_p99_s']):>6}{_s(run['e2e_p50_s']):>8}{_s(run['e2e_p99_s']):>7}"
                         f"{_s(run['normalized_latency_s'], 3):>8}{run['goodput_requests_per_s']:>8.2f}"
                         f"{'yes' if run['sustained'] else 'no':>10}")
            if run["errors"]:
                lines.append(f"        errors: {'; '.join(run['errors'])}")
        lines.append("")
    lines.append(f"sustained: every request finished within the cap and mean normalized latency <= "
                 f"{r['sustain_factor']:g} x the system's own at the lowest rate, at that rate and every lower one")
    for s in r["systems"]:
        base = s["baseline_s_per_token"]
        limit = "" if base is None else f" (<= {s['threshold_s_per_token']:.3f} s/token)"
        lines.append(f"  {s['system']:<31} sustains {_rate(s['sustained_rate'], s['sustained_all'])}{limit}")
    ratios = r["ratios"]
    names = {"static": "static + contiguous", "orca": "Orca: continuous + contiguous"}
    if ratios:
        lines.append("\nratios, measured in this run:")
    for other, name in names.items():
        key = f"paged_vs_{other}_sustained_rate"
        if key not in ratios:
            continue
        value, both = ratios[key], ratios[f"paged_vs_{other}_both_sustain_all"]
        if both:
            ratio = "- (both sustain every rate tried)"
        elif value is None:
            ratio = "- (one sustains no tested rate)"
        else:
            ratio = (">=" if ratios[f"paged_vs_{other}_at_least"] else "") + f"{value:.2f}x"
        good = ratios[f"paged_vs_{other}_goodput_at_top_rate"]
        lines.append(f"  vLLM paged / {name:<31} sustained rate {ratio};  goodput at {r['rates'][-1]:g} req/s "
                     f"{'-' if good is None else f'{good:.2f}x'}")
    o = r["overhead"]
    if o:
        lines.append(f"\nserver overhead (the paged system, all {r['requests']} requests at once; offline and server "
                     f"alternated, the best of each; tries: offline "
                     f"{', '.join(f'{x:.1f}' for x in o['offline_tries'])}, server "
                     f"{', '.join(f'{x:.1f}' for x in o['server_tries'])} tok/s):")
        lines.append(f"  through the server {o['server_output_tokens_per_s']:.1f} output tok/s "
                     f"({o['server_seconds']:.1f} s), offline LLM.generate {o['offline_output_tokens_per_s']:.1f} "
                     f"({o['offline_seconds']:.1f} s): server / offline = {100 * o['ratio']:.1f}% "
                     f"(target >= {100 * o['target']:.0f}%: {'met' if o['meets_target'] else 'NOT met'})")
        if o["same_text_as_offline"] is not None:
            lines.append(f"  the same greedy text as offline: {o['same_text_as_offline']}/{r['requests']} requests")
    lines += ["\n" + line for line in describe_probe(r["probe"])]
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
    p.add_argument("--requests", type=int, default=24, help="requests in the trace, at every rate (default: 24)")
    p.add_argument("--rates", default=None,
                   help="request rates (requests/s), comma-separated (default: --rate-fractions of the paged "
                        "server's measured saturation rate)")
    p.add_argument("--rate-fractions", default=",".join(f"{f:g}" for f in RATE_FRACTIONS),
                   help="without --rates: the rates as fractions of the paged saturation rate "
                        f"(default: {','.join(f'{f:g}' for f in RATE_FRACTIONS)})")
    p.add_argument("--scale", type=float, default=0.1,
                   help="multiply the ShareGPT-like prompt and output lengths by this (default: 0.1)")
    p.add_argument("--kv-capacity", type=int, default=1536,
                   help="KV token slots every system gets (default: 1536, six max_model_len slabs)")
    p.add_argument("--max-model-len", type=int, default=256,
                   help="longest prompt + output; the contiguous slab size (default: 256)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="most sequences in a running batch (default: 32)")
    p.add_argument("--drain-seconds", type=float, default=60.0,
                   help="the cap: each (system, rate) run ends this long after its last arrival; requests not "
                        "done by then are cancelled and count as unfinished (default: 60)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput's time-to-first-token target, s (default: 2)")
    p.add_argument("--slo-normalized", type=float, default=0.25,
                   help="goodput's normalized-latency target, s/token (default: 0.25)")
    p.add_argument("--sustain-factor", type=float, default=2.0,
                   help="a rate is sustained while the system's mean normalized latency <= this x its own at "
                        "the lowest rate (default: 2)")
    p.add_argument("--systems", default="static,orca,paged",
                   help="which systems to run, comma-separated among static, orca, paged (default: all)")
    p.add_argument("--skip-overhead", action="store_true",
                   help="skip the server-vs-offline comparison (without --rates the paged saturation "
                        "run still sets the rates)")
    p.add_argument("--attention", default="torch_batched", choices=["torch_batched", "cpu", "torch"],
                   help="the engine's attention backend in every system (default: torch_batched)")
    p.add_argument("--seed", type=int, default=0, help="trace and arrival seed (default: 0)")
    p.add_argument("--plot-dir", default=None, help="also save online_latency.png there")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def main(args) -> int:
    rates = _floats(args.rates) if args.rates else None
    fractions = tuple(_floats(args.rate_fractions))
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in [k for _, k, _ in SYSTEMS]]
    if unknown:
        raise ValueError(f"--systems: unknown {unknown}; choose among static, orca, paged")
    r = run(args.model, rates, args.requests, args.scale, args.max_model_len, args.max_num_seqs, args.kv_capacity,
            drain=args.drain_seconds, slo_ttft=args.slo_ttft, slo_normalized=args.slo_normalized,
            sustain_factor=args.sustain_factor, rate_fractions=fractions, attention=args.attention, seed=args.seed,
            progress=True, plot_dir=args.plot_dir, systems=systems, skip_overhead=args.skip_overhead)
    records.publish(r)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(format_result(r))
    failed = any(run["errors"] for s in r["systems"] for run in s["runs"])
    return 1 if failed else 0
