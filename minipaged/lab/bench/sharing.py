"""Chapter 05's measurement on the real engine: KV memory with block sharing vs without.

    python -m minipaged.lab.bench.sharing [--model smollm2-135m] [--max-tokens 64] [--plot-dir DIR]

Eight short instructions, in the model's chat template, run through ``LLM(kv_policy="shared")``:
parallel sampling with n = 2, 4, 6 (temperature 0.8, seed 0) and beam search with width 2, 4, 6.
After every forward pass the engine records the blocks in use and the blocks the same sequences
would hold without sharing (the sum of their block-table lengths, what ``on_demand`` takes); the
saved fraction is 1 - sum(in use) / sum(unshared) over the run. Unlike the trace simulator
(``python -m minipaged.lab.simulator --sharing``), the beams here branch and die as SmolLM2 decides.

A run takes about a minute and a half on two CPU cores (the reference attention is plain PyTorch). With
--plot-dir it also draws the blocks per step of the beam search of width --plot-width (beam_blocks.png).
"""

from __future__ import annotations

import argparse
import json
import os

from minipaged.lab import capture
from minipaged.lab.bench import add_output_arguments

INSTRUCTIONS = [
    "Give three tips for keeping a houseplant alive.",
    "Explain what a prime number is.",
    "Write a short sentence about autumn.",
    "Name two uses of a paperclip.",
    "Describe the color blue to someone who cannot see.",
    "Suggest a name for a bakery.",
    "Why do we need sleep?",
    "Summarize the water cycle in one sentence.",
]


def run(model="smollm2-135m", max_tokens=64, sizes=(2, 4, 6), block_size=16, progress=False, plot_dir=None,
        plot_width=4):
    from minipaged import LLM, SamplingParams
    from minipaged.metrics_reader import find
    from minipaged.sampling_params import BeamSearchParams

    llm = LLM(model, kv_policy="shared", block_size=block_size, kv_capacity_tokens=32768, attention_backend="torch",
              progress=progress)
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": text}]) for text in INSTRUCTIONS]
    block_bytes = 2 * llm.config.num_layers * block_size * llm.config.num_kv_heads * llm.config.head_dim * 4
    rows = []
    for mode in ("parallel", "beam"):
        for n in sizes:
            forks, copies = llm.engine.stats.get("forks", 0), find(llm.get_metrics(), "block_copies").value
            with llm.engine.metrics.steps.recording() as rec:  # blocks in use at every forward pass of this run
                if mode == "parallel":
                    llm.generate(prompts, SamplingParams(n=n, temperature=0.8, seed=0, max_tokens=max_tokens),
                                 use_tqdm=False)
                else:
                    llm.beam_search(prompts, BeamSearchParams(beam_width=n, max_tokens=max_tokens))
            physical, logical = rec.series("blocks_physical"), rec.series("blocks_logical")
            rows.append({"mode": mode, "n": n, "saved": 1 - sum(physical) / sum(logical),
                         "forward_passes": len(physical), "peak_blocks_shared": max(physical),
                         "peak_blocks_unshared": max(logical), "forks": llm.engine.stats["forks"] - forks,
                         "block_copies": find(llm.get_metrics(), "block_copies").value - copies})
            if plot_dir and mode == "beam" and n == plot_width:
                from minipaged.lab.plots import plot_blocks_over_time

                os.makedirs(plot_dir, exist_ok=True)
                plot_blocks_over_time(physical, logical, block_bytes=block_bytes,
                                      path=os.path.join(plot_dir, "beam_blocks.png"),
                                      title=f"{model}, beam width {n}, {len(prompts)} prompts: "
                                            f"{100 * rows[-1]['saved']:.1f}% saved")
            llm.engine.policy.check_invariants()
            assert not llm.engine.policy.seq_ids(), "blocks leaked"
    prompt_lens = [len(llm.tokenizer.encode(p)) for p in prompts]
    return {"model": model, "prompts": len(prompts), "mean_prompt_tokens": sum(prompt_lens) / len(prompt_lens),
            "max_tokens": max_tokens, "block_size": block_size, "rows": rows}


def format_result(result: dict) -> str:
    lines = [f"{result['model']}: {result['prompts']} chat prompts (mean {result['mean_prompt_tokens']:.1f} "
             f"tokens), max_tokens {result['max_tokens']}, block size {result['block_size']}, policy 'shared'\n",
             f"{'sharing':<24}{'saved':>7}{'peak blocks':>13}{'unshared':>10}{'forks':>7}{'copies':>8}{'passes':>8}"]
    lines.append("-" * len(lines[-1]))
    for r in result["rows"]:
        label = f"{'parallel sampling n' if r['mode'] == 'parallel' else 'beam search width'} = {r['n']}"
        lines.append(f"{label:<24}{100 * r['saved']:>6.1f}%{r['peak_blocks_shared']:>13}{r['peak_blocks_unshared']:>10}"
                     f"{r['forks']:>7}{r['block_copies']:>8}{r['forward_passes']:>8}")
    lines.append("\nsaved = 1 - sum over forward passes of blocks in use / blocks the same sequences hold unshared")
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per sample or beam (default: 64)")
    add_output_arguments(p, "beam_blocks.png (blocks per step of one beam search)", table="a table")
    p.add_argument("--plot-width", type=int, default=4, help="the beam width that figure shows (default: 4)")


def main(args) -> int:
    result = run(args.model, args.max_tokens, plot_dir=args.plot_dir, plot_width=args.plot_width)
    capture.publish(result)
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.bench.sharing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
