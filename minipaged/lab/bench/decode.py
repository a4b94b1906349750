"""Chapter 00's speed check: the default engine's decode speed against this CPU's two roofs, and HF's.

    python -m minipaged bench decode [--model smollm2-135m] [--batches 1,8,32,64] [--context 128]
                                     [--steps 16] [--no-hf] [--plot-dir DIR] [--json]

One run measures, for each batch size b:

1. this machine's read bandwidth: summing a 1 GiB fp32 buffer, far larger than any cache;
2. the model's matmuls alone: every projection of every layer and the vocabulary projection, run in
   forward order on the model's own weights with b rows, nothing else, timed two ways (plain
   F.linear, and the model's own Linear as the engine runs it: the compiled product on the weight
   in panels, or without the kernels a thin product split over the threads) and the faster kept.
   A decode step cannot be faster than its own matmuls, so b / that time is the *matmul bound*. At
   one row a product is a read of its weights, so there this bound is a memory bound too (the
   matmuls read the weights more slowly than a plain sum does); from a few rows on the weights are
   shared and the products' arithmetic sets it;
3. the *weight-streaming bound*: every decode step reads every weight once (and each sequence's
   cached K/V), so a step takes at least (weight bytes + K/V bytes) / read bandwidth;
4. back to back on the same prompts (``context`` seeded random token ids each):
   the default engine (``LLMEngine``, nothing changed but the pool, sized to fit, and ``--dtype``)
   and HF Transformers' ``generate`` on the same batch (no padding: the prompts have one length).
   Each times ``steps`` decode steps one by one (HF's through a streamer that notes when each step's
   tokens arrive), and its tokens/s is the batch over the median step, which one burst of noise does
   not move. The two alternate ``rounds`` times (engine, HF, engine, HF) and each keeps its best
   round: on a small shared machine a whole round can be slowed by a neighbour, and both sides get
   the same chance.

The bounds are measured beside what they bound: in each round, right before the engine's steps, a
bandwidth sample and the matmuls alone, and right after them another bandwidth sample. Each bound
uses the fastest of the batch size's own measurements (the strictest bound it saw). On a shared
machine the bandwidth and the GEMM rate a neighbour leaves move by half from one minute to the next,
so figures taken once at the start would describe another minute than the engine's steps. A GEMM
probe (bench/noise.py) before and after the whole run warns if another process competed for the cores.

It prints each speed as a fraction of its roof (the lower of the two bounds) and the engine's as a
ratio to HF's, with ``--json`` and a plot of tokens/s against batch size under the two roofs.

At batch 1 both bounds are memory bounds: 540 MB of fp32 weights cross the memory bus for one token,
once at the read bandwidth of a plain sum (streaming) and once at the rate the products read them
(the matmuls alone, the lower of the two on the CPUs measured so far). From a few sequences on, the
weights are shared by the batch and the matmuls' arithmetic binds; the gap between a line and its
roof is what the rest of the step costs (attention,
norms, RoPE, sampling, the scheduler, Python).

Not handled: prefill speed (bench throughput times whole requests), quantized weights.
"""

from __future__ import annotations

import json
import time

from minipaged.lab import capture

TARGETS = {"weight_streaming_at_1": 0.5, "arithmetic_at_32": 0.6, "hf_ratio": 1.5}


# ---------------------------------------------------------------- the machine

def read_bandwidth(nbytes: int = 2**30, repeats: int = 5, buf=None) -> float:
    """Bytes/s read by summing a large fp32 buffer (a read-only stream, as weight loading is), best of
    ``repeats``. ``buf``: a buffer to reuse (a run samples many times), else one of ``nbytes`` is made."""
    import torch

    from minipaged.lab.bench.roofline import best_time

    if buf is None:
        buf = torch.ones(nbytes // 4, dtype=torch.float32)
    return buf.numel() * buf.element_size() / best_time(buf.sum, repeats)  # its warm-up touches the pages


def model_linear_modules(model) -> list:
    """The Linear modules of one forward pass, in the order it uses them (the vocabulary projection last)."""
    from torch import nn

    mods = [m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"]
    return mods + [model.lm_head]


def model_linears(model) -> list:
    """The weight matrices of one forward pass, in the same order."""
    return [m.weight for m in model_linear_modules(model)]


def matmul_only_seconds(model, batch: int, repeats: int = 5) -> dict:
    """Best time of the step's matmuls alone: every weight, in forward order, times a [batch, in] input,
    two ways, alternated: ``plain`` is F.linear (MKL's own threading, PyTorch's [out, in] layout) and
    ``model`` is the model's own Linear as the engine runs it (model/llama.py: a thin product split over
    the threads, or the compiled product of model/kernels.py when it is built).
    The faster of the two is the matmul bound: no step can beat the best way to do its matmuls."""
    import torch
    import torch.nn.functional as F

    from minipaged.lab.bench.roofline import best_time
    from minipaged.model import kernels

    mods = model_linear_modules(model)
    inputs = {m.weight.shape[1]: torch.randn(batch, m.weight.shape[1], dtype=m.weight.dtype) for m in mods}

    def plain():
        for m in mods:
            F.linear(inputs[m.weight.shape[1]], m.weight)

    def own():
        with kernels.enabled():
            for m in mods:
                m(inputs[m.weight.shape[1]])

    times = {"plain": float("inf"), "model": float("inf")}
    with torch.inference_mode():
        for _ in range(2):  # alternated, each keeps its best
            times["plain"] = min(times["plain"], best_time(plain, repeats))
            times["model"] = min(times["model"], best_time(own, repeats))
    return times


def matmul_flops(model, batch: int) -> float:
    return sum(2.0 * w.numel() * batch for w in model_linears(model))


def weight_bytes_read(model) -> int:
    """Bytes of weights a decode step reads: every matrix once (a tied embedding is read once, as the
    output projection; its lookup touches a few rows only) and the norm gains."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


# ---------------------------------------------------------------- the two engines

def make_prompts(vocab_size: int, batch: int, context: int, seed: int = 0) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, context), generator=gen).tolist()


def engine_decode(loaded, prompts: list[list[int]], steps: int, model_name: str, dtype: str = "float32") -> dict:
    """The default engine's decode speed: ``steps`` decode steps after every prompt is in, each timed
    alone; tokens/s is the batch over the median step (a burst of noise moves a mean, not a median)."""
    from minipaged.config import EngineArgs
    from minipaged.llm_engine import LLMEngine
    from minipaged.sampling_params import SamplingParams

    batch, context = len(prompts), len(prompts[0])
    need = batch * (context + steps + 2)
    args = EngineArgs(model=model_name, dtype=dtype, kv_capacity_tokens=max(8192, need + need // 8),
                      max_num_seqs=max(64, batch), progress=False)
    engine = LLMEngine(args, loaded=loaded)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"d{i}", {"prompt_token_ids": ids}, params)
    seqs = [s for r in engine.core.requests.values() for s in r.seqs]
    while any(not s.output_ids for s in seqs):  # prefill (one or more steps)
        engine.step()
    before, times = sum(len(s.output_ids) for s in seqs), []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    made = sum(len(s.output_ids) for s in seqs) - before
    engine.abort_all()
    return _speed(made, batch, times)


class _StepClock:
    """A streamer for HF's generate: it is handed the prompt, then each step's new tokens; we note when."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def hf_decode(model, prompts: list[list[int]], steps: int) -> dict:
    """HF generate's decode speed on the same batch, timed step by step as engine_decode is."""
    import torch

    ids = torch.tensor(prompts)
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kwargs)  # warm-up
        clock = _StepClock()
        model.generate(ids, max_new_tokens=1 + steps, min_new_tokens=1 + steps, streamer=clock, **kwargs)
    # put() came with the prompt, then after the prefill's token, then after each decode step
    gaps = [b - a for a, b in zip(clock.times[1:], clock.times[2:])]
    return _speed(steps * len(prompts), len(prompts), gaps)


def _speed(tokens: int, batch: int, step_seconds: list[float]) -> dict:
    step_seconds = sorted(step_seconds)
    median_step = step_seconds[len(step_seconds) // 2]
    return {"tokens": tokens, "seconds": sum(step_seconds), "median_step_ms": 1e3 * median_step,
            "tokens_per_s": batch / median_step}


# ---------------------------------------------------------------- one run

def run(model="smollm2-135m", batches=(1, 8, 32, 64), context=128, steps=16, rounds=2, hf=True,
        progress=True, dtype="float32") -> dict:
    import torch
    from tqdm import tqdm

    from minipaged.lab.bench.noise import gemm_probe, probe_pair
    from minipaged.lab.roofline import kv_bytes_per_token
    from minipaged.model import load_model

    probe_before = gemm_probe()
    if progress and not probe_before["reliable"]:
        import sys

        print("warning: the GEMM probe ran slower than expected: another process is using the cores", file=sys.stderr)
    big = torch.ones(2**28, dtype=torch.float32)  # 1 GiB, kept for the whole run

    def read_sample() -> float:
        return read_bandwidth(buf=big, repeats=3)

    loaded = load_model(model, dtype=dtype, progress=progress)
    hf_model = None
    if hf:
        from minipaged.lab.bench.hf_baseline import load_hf_model

        hf_model = load_hf_model(dtype) if model == "smollm2-135m" else None
    weights = weight_bytes_read(loaded.model)
    kv_per_token = kv_bytes_per_token(loaded.config, loaded.model.dtype.itemsize)
    rows = []
    for b in tqdm(batches, desc="decode, batch by batch", disable=not progress):
        prompts = make_prompts(loaded.config.vocab_size, b, context, seed=b)
        step_bytes = weights + kv_per_token * (context + steps // 2) * b  # K/V read at the middle step
        row = {"batch": b, "step_mbytes": step_bytes / 1e6, "read_samples_gbytes_s": []}
        matmul = {"plain": float("inf"), "model": float("inf")}
        for _ in range(rounds):  # engine, HF, engine, HF ...: each side keeps its best round
            row["read_samples_gbytes_s"].append(read_sample() / 1e9)  # just before the engine's steps: ...
            alone = matmul_only_seconds(loaded.model, b, repeats=3)  # ... the bandwidth and the matmuls,
            matmul = {way: min(matmul[way], alone[way]) for way in matmul}
            tries = [("engine", engine_decode(loaded, prompts, steps, model, dtype))]
            row["read_samples_gbytes_s"].append(read_sample() / 1e9)  # ... and the bandwidth just after
            if hf_model is not None:
                tries.append(("hf", hf_decode(hf_model, prompts, steps)))
            for side, got in tries:
                row.setdefault(f"{side}_tries", []).append(got["tokens_per_s"])
                if side not in row or got["tokens_per_s"] > row[side]["tokens_per_s"]:
                    row[side] = got
        row["read_gbytes_s"] = max(row["read_samples_gbytes_s"])  # the strictest bounds the row saw
        matmul_s = min(matmul.values())
        row.update(matmul_ms=1e3 * matmul_s, matmul_plain_ms=1e3 * matmul["plain"],
                   matmul_model_ms=1e3 * matmul["model"], matmul_gflops=matmul_flops(loaded.model, b) / matmul_s / 1e9)
        bounds = {"weight_streaming": b * row["read_gbytes_s"] * 1e9 / step_bytes, "arithmetic": b / matmul_s}
        row.update(bounds=bounds, roof=min(bounds.values()), binding=min(bounds, key=bounds.get))
        rows.append(row)
    probe_after = gemm_probe()
    result = {"model": model, "dtype": dtype, "context": context, "steps": steps, "rounds": rounds,
              "threads": torch.get_num_threads(),
              "weight_mbytes": weights / 1e6, "rows": rows,
              "probe": probe_pair(probe_before, probe_after)}
    result["targets"] = check_targets(result)
    return result


def _row(result, batch):
    return next((r for r in result["rows"] if r["batch"] == batch), None)


def check_targets(result) -> list[dict]:
    """The speed targets, each with what was measured (None where this run did not measure it)."""
    out = []
    one, many = _row(result, 1), _row(result, 32)
    if one:
        got = one["engine"]["tokens_per_s"] / one["bounds"]["weight_streaming"]
        out.append({"target": "batch 1: fraction of the weight-streaming bound",
                    "at_least": TARGETS["weight_streaming_at_1"], "measured": got})
    if many:
        got = many["engine"]["tokens_per_s"] / many["bounds"]["arithmetic"]
        out.append({"target": "batch 32: fraction of the matmul bound", "at_least": TARGETS["arithmetic_at_32"],
                    "measured": got})
    for row in (one, many):
        if row and "hf" in row:
            out.append({"target": f"batch {row['batch']}: engine / HF generate", "at_least": TARGETS["hf_ratio"],
                        "measured": row["engine"]["tokens_per_s"] / row["hf"]["tokens_per_s"]})
    for t in out:
        t["met"] = t["measured"] >= t["at_least"]
    return out


def report(r) -> str:
    lines = [f"{r['model']} ({r['dtype']}), {r['threads']} threads, "
             f"{r['weight_mbytes']:.0f} MB of weights read per step; {r['context']}-token prompts, "
             f"{r['steps']} decode steps timed, best of {r['rounds']} alternated rounds"]
    has_hf = any("hf" in row for row in r["rows"])
    head = (f"{'batch':>5} {'matmuls ms':>10} {'plain ms':>8} {'GFLOP/s':>8} {'read GB/s':>9} {'stream tok/s':>12} "
            f"{'matmul tok/s':>12} {'engine tok/s':>12} {'of roof':>7}")
    if has_hf:
        head += f" {'HF tok/s':>9} {'of roof':>7} {'engine/HF':>9}"
    lines.append(head)
    for row in r["rows"]:
        e = row["engine"]["tokens_per_s"]
        line = (f"{row['batch']:>5} {row['matmul_ms']:>10.1f} {row['matmul_plain_ms']:>8.1f} "
                f"{row['matmul_gflops']:>8.1f} {row['read_gbytes_s']:>9.1f} "
                f"{row['bounds']['weight_streaming']:>12.1f} {row['bounds']['arithmetic']:>12.1f} "
                f"{e:>12.1f} {e / row['roof']:>6.0%}")
        if "hf" in row:
            h = row["hf"]["tokens_per_s"]
            line += f" {h:>9.1f} {h / row['roof']:>6.0%} {e / h:>8.2f}x"
        lines.append(line)
    lines.append("(matmuls: the step's matmuls alone, the faster of plain F.linear and the model's Linear; "
                 "plain: F.linear alone;\n read: the highest read bandwidth sampled around the engine's rounds; "
                 "stream: the weight-streaming bound at that bandwidth;\n"
                 " matmul: batch / matmuls (at batch 1 a read of the weights, too); "
                 "roof: the lower of the two)")
    for t in r["targets"]:
        lines.append(f"target {t['target']}: {t['measured']:.2f} (at least {t['at_least']}) "
                     f"{'met' if t['met'] else 'NOT met'}")
    from minipaged.lab.bench.noise import describe_probe

    lines += describe_probe(r["probe"])
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--batches", default="1,8,32,64", help="comma-separated batch sizes (default: 1,8,32,64)")
    p.add_argument("--context", type=int, default=128, help="prompt tokens per sequence (default: 128)")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per batch size (default: 16)")
    p.add_argument("--rounds", type=int, default=2,
                   help="alternations of engine and HF per batch size; each side keeps its best (default: 2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and activations of both engines (default: float32, where outputs match HF's)")
    p.add_argument("--no-hf", action="store_true", help="skip HF Transformers (it runs only for smollm2-135m)")
    p.add_argument("--plot-dir", default=None, help="write decode_roofline.png here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def main(args) -> int:
    batches = tuple(int(b) for b in args.batches.split(","))
    if any(b < 1 for b in batches) or min(args.context, args.steps, args.rounds) < 1:
        raise ValueError("--batches, --context, --steps and --rounds must be positive integers")
    r = run(args.model, batches, args.context, args.steps, args.rounds, hf=not args.no_hf, progress=not args.json,
            dtype=args.dtype)
    capture.publish(r)
    if args.plot_dir:
        from pathlib import Path

        from minipaged.lab.plots.decode import plot_decode_roofline

        plot_decode_roofline(r, str(Path(args.plot_dir) / "decode_roofline.png"))
    print(json.dumps(r, indent=2) if args.json else report(r))
    return 0
