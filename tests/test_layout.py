"""The package's layout keeps its promises: the engine never imports the lab, no two modules import each
other in a circle, and the engine runs with the lab deleted.

Imports are read from the source (every ``import`` and ``from ... import``, at module level or inside
a function; minipaged/lab/architecture.py reads them), so an import made lazily counts as much as
one at the top. The one import of the lab an engine module may make is the command line's:
``python -m minipaged bench|simulate`` hands its arguments to minipaged/lab/cli.py (minipaged/cli.py
imports it inside ``main``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from minipaged.lab.architecture import LAB, PACKAGE, cycle, graph

CLI_DISPATCH = {("minipaged.cli", "minipaged.lab.cli")}  # the command line's lazy hand-off to the lab


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
