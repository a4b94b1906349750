"""End-to-end on a GPU: the engine serves a model with the numba kernels and with the reference.

    python scripts/gpu_e2e.py [--out e2e.json]

For the tiny model and SmolLM2-135M's shapes with seeded random weights (the real weights stay off
the GPU machine), fp32, KV blocks allocated on demand: greedy tokens with attention_backend="numba"
should equal those with "torch". Random weights give flat logits, so a single near-tie can flip a
token; the report says where the first difference is, and the wall time of each backend. Prompts are
cut to fit the model: a prompt plus its output stays within max_model_len (the tiny model allows 512).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from minipaged import LLM, SamplingParams

PROMPT_LENS = (5, 17, 100, 600)


def prompt_lens_for(max_model_len: int, max_tokens: int, wanted=PROMPT_LENS) -> list[int]:
    """PROMPT_LENS, each cut so that the prompt and its max_tokens outputs fit in max_model_len."""
    room = max_model_len - max_tokens
    if room < 1:
        raise ValueError(f"max_tokens={max_tokens} leaves no room for a prompt in max_model_len={max_model_len}")
    return [min(n, room) for n in wanted]


def make_prompts(lens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=gen).tolist() for n in lens]


def generate(model: str, backend: str, max_tokens: int, device: str = "cuda"):
    llm = LLM(model, kv_policy="on_demand", attention_backend=backend, device=device, progress=False,
              kv_capacity_tokens=16384)
    lens = prompt_lens_for(llm.max_model_len, max_tokens)
    prompts = make_prompts(lens)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm-up
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    return [list(o.outputs[0].token_ids) for o in outs], time.perf_counter() - t0, lens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="write the JSON report here too")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_e2e: no CUDA GPU here", file=sys.stderr)
        return 2
    report = []
    for model in ("tiny", "smollm2-135m-random"):
        (ref, ref_s, lens), (got, got_s, _) = (generate(model, b, args.max_tokens) for b in ("torch", "numba"))
        first_diff = [next((i for i, (a, b) in enumerate(zip(r, g)) if a != b), None) for r, g in zip(ref, got)]
        report.append({"model": model, "prompt_lens": lens, "same_tokens": ref == got,
                       "first_difference_per_prompt": first_diff, "seconds_torch": ref_s, "seconds_numba": got_s})
        print(f"{model}: same tokens: {ref == got} (first differences {first_diff}); "
              f"torch {ref_s:.2f}s, numba {got_s:.2f}s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if all(r["same_tokens"] for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
