"""The package's layout keeps its promises: the engine never imports the lab, no two modules import each
other in a circle, and the engine runs with the lab deleted.

Imports are read from the source (every ``import`` and ``from ... import``, at module level or inside
a function), so an import made lazily counts as much as one at the top. The one import of the lab an
engine module may make is the command line's: ``python -m minipaged bench|simulate`` hands its
arguments to minipaged/lab/cli.py (minipaged/cli.py imports it inside ``main``).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minipaged"
LAB = "minipaged.lab"
CLI_DISPATCH = {("minipaged.cli", "minipaged.lab.cli")}  # the command line's lazy hand-off to the lab


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that the file at ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` imports the module pkg.sub when there is one, else pkg itself
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # ``import a.b.c`` of a module a.b: a.b
                name = name.rpartition(".")[0]
            if name.startswith("minipaged"):
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_engine_never_imports_the_lab():
    bad = sorted((name, target) for name, targets in graph().items() if not name.startswith(LAB)
                 for target in targets if target.startswith(LAB) and (name, target) not in CLI_DISPATCH)
    assert not bad, f"engine modules import the lab: {bad}"


def test_no_two_modules_import_each_other_in_a_circle():
    edges = {name: {t for t in targets if (name, t) not in CLI_DISPATCH} for name, targets in graph().items()}
    assert cycle(edges) is None, f"an import circle: {' -> '.join(cycle(edges))}"


def test_the_circle_finder_finds_a_circle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_engine_runs_with_the_lab_deleted(tmp_path):
    """A copy of minipaged/ without lab/ serves a request (the tiny model) and says nothing is missing."""
    copy = tmp_path / "minipaged"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("lab", "__pycache__"))
    script = ("from minipaged import LLM, SamplingParams\n"
              "llm = LLM('tiny', progress=False)\n"
              "out = llm.generate(['Hello'], SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)\n"
              "assert len(out[0].outputs[0].token_ids) == 5\n"
              "import minipaged, sys; assert minipaged.__file__.startswith(sys.argv[1]), minipaged.__file__\n"
              "print('served')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "served" in done.stdout, done.stderr[-3000:]
    help_text = subprocess.run([sys.executable, "-m", "minipaged", "--help"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0 and "chat" in help_text.stdout, help_text.stderr[-2000:]
