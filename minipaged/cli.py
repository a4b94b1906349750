"""The command line: `python -m minipaged {chat,generate,serve,bench,simulate} ...`.

    python -m minipaged chat "What is the capital of France?"
    python -m minipaged generate "Once upon a time" --max-tokens 32
    python -m minipaged generate --file prompts.txt --temperature 0.8 --seed 1
    python -m minipaged bench cache
    python -m minipaged simulate --workload sharegpt --policy all
    python -m minipaged serve smollm2-135m --port 8000      (an OpenAI-compatible server, chapter 11)

Every option is explained by `--help` on each subcommand. ``bench`` and ``simulate`` belong to the
lab (minipaged/lab/cli.py), which this module imports only when one of them is asked for.
"""

from __future__ import annotations

import argparse
import json
import sys

# Commands of the lab (minipaged/lab/): benchmarks and simulators, which measure the engine.
LAB_COMMANDS = {"bench": "benchmarks, each printing ratios measured side by side in one run (minipaged/lab/bench/)",
                "simulate": "compare KV policies on a synthetic trace, no model needed (minipaged/lab/simulator/)"}


def _add_model_options(p):
    p.add_argument("--model", default="smollm2-135m",
                   help="'smollm2-135m' (the real chat model, fetched on first use), 'smollm2-135m-random', "
                        "'tiny', or a path to a .gguf file (default: smollm2-135m)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and activations dtype (default: float32)")


def _add_sampling_options(p, max_tokens_default):
    p.add_argument("--max-tokens", type=int, default=max_tokens_default,
                   help=f"most new tokens per output (default: {max_tokens_default})")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 is greedy (default); higher values sample more freely")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold in (0, 1] (default: 1)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens; 0 = all")
    p.add_argument("--seed", type=int, default=None, help="random seed: same seed, same text")
    p.add_argument("--n", type=int, default=1, help="completions per prompt (default: 1)")
    p.add_argument("--stop", action="append", default=None,
                   help="a string that ends the output; repeat the option for several")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-text token")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 makes every token of the prompt and output less likely; 1 is off (default)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="in [-2, 2]: lowers each token already in the output once (default: 0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="in [-2, 2]: lowers each token once per time it is already in the output (default: 0)")
    p.add_argument("--json", action="store_true", help="print the outputs as JSON")


def _sampling_params(args):
    from minipaged.sampling_params import SamplingParams

    return SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          seed=args.seed, stop=args.stop, max_tokens=args.max_tokens,
                          ignore_eos=args.ignore_eos, repetition_penalty=args.repetition_penalty,
                          presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty)


def _print_outputs(outputs, as_json):
    if as_json:
        print(json.dumps([{"prompt": o.prompt, "prompt_token_ids": o.prompt_token_ids,
                           "outputs": [{"text": c.text, "token_ids": c.token_ids,
                                        "finish_reason": c.finish_reason} for c in o.outputs]}
                          for o in outputs], indent=2))
        return
    for o in outputs:
        for c in o.outputs:
            print(c.text)
            if len(outputs) > 1 or len(o.outputs) > 1:
                print(f"--- ({c.finish_reason})")


def cmd_chat(args) -> int:
    from minipaged import LLM

    params = _sampling_params(args)  # a bad option fails before the weights load
    llm = LLM(args.model, dtype=args.dtype)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.message})
    _print_outputs(llm.chat(messages, params, use_tqdm=False), args.json)
    return 0


def cmd_generate(args) -> int:
    from minipaged import LLM

    prompts = list(args.prompts)
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n").replace("\\n", "\n") for line in f if line.strip()]
    if not prompts:
        print("generate: give prompts as arguments or with --file (one prompt per line)", file=sys.stderr)
        return 2
    params = _sampling_params(args)  # a bad option fails before the weights load
    llm = LLM(args.model, dtype=args.dtype)
    _print_outputs(llm.generate(prompts, params), args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m minipaged",
        description="minipaged: a small LLM engine that shows how PagedAttention manages KV-cache memory.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("chat", help="ask the chat model one question",
                       description="Wrap MESSAGE in the model's chat template and print the answer.")
    p.add_argument("message", help="the user's message")
    p.add_argument("--system", default=None, help="a system prompt (default: the model's own)")
    _add_model_options(p)
    _add_sampling_options(p, max_tokens_default=256)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("generate", help="complete raw text prompts",
                       description="Complete each prompt as plain text (no chat template).")
    p.add_argument("prompts", nargs="*", help="prompts to complete")
    p.add_argument("--file", default=None,
                   help="a text file with one prompt per line (write \\n for a newline inside a prompt)")
    _add_model_options(p)
    _add_sampling_options(p, max_tokens_default=64)
    p.set_defaults(func=cmd_generate)

    from minipaged.server import serve

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the engine (chapter 11)",
                       description=serve.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_arguments(p)
    p.set_defaults(func=serve.main)

    for name, text in LAB_COMMANDS.items():  # the lab's commands, parsed by the lab (minipaged/lab/cli.py)
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in LAB_COMMANDS:  # the instruments live in the lab, imported only for them
        from minipaged.lab.cli import main as lab_main

        return lab_main(argv)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except ValueError as e:  # bad input: say what is wrong, without a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
