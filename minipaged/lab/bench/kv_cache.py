"""Chapter 00's benchmark: decode tokens/s with the KV cache vs recomputing every token.

    python -m minipaged bench cache [--model smollm2-135m] [--new-tokens 64]

Both runs decode the same prompt greedily, in the same process, one after the other; the ratio is
what the cache buys. It also checks that both produced the same tokens (the cache changes speed,
never the result).
"""

from __future__ import annotations

import json
import time

from minipaged.engine import NaiveEngine
from minipaged.lab import capture
from minipaged.model import load_model
from minipaged.request import Sequence
from minipaged.sampling import make_generator
from minipaged.sampling_params import SamplingParams

DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue."


def run(model="smollm2-135m", new_tokens=64, prompt=DEFAULT_PROMPT, repeats=2, progress=True):
    loaded = load_model(model, progress=progress)
    tok = loaded.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": prompt}])
    ids = tok.encode(text)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    results = {}
    for use_cache in (True, False) * repeats:  # interleaved, so drift hits both alike
        engine = NaiveEngine(loaded.model, tok, use_cache=use_cache)
        seq = Sequence(0, ids, params, tok.eos_token_id, loaded.config.max_model_len)
        t0 = time.perf_counter()
        engine.run_sequence(seq, make_generator(0))
        elapsed = time.perf_counter() - t0
        rate = engine.stats["decode_tokens"] / engine.stats["decode_seconds"]
        key = "cache" if use_cache else "recompute"
        best = results.get(key)
        if best is None or rate > best["decode_tokens_per_s"]:
            results[key] = {"decode_tokens_per_s": rate, "seconds": elapsed,
                            "tokens_computed": engine.stats["tokens_computed"], "output": seq.output_ids}
    same = results["cache"]["output"] == results["recompute"]["output"]
    return {
        "model": model,
        "prompt_tokens": len(ids),
        "new_tokens": new_tokens,
        "cache_tokens_per_s": results["cache"]["decode_tokens_per_s"],
        "recompute_tokens_per_s": results["recompute"]["decode_tokens_per_s"],
        "speedup": results["cache"]["decode_tokens_per_s"] / results["recompute"]["decode_tokens_per_s"],
        "tokens_computed_cache": results["cache"]["tokens_computed"],
        "tokens_computed_recompute": results["recompute"]["tokens_computed"],
        "identical_outputs": same,
    }


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens to decode per run (default: 64)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="user message, wrapped in the chat template")
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode; the best is kept (default: 2)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args) -> int:
    r = run(args.model, args.new_tokens, args.prompt, args.repeats, progress=not args.json)
    capture.publish(r)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"model {r['model']}, prompt {r['prompt_tokens']} tokens, {r['new_tokens']} new tokens, greedy")
    print(f"  with KV cache     {r['cache_tokens_per_s']:8.1f} decode tokens/s "
          f"({r['tokens_computed_cache']} token positions computed)")
    print(f"  full recompute    {r['recompute_tokens_per_s']:8.1f} decode tokens/s "
          f"({r['tokens_computed_recompute']} token positions computed)")
    print(f"  speedup           {r['speedup']:8.2f}x   identical outputs: {r['identical_outputs']}")
    return 0 if r["identical_outputs"] else 1
