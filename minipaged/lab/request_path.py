"""Which of the package's files one request runs through, in the order it meets them.

    python -m minipaged.lab.request_path                  the default LLM("smollm2-135m"), one chat request
    python -m minipaged.lab.request_path --model tiny     the same on random weights (no download)
    python -m minipaged.lab.request_path --markdown       the table the architecture page shows
    PYTHONPATH=/tmp/before python minipaged/lab/request_path.py   another checkout's package, traced

It loads the model and answers one chat request to warm up (the first one builds what later ones
reuse), then answers a second with a profiler hook on (``sys.setprofile``) that notes every Python
function called and the file it lives in. The files under minipaged/ are listed in the order the
request first entered them, with their lengths; the total is what a reader has to hold to follow one
request from the front end to the sampled token and back. The C++ kernels (csrc/) are not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def trace(model="smollm2-135m", max_tokens: int = 8) -> list[dict]:
    """[{"path": "minipaged/...", "lines": n}] for the files one chat request runs, in first-call order.
    ``model``: a model's name, or an LLM already loaded (its default options are what is traced)."""
    import minipaged
    from minipaged import LLM, SamplingParams

    package = Path(minipaged.__file__).resolve().parent  # the one imported: another checkout's, with PYTHONPATH
    llm = LLM(model) if isinstance(model, str) else model
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.chat(MESSAGES, params, use_tqdm=False)  # warm-up: what only the first request builds
    seen: dict[str, None] = {}
    prefix = str(package) + "/"

    def hook(frame, event, arg):
        if event == "call":
            name = frame.f_code.co_filename
            if name.startswith(prefix) and name not in seen:
                seen[name] = None

    sys.setprofile(hook)
    try:
        llm.chat(MESSAGES, params, use_tqdm=False)
    finally:
        sys.setprofile(None)
    return [{"path": str(Path(f).relative_to(package.parent)), "lines": len(Path(f).read_text().splitlines())}
            for f in seen]


def markdown(files: list[dict]) -> str:
    rows = ["| # | file | lines |", "|---:|---|---:|"]
    rows += [f"| {i} | `{f['path']}` | {f['lines']:,} |" for i, f in enumerate(files, 1)]
    rows.append(f"| | **{len(files)} files** | **{sum(f['lines'] for f in files):,}** |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.request_path", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="the model to load (default: %(default)s)")
    parser.add_argument("--markdown", action="store_true", help="print the table the architecture page shows")
    parser.add_argument("--json", action="store_true", help="print the list as JSON")
    args = parser.parse_args(argv)
    files = trace(args.model)
    if args.json:
        print(json.dumps(files, indent=1))
    elif args.markdown:
        print(markdown(files))
    else:
        for i, f in enumerate(files, 1):
            print(f"{i:>3}  {f['lines']:>5}  {f['path']}")
        print(f"{len(files)} files, {sum(f['lines'] for f in files):,} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
