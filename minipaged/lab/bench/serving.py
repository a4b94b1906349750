"""Chapter 06's benchmark: what continuous batching over paged memory buys, on the real model.

    python -m minipaged bench serving [--requests 64] [--scale 0.1] [--kv-capacity 1536] [--json]

One ShareGPT-like trace (the simulator's, lengths scaled by --scale so the run takes minutes on two
cores; prompts are seeded random token ids, every request asks for exactly its own output length
with ignore_eos), all requests arriving at once, served by:

    static + contiguous      a batch runs until its longest request ends; slabs of max_model_len
    Orca (max|pow2|oracle)   continuous + contiguous: requests join and leave at every step (Orca's
                             iteration-level scheduling), each in a slab reserved at admission:
                             max_model_len, the next power of two of prompt + max_tokens, or exactly
                             prompt + max_tokens (the paper's three Orca baselines)
    continuous + paged       requests join and leave at every step; blocks taken on demand
    HF generate (padded)     HF Transformers' generate over left-padded batches of a fixed size, at
                             each of --hf-batch-sizes that fits the same KV capacity; the best is kept

Every system gets the same KV capacity: by default 1536 token slots, six slabs of max_model_len, close
to the room of the vLLM paper's setting (there OPT-13B on a 40 GB A100 keeps about 12 GB for K/V at
800 KB per token: some 15,000 tokens, seven slabs of 2048). The same prompts and the same output
lengths go to every system, in one process, one after the other. The engine's systems all use the
batched PyTorch attention (``--attention torch_batched``, checked against the reference in the
tests; ``torch`` is the reference itself, slower on a CPU).

Printed per system: requests/s, output tokens/s, time to first token and latency (p50, p99; HF's
generate returns a batch at once, so its first token is not seen), mean running batch, KV
utilization (tokens / slots held; mean over steps and peak) and preemptions; then the ratios; then
the engine's bookkeeping (step time outside the model's forward pass) at a full running batch; then
recompute vs swap on the same trace with a pool small enough to force preemptions.

With --plot-dir it draws serving_timeline.png: running batch and KV memory held over time, static vs
continuous.

    python -m minipaged bench serving --capacities 1024,1536,2048,3072,4096 [--orca none] [--skip-hf]

runs the engine's systems (static, the Orca systems asked for, continuous + paged) at each KV capacity
instead, without HF and the pressure runs, and prints what paging buys as memory grows; with
--plot-dir it draws capacity_sweep.png.

Not measured here: arrivals over time (everything waits at t=0), sampling.
"""

from __future__ import annotations

import json
import os
import random
import time

from minipaged.lab import capture
from minipaged.lab.bench import add_attention_argument
from minipaged.lab.simulator.workloads import make_workload
from minipaged.metrics_reader import find, percentile


def make_trace(num_requests: int, scale: float, max_model_len: int, vocab_size: int, seed: int = 0):
    """[(prompt token ids, output length)]: the simulator's ShareGPT-like lengths times ``scale``."""
    # the trace at full size, with room for lengths that still fit max_model_len once scaled
    requests = make_workload("sharegpt", num_requests, max_model_len=max(2, round(max_model_len / scale)), seed=seed)
    rng = random.Random(seed)
    trace = []
    for r in requests:
        prompt_len = max(1, round(r.prompt_len * scale))
        output_len = max(1, min(round(r.output_len * scale), max_model_len - prompt_len))
        trace.append((random_prompt(rng, prompt_len, vocab_size), output_len))
    return trace


def random_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    """``length`` random token ids, past the special tokens (ids below min(1000, vocab_size // 4))."""
    low = min(1000, vocab_size // 4)
    return [rng.randrange(low, vocab_size) for _ in range(length)]


def run_engine(llm, trace, label: str, progress: bool = False) -> dict:
    """Serve the trace with one configured LLM; everything measured from its own metrics and a
    recorder of this run's steps."""
    from minipaged import SamplingParams

    prompts = [p for p, _ in trace]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in trace]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up, not timed
    before = {m.name: m.value for m in llm.get_metrics()}
    swap_before = llm.engine.runner.swap_seconds

    def counted(name):  # this run's part of a counter
        return find(llm.get_metrics(), name).value - before["minipaged:" + name]

    start = time.perf_counter()
    with llm.engine.metrics.steps.recording() as rec:
        outs = llm.generate(prompts, params, use_tqdm=progress)
    seconds = time.perf_counter() - start
    ttft = [o.metrics["first_token_time"] - o.metrics["arrival_time"] for o in outs]
    latency = [o.metrics["finished_time"] - o.metrics["arrival_time"] for o in outs]
    policy = llm.engine.policy
    policy.check_invariants()
    assert not policy.seq_ids(), "KV memory left allocated after the run"
    useful = sum(n for _, n in trace)
    assert sum(len(o.outputs[0].token_ids) for o in outs) == useful, "a request did not get its tokens"
    times, clock = [], 0.0
    for step in rec.series("step_seconds"):
        clock += step
        times.append(clock)
    batches, usage, held = rec.series("batch_size"), rec.series("kv_utilization"), rec.series("kv_occupied")
    return {"system": label, "seconds": seconds, "requests": len(trace), "output_tokens": useful,
            "requests_per_s": len(trace) / seconds, "output_tokens_per_s": useful / seconds,
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "latency_p50": percentile(latency, 50), "latency_p99": percentile(latency, 99),
            "mean_batch": sum(batches) / len(batches),
            "peak_kv_utilization": max(usage), "peak_kv_held": max(held),
            "mean_kv_utilization": sum(usage) / len(usage),
            "preemptions": counted("num_preemptions"), "forward_passes": counted("forward_passes"),
            "tokens_computed": counted("tokens_computed"),
            "swap_seconds": llm.engine.runner.swap_seconds - swap_before,
            "blocks_swapped_out": counted("blocks_swapped_out"),
            "bookkeeping": bookkeeping(rec.records, llm.args.max_num_seqs),
            "timeline": {"time": times, "batch": batches, "kv_held": held},
            "outputs": [o.outputs[0].token_ids for o in outs]}


def bookkeeping(records: list[dict], full_batch: int) -> dict | None:
    """The share of step time spent outside the model's forward pass, over the steps that ran a
    full batch (``full_batch`` sequences). None if no step did."""
    steps = [(r["step_seconds"], r["forward_seconds"]) for r in records if r["batch_size"] == full_batch]
    if not steps:
        return None
    step, forward = sum(s for s, _ in steps), sum(f for _, f in steps)
    return {"batch": full_batch, "steps": len(steps), "step_ms": 1000 * step / len(steps),
            "forward_ms": 1000 * forward / len(steps), "fraction": 1 - forward / step}


def run_hf(trace, capacity: int, batch_sizes, progress: bool = False) -> dict | None:
    """HF generate over padded batches, at each batch size whose padded KV fits ``capacity``; the best."""
    from minipaged.lab.bench.hf_baseline import load_hf_model, run_padded

    model = load_hf_model()
    if model is None:
        return None
    prompts, lens = [p for p, _ in trace], [n for _, n in trace]
    tried = []
    for size in batch_sizes:
        padded = max(len(prompts[i:i + size]) * (max(len(p) for p in prompts[i:i + size]) + max(lens[i:i + size]))
                     for i in range(0, len(prompts), size))
        if padded > capacity:
            tried.append({"batch_size": size, "skipped": f"padded KV {padded} > capacity {capacity} slots"})
            continue
        run_padded(model, prompts[:2], [2, 2], batch_size=2)  # warm-up
        result = run_padded(model, prompts, lens, batch_size=size, progress=progress)
        tried.append({"batch_size": size, "seconds": result.seconds, "requests_per_s": result.requests_per_s,
                      "output_tokens_per_s": result.output_tokens_per_s, "decoded_tokens": result.decoded_tokens,
                      "padded_kv": padded, "latency_p50": percentile(result.latencies, 50),
                      "latency_p99": percentile(result.latencies, 99)})
    timed = [t for t in tried if "seconds" in t]
    if not timed:
        return {"system": "HF generate (padded)", "tried": tried}
    best = max(timed, key=lambda t: t["requests_per_s"])
    return {"system": f"HF generate (padded, batch {best['batch_size']})", **best, "tried": tried,
            "requests": len(trace), "output_tokens": sum(lens)}


def run(model="smollm2-135m", requests=64, scale=0.1, kv_capacity=1536, max_model_len=256, max_num_seqs=32,
        block_size=16, hf_batch_sizes=(4, 8, 16), pressure_capacity=None, seed=0, progress=False,
        skip_hf=False, plot_dir=None, attention="torch_batched", skip_pressure=False,
        orca=("max", "pow2", "oracle")) -> dict:
    """Every system on one trace. ``orca`` lists the reservation rules of the continuous + contiguous
    systems to run (none: only static + contiguous against continuous + paged)."""
    from minipaged import LLM

    def engine(**options):
        if options["kv_policy"] != "contiguous":  # the arena's unit is one slot
            options["block_size"] = block_size
        return LLM(model, max_model_len=max_model_len, max_num_seqs=max_num_seqs, attention_backend=attention,
                   progress=False, **options)

    static = engine(kv_policy="contiguous", reservation="max", scheduler="static", kv_capacity_tokens=kv_capacity)
    trace = make_trace(requests, scale, max_model_len, static.config.vocab_size, seed)
    systems = [run_engine(static, trace, "static + contiguous", progress)]
    del static
    orca_runs = [run_engine(engine(kv_policy="contiguous", reservation=rule, scheduler="continuous",
                                   kv_capacity_tokens=kv_capacity), trace, f"Orca ({rule}): continuous + contiguous",
                            progress) for rule in orca]
    systems.append(run_engine(engine(kv_policy="on_demand", scheduler="continuous", kv_capacity_tokens=kv_capacity),
                              trace, "continuous + paged", progress))
    hf = None if skip_hf else run_hf(trace, kv_capacity, hf_batch_sizes, progress)
    pressure_capacity = pressure_capacity or kv_capacity // 4
    pressure = [] if skip_pressure else [
        run_engine(engine(kv_policy="on_demand", kv_capacity_tokens=pressure_capacity, preemption_mode=mode),
                   trace, f"continuous + paged, {mode}", progress) for mode in ("recompute", "swap")]
    same = all(s["outputs"] == systems[0]["outputs"] for s in systems[1:] + orca_runs + pressure)
    static_r, continuous_r = systems
    ratios = {"continuous_vs_static_requests_per_s": continuous_r["requests_per_s"] / static_r["requests_per_s"],
              "continuous_vs_static_output_tokens_per_s":
                  continuous_r["output_tokens_per_s"] / static_r["output_tokens_per_s"]}
    if hf and "output_tokens_per_s" in hf:
        ratios["continuous_vs_hf_output_tokens_per_s"] = continuous_r["output_tokens_per_s"] / hf["output_tokens_per_s"]
        ratios["continuous_vs_hf_requests_per_s"] = continuous_r["requests_per_s"] / hf["requests_per_s"]
    for rule, o in zip(orca, orca_runs):
        ratios[f"orca_{rule}_vs_static_requests_per_s"] = o["requests_per_s"] / static_r["requests_per_s"]
        ratios[f"continuous_vs_orca_{rule}_requests_per_s"] = continuous_r["requests_per_s"] / o["requests_per_s"]
    if pressure:
        ratios["swap_vs_recompute_requests_per_s"] = pressure[1]["requests_per_s"] / pressure[0]["requests_per_s"]
    lens = [n for _, n in trace]
    result = {"model": model, "requests": requests, "scale": scale, "kv_capacity_tokens": kv_capacity,
              "attention_backend": attention,
              "pressure_capacity_tokens": pressure_capacity, "max_model_len": max_model_len,
              "max_num_seqs": max_num_seqs, "block_size": block_size,
              "mean_prompt": sum(len(p) for p, _ in trace) / len(trace), "mean_output": sum(lens) / len(lens),
              "max_output": max(lens), "identical_outputs": same, "systems": systems, "orca": orca_runs, "hf": hf,
              "pressure": pressure, "ratios": ratios}
    if plot_dir:
        from minipaged.lab.plots import plot_serving_timeline

        os.makedirs(plot_dir, exist_ok=True)
        plot_serving_timeline({s["system"]: s["timeline"] for s in systems}, kv_capacity,
                              path=os.path.join(plot_dir, "serving_timeline.png"))
    return result


def run_capacities(capacities, model="smollm2-135m", orca=(), progress=False, **options) -> dict:
    """The engine's systems on the same trace at each KV capacity (no HF, no pressure runs): how the gain
    from paging changes with the memory there is. A row's outputs are identical when every system gave
    the same greedy tokens as the first capacity's static run."""
    from tqdm.auto import tqdm

    rows, first = [], None
    for capacity in tqdm(capacities, desc="KV capacities", unit="capacity", disable=not progress):
        r = run(model, kv_capacity=capacity, skip_hf=True, skip_pressure=True, orca=orca, **options)
        static, continuous = r["systems"]
        first = static["outputs"] if first is None else first
        same = r["identical_outputs"] and static["outputs"] == first
        rows.append({"kv_capacity_tokens": capacity, "identical_outputs": same,
                     "ratios": r["ratios"],
                     "systems": [{k: s[k] for k in ("system", "requests_per_s", "output_tokens_per_s",
                                                     "mean_batch", "preemptions")}
                                 for s in [static, *r["orca"], continuous]]})
    return {"model": model, "capacities": list(capacities), "rows": rows,
            "identical_outputs": all(row["identical_outputs"] for row in rows)}


def format_capacities(r: dict) -> str:
    names = [s["system"] for s in r["rows"][0]["systems"]]
    lines = [f"{r['model']}: the same trace at {len(r['rows'])} KV capacities (req/s, mean running batch "
             f"in brackets, preemptions after a slash)"]
    head = f"{'capacity':>9}" + "".join(f"{n.split(':')[0]:>26}" for n in names) + f"{'paged/static':>14}"
    lines += [head, "-" * len(head)]
    for row in r["rows"]:
        cells = "".join(f"{s['requests_per_s']:>12.2f} ({s['mean_batch']:>4.1f}) /{s['preemptions']:>4}"
                        for s in row["systems"])
        lines.append(f"{row['kv_capacity_tokens']:>9}{cells}"
                     f"{row['ratios']['continuous_vs_static_requests_per_s']:>13.2f}x")
    lines.append(f"identical greedy outputs across every system and capacity: {r['identical_outputs']}")
    return "\n".join(lines)


def _ms(x):
    return "    -" if x is None else f"{1000 * x:7.0f}"


def format_result(r: dict) -> str:
    lines = [f"{r['model']}: {r['requests']} ShareGPT-like requests x{r['scale']} (mean prompt "
             f"{r['mean_prompt']:.1f}, mean output {r['mean_output']:.1f}, longest output {r['max_output']} tokens), "
             f"KV capacity {r['kv_capacity_tokens']} token slots, max_model_len {r['max_model_len']}, "
             f"max_num_seqs {r['max_num_seqs']}, block size {r['block_size']}, attention {r['attention_backend']!r}\n"]
    head = (f"{'system':<34}{'req/s':>7}{'out tok/s':>10}{'TTFT p50':>9}{'p99':>7}{'lat p50':>8}{'p99':>7}"
            f"{'batch':>7}{'KV util mean':>13}{'peak':>7}{'preempt':>8}")
    lines += [head + "   (times in ms)", "-" * len(head)]
    hf = r["hf"] if r["hf"] and "seconds" in r["hf"] else None
    static, continuous = r["systems"]
    for s in [static, *r.get("orca", []), continuous] + ([hf] if hf else []) + r["pressure"]:
        if s is hf:
            lines.append(f"{s['system']:<34}{s['requests_per_s']:>7.2f}{s['output_tokens_per_s']:>10.1f}"
                         f"{'-':>9}{'-':>7}{_ms(s['latency_p50']):>8}{_ms(s['latency_p99']):>7}"
                         f"{s['batch_size']:>7}{'-':>13}{'-':>7}{'-':>8}")
            continue
        if r["pressure"] and s is r["pressure"][0]:
            lines.append(f"-- with a pool of {r['pressure_capacity_tokens']} slots (preemptions forced):")
        lines.append(f"{s['system']:<34}{s['requests_per_s']:>7.2f}{s['output_tokens_per_s']:>10.1f}"
                     f"{_ms(s['ttft_p50']):>9}{_ms(s['ttft_p99']):>7}{_ms(s['latency_p50']):>8}"
                     f"{_ms(s['latency_p99']):>7}{s['mean_batch']:>7.1f}{100 * s['mean_kv_utilization']:>12.1f}%"
                     f"{100 * s['peak_kv_utilization']:>6.1f}%{s['preemptions']:>8}")
    if r["hf"]:
        for t in r["hf"]["tried"]:
            if "skipped" in t:
                lines.append(f"  (HF batch {t['batch_size']} not run: {t['skipped']})")
            else:
                lines.append(f"  (HF batch {t['batch_size']}: {t['requests_per_s']:.2f} req/s, "
                             f"{t['output_tokens_per_s']:.1f} output tok/s, {t['decoded_tokens']} tokens decoded)")
    ratios = r["ratios"]
    lines.append("\nratios, measured in this run:")
    pairs = [("continuous + paged / static + contiguous", "static")]
    if "continuous_vs_hf_output_tokens_per_s" in ratios:
        pairs.append(("continuous + paged / HF generate (padded)", "hf"))
    for label, other in pairs:
        lines.append(f"  {label:<43}requests/s {ratios[f'continuous_vs_{other}_requests_per_s']:.2f}x   "
                     f"output tokens/s {ratios[f'continuous_vs_{other}_output_tokens_per_s']:.2f}x")
    for o in r.get("orca", []):
        rule = o["system"].split("(")[1].split(")")[0]
        lines.append(f"  {f'Orca ({rule}) / static: scheduling alone':<43}"
                     f"requests/s {ratios[f'orca_{rule}_vs_static_requests_per_s']:.2f}x")
        lines.append(f"  {f'continuous + paged / Orca ({rule}): paging':<43}"
                     f"requests/s {ratios[f'continuous_vs_orca_{rule}_requests_per_s']:.2f}x")
    if r["pressure"]:
        lines.append(f"  {'swap / recompute (small pool)':<43}"
                     f"requests/s {ratios['swap_vs_recompute_requests_per_s']:.2f}x")
        rec, swp = r["pressure"]
        lines.append(f"  recompute: {rec['preemptions']} preemptions, {rec['tokens_computed']} token positions "
                     f"computed; swap: {swp['preemptions']} preemptions, {swp['blocks_swapped_out']} blocks out and "
                     f"back, {1000 * swp['swap_seconds']:.0f} ms copying, {swp['tokens_computed']} positions computed")
    book = r["systems"][1]["bookkeeping"]
    if book:
        lines.append(f"\nbookkeeping (everything outside the forward pass) at a running batch of {book['batch']}: "
                     f"{100 * book['fraction']:.1f}% of step time ({book['step_ms']:.1f} ms per step, forward "
                     f"{book['forward_ms']:.1f} ms, over {book['steps']} steps)")
    else:
        lines.append(f"\nbookkeeping: no step ran a full batch of {r['max_num_seqs']}")
    lines.append(f"identical greedy outputs across the engine's systems: {r['identical_outputs']}")
    return "\n".join(lines)


# The trace and the KV memory every system is given; chapter 11's online benchmark (bench/online.py) takes them too.
TRACE_OPTIONS = (
    ("--scale", float, 0.1, "multiply the ShareGPT-like prompt and output lengths by this (default: 0.1)"),
    ("--kv-capacity", int, 1536, "KV token slots every system gets (default: 1536, six max_model_len slabs)"),
    ("--max-model-len", int, 256, "longest prompt + output; the contiguous slab size (default: 256)"),
)


def add_trace_arguments(p):
    """--scale, --kv-capacity and --max-model-len (TRACE_OPTIONS)."""
    for flag, kind, default, text in TRACE_OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=text)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--requests", type=int, default=64, help="requests in the trace (default: 64)")
    add_trace_arguments(p)
    p.add_argument("--max-num-seqs", type=int, default=32, help="most sequences in a running batch (default: 32)")
    p.add_argument("--hf-batch-sizes", default="4,8,16",
                   help="HF generate batch sizes to try, comma-separated; the best that fits the KV capacity "
                        "is kept (default: 4,8,16)")
    p.add_argument("--pressure-capacity", type=int, default=None,
                   help="KV slots for the recompute vs swap runs (default: a quarter of --kv-capacity)")
    add_attention_argument(p, "the engine's attention backend for every system (default: torch_batched)")
    p.add_argument("--orca", default="max,pow2,oracle",
                   help="reservation rules of the Orca systems (continuous batching over contiguous slabs), "
                        "comma-separated among max, pow2, oracle, or 'none' (default: all three)")
    p.add_argument("--skip-hf", action="store_true", help="do not run HF Transformers")
    p.add_argument("--plot-dir", default=None,
                   help="also save serving_timeline.png there (with --capacities: capacity_sweep.png)")
    p.add_argument("--seed", type=int, default=0, help="trace seed (default: 0)")
    p.add_argument("--capacities", default=None,
                   help="comma-separated KV capacities: run the engine's systems at each instead (no HF, no "
                        "pressure runs, so --kv-capacity, --hf-batch-sizes and --pressure-capacity do not "
                        "apply) and, with --plot-dir, draw capacity_sweep.png")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def record_default(args) -> str:
    return "06/bench_serving_capacities" if getattr(args, "capacities", None) else "06/bench_serving"


def _without_outputs(system: dict) -> dict:
    return {k: v for k, v in system.items() if k != "outputs"}


def main(args) -> int:
    sizes = tuple(int(x) for x in args.hf_batch_sizes.split(",") if x.strip())
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--hf-batch-sizes={args.hf_batch_sizes!r} must list positive integers, e.g. 8,16")
    orca = () if args.orca == "none" else tuple(x.strip() for x in args.orca.split(",") if x.strip())
    if any(rule not in ("max", "pow2", "oracle") for rule in orca):
        raise ValueError(f"--orca={args.orca!r}: list reservation rules among max, pow2, oracle, or say 'none'")
    if args.capacities is not None:
        try:
            capacities = [int(x) for x in args.capacities.split(",") if x.strip()]
        except ValueError:
            capacities = []
        if not capacities or min(capacities) < args.max_model_len:
            raise ValueError(f"--capacities={args.capacities!r} must list KV capacities (token slots) of at least "
                             f"--max-model-len ({args.max_model_len}), e.g. 1024,2048,4096")
        r = run_capacities(capacities, args.model, orca=orca, progress=not args.json, requests=args.requests,
                           scale=args.scale, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                           seed=args.seed, attention=args.attention)
        capture.publish(r)
        if args.plot_dir:
            from minipaged.lab.plots import plot_capacity_sweep

            os.makedirs(args.plot_dir, exist_ok=True)
            plot_capacity_sweep(r, path=os.path.join(args.plot_dir, "capacity_sweep.png"))
        print(json.dumps(r, indent=2) if args.json else format_capacities(r))
        return 0 if r["identical_outputs"] else 1
    r = run(args.model, args.requests, args.scale, args.kv_capacity, args.max_model_len, args.max_num_seqs,
            hf_batch_sizes=sizes, pressure_capacity=args.pressure_capacity, seed=args.seed,
            progress=not args.json, skip_hf=args.skip_hf, plot_dir=args.plot_dir, attention=args.attention,
            orca=orca)
    capture.publish({**r, **{key: [_without_outputs(s) for s in r[key]] for key in ("systems", "orca", "pressure")}})
    if args.json:
        for s in r["systems"] + r["orca"] + r["pressure"]:
            s.pop("outputs")
        print(json.dumps(r, indent=2))
    else:
        print(format_result(r))
    return 0 if r["identical_outputs"] else 1
