"""What the compiled CPU kernels are worth: the engine's decode step with and without them, in one process.

    python scripts/ab_kernels.py [--rounds 3] [--batches 1,8,32,64] [--configs base,kernels,attention,both,one_thread]

Engines on one copy of SmolLM2-135M, alternated round by round, each keeping its best median
step (the same measurement as `bench decode`: 16 decode steps after 128-token prompts, each step
timed alone):

    base       attention_backend="torch_batched", cpu_kernels=False: chapter 06's PyTorch path
    kernels    torch_batched attention, the model's small operations and thin products compiled
    attention  the compiled decode attention (attention_backend="cpu"), the model in PyTorch
    both       the default engine: both compiled
    one_thread the default engine on one thread (torch.set_num_threads(1)) instead of two

It prints each one's step time and its speed-up over the first, and checks that every engine made
the same greedy tokens as the first. Run it alone on the machine (docs/pages/speed.md says why).

Not handled: dtypes other than float32 (the kernels are float32 only).
"""

from __future__ import annotations

import argparse
import time

import torch

CONFIGS = {"base": dict(attention_backend="torch_batched", cpu_kernels=False),
           "kernels": dict(attention_backend="torch_batched", cpu_kernels=True),
           "attention": dict(attention_backend="cpu", cpu_kernels=False),
           "both": dict(attention_backend="cpu", cpu_kernels=True),
           "one_thread": dict(attention_backend="cpu", cpu_kernels=True, threads=1)}


def decode_step_ms(loaded, prompts, steps, options) -> tuple[float, list]:
    """Median decode step (ms) of an engine with ``options`` on ``prompts``, and its greedy tokens
    (``threads``, if given, is PyTorch's thread count meanwhile)."""
    options = dict(options)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(options.pop("threads", threads_before))
    try:
        return _decode_step_ms(loaded, prompts, steps, options)
    finally:
        torch.set_num_threads(threads_before)


def _decode_step_ms(loaded, prompts, steps, options) -> tuple[float, list]:
    from minipaged.config import EngineArgs
    from minipaged.llm_engine import LLMEngine
    from minipaged.sampling_params import SamplingParams

    batch, context = len(prompts), len(prompts[0])
    need = batch * (context + steps + 2)
    args = EngineArgs(model="smollm2-135m", kv_capacity_tokens=max(8192, need + need // 8),
                      max_num_seqs=max(64, batch), progress=False, **options)
    engine = LLMEngine(args, loaded=loaded)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 2, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", {"prompt_token_ids": ids}, params)
    seqs = [s for r in engine.core.requests.values() for s in r.seqs]
    while any(not s.output_ids for s in seqs):  # the prefill
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    tokens = [list(s.output_ids) for s in seqs]
    engine.abort_all()
    return 1e3 * sorted(times)[len(times) // 2], tokens


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--configs", default="base,kernels,attention,both", help=f"from {', '.join(CONFIGS)}")
    p.add_argument("--steps", type=int, default=16)
    args = p.parse_args(argv)
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"--configs: {unknown} not known; choose from {', '.join(CONFIGS)}")
    batches = [int(b) for b in args.batches.split(",")]

    from tqdm import tqdm

    from minipaged.lab.bench.decode import make_prompts
    from minipaged.lab.bench.noise import describe_probe, gemm_probe, probe_pair
    from minipaged.model import kernels, load_model

    if kernels.ops() is None:
        print("the compiled kernels are not available here: nothing to compare")
        return 1
    probe = gemm_probe()
    loaded = load_model("smollm2-135m", progress=False)
    best, tokens = {}, {}
    with tqdm(total=args.rounds * len(batches) * len(names), desc="engines", unit="run") as bar:
        for _ in range(args.rounds):
            for batch in batches:
                prompts = make_prompts(loaded.model.config.vocab_size, batch, 128)
                for name in names:
                    ms, toks = decode_step_ms(loaded, prompts, args.steps, CONFIGS[name])
                    best[batch, name] = min(best.get((batch, name), float("inf")), ms)
                    tokens[batch, name] = toks
                    bar.update()
    after = gemm_probe()
    print(f"median decode step, best of {args.rounds} alternated rounds (speed-up over {names[0]!r}):")
    for batch in batches:
        base = best[batch, names[0]]
        cells = "  ".join(f"{n} {best[batch, n]:6.1f} ms ({base / best[batch, n]:.2f}x)" for n in names)
        same = all(tokens[batch, n] == tokens[batch, names[0]] for n in names)
        print(f"  batch {batch:3}: {cells}  greedy tokens equal: {same}")
    print("\n".join(describe_probe(probe_pair(probe, after))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
