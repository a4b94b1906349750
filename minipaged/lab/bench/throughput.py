"""The finished engine against HF Transformers' padded ``generate``, on chat workloads a user would send.

    python -m minipaged bench throughput [--rounds 2] [--hf-batch-size 8] [--requests N] [--json]

Two workloads, each sent whole to both systems, greedy, stopping at EOS as a chat request does:

    readme   24 questions in the chat template, SamplingParams(temperature=0, max_tokens=32): the
             README's first example, sent as a batch
    support  32 help-desk questions behind one shared system prompt (chapter 07's), max_tokens 64

Systems:

    minipaged   ``LLM(model)`` with nothing else: the default engine (paged blocks with the prefix
                cache, continuous batching, the batched CPU attention)
    chunked     the same with ``enable_chunked_prefill=True`` (chapter 08, a budget of 256 tokens
                per step): measured beside the default to show what turning it on by default
                would cost or gain
    HF          HF Transformers' ``generate`` on the same GGUF file, left-padded batches of
                --hf-batch-size in arrival order, no memory limit; a batch ends when all its rows
                have produced EOS or max_tokens

Output tokens count what each request really produced (up to and including its EOS), the same
rule for both. Rounds alternate the two systems; the figures are the medians. The greedy outputs
are compared token for token (both compute in float32 from the same weights, so they should agree).

Not measured here: memory limits (chapter 06's ``bench serving`` gives both the same KV memory),
arrivals over time, sampling.
"""

from __future__ import annotations

import json
import statistics
import time

from minipaged.lab import capture
from minipaged.lab.bench.prefix import QUESTIONS, SYSTEM_PROMPT

README_QUESTIONS = [
    "What is the capital of France?", "Explain paging in one sentence.", "Name three primary colors.",
    "What does a CPU do?", "Give me a synonym for happy.", "How many legs does a spider have?",
    "What is the boiling point of water?", "Write a haiku about rain.", "Who wrote Romeo and Juliet?",
    "What is two plus two?", "Translate 'thank you' into Spanish.", "Why is the sky blue?",
    "What is a prime number?", "Suggest a name for a cat.", "What is the largest planet?",
    "How do plants make food?", "Define the word 'ephemeral'.", "What language is spoken in Brazil?",
    "Give one tip for better sleep.", "What is the speed of light?", "What is an adjective?",
    "Name a famous painter.", "How many continents are there?", "What is the opposite of cold?",
]
SUPPORT_QUESTIONS = QUESTIONS + [
    "Do you have audiobooks?", "Can I donate old books?", "Where can I park?", "Is there a children's corner?",
    "Can I return books on Sunday?", "Do you have newspapers?", "How do I reserve a book?", "Can I eat inside?",
    "Is there a photocopier?", "Do you run reading clubs?", "Can I use a laptop there?", "What is my card's PIN?",
    "Are dogs allowed?", "Do you lend board games?", "How old must I be to volunteer?", "Is the building accessible?",
]
WORKLOADS = {"readme": (README_QUESTIONS, None, 32), "support": (SUPPORT_QUESTIONS, SYSTEM_PROMPT, 64)}


def chat_prompts(tokenizer, name: str) -> tuple[list[list[int]], int]:
    questions, system, max_tokens = WORKLOADS[name]
    chats = [([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": q}]
             for q in questions]
    return [tokenizer.encode(tokenizer.apply_chat_template(c)) for c in chats], max_tokens


def run_minipaged(llm, prompts, max_tokens: int) -> dict:
    from minipaged import SamplingParams

    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [o.outputs[0].token_ids for o in outs]
    return {"seconds": seconds, "output_tokens": sum(map(len, tokens)), "tokens": tokens}


def run_hf(model, prompts, max_tokens: int, batch_size: int, eos: int, pad: int = 0) -> dict:
    import torch

    start, tokens = time.perf_counter(), []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=pad, eos_token_id=eos)
        for row in out[:, width:].tolist():  # each row's own tokens: up to and including its EOS
            tokens.append(row[:row.index(eos) + 1] if eos in row else row)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "output_tokens": sum(map(len, tokens)), "tokens": tokens}


def run(model="smollm2-135m", workloads=("readme", "support"), rounds=2, hf_batch_size=8, progress=True,
        requests=None) -> dict:
    """Both systems on each workload (its first ``requests`` requests when given), medians of ``rounds``."""
    from tqdm import tqdm

    from minipaged import LLM
    from minipaged.lab.bench.hf_baseline import load_hf_model

    for name in workloads:
        if name not in WORKLOADS:
            raise ValueError(f"workload {name!r} is not known; choose from {list(WORKLOADS)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r} must be an integer >= 1")
    if requests is not None and (isinstance(requests, bool) or not isinstance(requests, int) or requests < 1):
        raise ValueError(f"requests={requests!r} must be an integer >= 1, or None for every request")
    llm = LLM(model, progress=False)
    chunked = LLM(model, progress=False, enable_chunked_prefill=True)
    engines = {"minipaged": llm, "chunked": chunked}
    hf = load_hf_model()
    if hf is None:
        raise ValueError("bench throughput needs HF Transformers (pip install -e \".[test]\")")
    eos = llm.tokenizer.eos_token_id
    result = {"model": model, "rounds": rounds, "hf_batch_size": hf_batch_size, "engine": repr(llm.args),
              "workloads": {}}
    todo = [(name, r) for name in workloads for r in range(rounds)]
    systems = ("minipaged", "chunked", "hf")
    bar = tqdm(total=len(systems) * len(todo), desc="bench throughput", unit="run", disable=not progress)
    for name in workloads:
        prompts, max_tokens = chat_prompts(llm.tokenizer, name)
        prompts = prompts[:requests]
        for engine in engines.values():
            engine.generate(prompts[:2], None, use_tqdm=False)  # first-call overheads, not timed
        runs = {system: [] for system in systems}
        for r in range(rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            for system in order:
                if system in engines:
                    engines[system].reset_prefix_cache()  # every round starts cold
                    runs[system].append(run_minipaged(engines[system], prompts, max_tokens))
                else:
                    runs[system].append(run_hf(hf, prompts, max_tokens, hf_batch_size, eos))
                bar.update(1)
        row = {"requests": len(prompts), "max_tokens": max_tokens,
               "prompt_tokens": sum(map(len, prompts))}
        for system, done in runs.items():
            rates = [d["output_tokens"] / d["seconds"] for d in done]
            row[system] = {"output_tokens": done[0]["output_tokens"], "seconds": statistics.median(d["seconds"]
                                                                                                   for d in done),
                           "output_tokens_per_s": statistics.median(rates)}
        ours, theirs = runs["minipaged"][0]["tokens"], runs["hf"][0]["tokens"]
        row["identical_requests"] = sum(a == b for a, b in zip(ours, theirs))
        row["chunked_identical"] = runs["chunked"][0]["tokens"] == ours
        row["speedup"] = row["minipaged"]["output_tokens_per_s"] / row["hf"]["output_tokens_per_s"]
        row["chunked_vs_default"] = row["chunked"]["output_tokens_per_s"] / row["minipaged"]["output_tokens_per_s"]
        result["workloads"][name] = row
    bar.close()
    return result


def format_result(r: dict) -> str:
    lines = [f"{r['model']}: the default LLM() against HF generate (padded batches of {r['hf_batch_size']}, "
             f"no memory limit), greedy, medians of {r['rounds']} rounds",
             f"default engine: {r['engine']}", "",
             f"{'workload':<10}{'requests':>9}{'system':>12}{'out tokens':>12}{'seconds':>9}{'out tok/s':>11}"]
    for name, row in r["workloads"].items():
        for system in ("minipaged", "chunked", "hf"):
            s = row[system]
            lines.append(f"{name:<10}{row['requests']:>9}{system:>12}{s['output_tokens']:>12}{s['seconds']:>9.2f}"
                         f"{s['output_tokens_per_s']:>11.1f}")
    lines.append("\nratios, measured in this run (output tokens/s, minipaged / HF):")
    for name, row in r["workloads"].items():
        lines.append(f"  {name:<10} {row['speedup']:.2f}x   identical greedy outputs: "
                     f"{row['identical_requests']} of {row['requests']} requests")
    lines.append("chunked prefill on / the default (output tokens/s):")
    for name, row in r["workloads"].items():
        lines.append(f"  {name:<10} {row['chunked_vs_default']:.2f}x   same outputs as the default: "
                     f"{'yes' if row['chunked_identical'] else 'NO'}")
    return "\n".join(lines)


def add_arguments(p):
    p.add_argument("--model", default="smollm2-135m", help="model name (default: smollm2-135m)")
    p.add_argument("--workloads", nargs="+", default=["readme", "support"], choices=list(WORKLOADS),
                   help="which workloads to run (default: both)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per system; figures are medians (default: 2)")
    p.add_argument("--hf-batch-size", type=int, default=8, help="HF generate's padded batch size (default: 8)")
    p.add_argument("--requests", type=int, default=None,
                   help="send only each workload's first N requests (default: all of them)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args) -> int:
    r = run(args.model, tuple(args.workloads), args.rounds, args.hf_batch_size, progress=not args.json,
            requests=args.requests)
    if args.json or args.record is not None:
        for row in r["workloads"].values():
            for system in ("minipaged", "chunked", "hf"):
                row[system].pop("tokens", None)
    capture.publish(r)
    print(json.dumps(r, indent=2) if args.json else format_result(r))
    return 0
