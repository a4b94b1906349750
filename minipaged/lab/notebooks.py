"""The notebooks' stored outputs: a student reading a notebook on a forge sees what each cell printed.

The docs build (``python docs/build.py``) executes every notebook in a fresh kernel and keeps the
executed copies in build/docs/executed/. This module copies their outputs into the committed
notebooks, so the outputs travel with the repository:

    python docs/build.py --check-notebooks          execute them (or reuse the cache of earlier builds)
    python -m minipaged.lab.notebooks store         copy each executed notebook's outputs into notebooks/
    python -m minipaged.lab.notebooks check         exit 1 if a notebook's code changed since its outputs

Only outputs and execution counts are copied, and only into a notebook whose code cells are exactly
those that were executed (the markdown may differ: it is not run). Each stored notebook's metadata
says which code produced its outputs (``minipaged_outputs``: a hash of its code cells, the commit
and the machine), and ``check`` (tests/test_reading_path.py runs it) fails when a code cell was
edited without storing fresh outputs.

Not handled: outputs that differ from run to run (timings, a shared machine's bandwidth) are stored as
one run printed them; the docs build executes every notebook again, so the site shows its own run.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "docs" / "executed"
KEY = "minipaged_outputs"


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _write(path: Path, nb: dict, like: str) -> None:
    indent = 1 if '\n "cells"' in like else 2
    path.write_text(json.dumps(nb, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def code_hash(nb: dict) -> str:
    """A hash of the notebook's code, cell by cell: what its outputs depend on (besides the package)."""
    h = hashlib.sha256()
    for cell in code_cells(nb):
        h.update("".join(cell["source"]).encode() + b"\0")
    return h.hexdigest()[:16]


def _commit(where: Path) -> str:
    """The commit of the checkout that executed the notebooks (where: its executed folder)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def store(executed_dir: Path = EXECUTED, names: list[str] | None = None) -> list[str]:
    """Copy outputs from executed_dir's notebooks into notebooks/; returns the problems found."""
    problems = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        if names and not any(path.name.startswith(n) for n in names):
            continue
        source = executed_dir / path.name
        if not source.exists():
            problems.append(f"{path.name}: no executed copy in {executed_dir}; "
                            "run python docs/build.py --check-notebooks")
            continue
        like = path.read_text(encoding="utf-8")
        nb, ran = json.loads(like), _read(source)
        if code_hash(nb) != code_hash(ran):
            problems.append(f"{path.name}: its code changed since {source} was executed; run "
                            f"python docs/build.py --only {path.name[:2]} --check-notebooks, then store again")
            continue
        for mine, theirs in zip(code_cells(nb), code_cells(ran)):
            mine["outputs"], mine["execution_count"] = theirs.get("outputs", []), theirs.get("execution_count")
        seconds = ran.get("metadata", {}).get("minipaged_docs", {}).get("seconds")
        nb.setdefault("metadata", {})[KEY] = {
            "code_sha256": code_hash(nb), "commit": _commit(executed_dir), "seconds": seconds,
            "machine": f"{_cpu()}, {os.cpu_count()} cores"}
        _write(path, nb, like)
        print(f"stored the outputs of {path.name} ({sum(bool(c['outputs']) for c in code_cells(nb))} of "
              f"{len(code_cells(nb))} code cells print something)")
    return problems


def check() -> list[str]:
    """Problems with the stored outputs: a notebook never stored, or code edited since."""
    problems = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = _read(path)
        meta = nb.get("metadata", {}).get(KEY)
        if meta is None:
            problems.append(f"{path.name}: no stored outputs")
        elif meta["code_sha256"] != code_hash(nb):
            problems.append(f"{path.name}: a code cell changed since its outputs were stored (at {meta['commit']})")
        elif any(c.get("execution_count") is None for c in code_cells(nb)):
            problems.append(f"{path.name}: a code cell has no execution count")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.notebooks", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["store", "check"])
    parser.add_argument("--from", dest="executed", type=Path, default=EXECUTED,
                        help="the folder of executed notebooks (default: build/docs/executed)")
    parser.add_argument("--only", action="append", help="notebooks whose name starts with this (repeatable)")
    args = parser.parse_args(argv)
    problems = store(args.executed, args.only) if args.command == "store" else check()
    for p in problems:
        print(p)
    if problems and args.command == "check":
        print("to store fresh outputs: python docs/build.py --check-notebooks && "
              "python -m minipaged.lab.notebooks store")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
