"""Making a student copy, and running an exercise's tests against a copy.

    student_copy(src, dst, exercises)   the repository with those exercises' regions stubbed, and
                                        the text without worked answers or quoted solutions
                                        (answers.py; keep_answers=True keeps them)
    run_tests(root, exercises)          run their tests in ``root``; one Result per exercise
    grading_tree(student, reference)    a temporary tree: the student's minipaged/ with the
                                        reference's tests, so that editing a test changes no grade

Tests run in a child ``python -m pytest`` whose working directory is the copy, so ``import minipaged``
finds the copy's package before any installed one.

Not handled: sandboxing a student's code (it runs with the grader's rights, as any test does), and a
time limit per test (one limit covers the whole run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from minipaged.lab.exercises.answers import LeftOut, solution_lines, strip_answers, text_files
from minipaged.lab.exercises.regions import find_regions, is_stub, stub_file

# Never copied into a student copy: version control, environments, build outputs, caches.
SKIP_DIRS = {".git", ".venv", ".venv-ci", "site", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
             ".ipynb_checkpoints", "node_modules", "build", "dist", ".mypy_cache"}


def repo_root(start: Path | None = None) -> Path:
    """The repository a command works on: the nearest folder, from ``start`` (default: the current one)
    upward, that holds both ``minipaged/`` and ``tests/``; else the one this package lives in."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "minipaged").is_dir() and (folder / "tests").is_dir():
            return folder
    return Path(__file__).resolve().parents[3]


def _ignore(folder, names):
    return [n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")]


@dataclass
class StudentCopy:
    stubbed: list[str]  # the exercise ids whose regions are stubs
    left_out: LeftOut  # worked answers and quoted solutions taken out of the text (none with keep_answers)


def student_copy(src: Path, dst: Path, exercises, keep_answers: bool = False) -> StudentCopy:
    """Copy the repository ``src`` to ``dst`` (which must not exist, or be empty) with the solution regions
    of ``exercises`` replaced by stubs and, unless ``keep_answers``, the chapters' and docs' worked answers
    and quotes of those regions taken out. ValueError if an exercise has no region."""
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise ValueError(f"DIR={str(dst)!r} exists and is not empty; name a new folder")
    regions = find_regions(src)
    by_id = {e.id: e for e in exercises}
    missing = sorted(set(by_id) - set(regions))
    if missing:
        raise ValueError(f"exercises {missing} have no '# exercise NN.K: begin/end' region in {src / 'minipaged'}")
    shutil.copytree(src, dst, ignore=_ignore, dirs_exist_ok=True)
    by_file: dict[Path, list] = {}
    for ex in by_id:
        for region in regions[ex]:
            by_file.setdefault(region.path, []).append(region)
    for rel, file_regions in by_file.items():
        (dst / rel).write_text(stub_file((src / rel).read_text(), file_regions, by_id))
    left_out = LeftOut(0, ())
    if not keep_answers:
        solutions: dict[str, dict[str, set[str]]] = {}
        for ex in by_id:
            for region in regions[ex]:
                solutions.setdefault(region.path.as_posix(), {}).setdefault(ex, set()).update(
                    solution_lines(src, [region]))
        answers, quotes = 0, []
        for path in text_files(dst):
            text, out = strip_answers(path.read_text(), solutions)
            if out.answers or out.quotes:
                path.write_text(text)
            answers, quotes = answers + out.answers, quotes + list(out.quotes)
        left_out = LeftOut(answers, tuple(quotes))
    return StudentCopy(sorted(by_id), left_out)


@dataclass
class Result:
    exercise: object
    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> passed / failed / skipped
    messages: dict[str, str] = field(default_factory=dict)  # node id -> first line of its error
    stub: bool = False  # the region is still the stub
    error: str = ""  # why the tests could not run at all

    @property
    def passed(self) -> int:
        return sum(o == "passed" for o in self.outcomes.values())

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def ok(self) -> bool:
        return not self.error and self.total > 0 and all(o != "failed" for o in self.outcomes.values())

    def first_failure(self) -> tuple[str, str] | None:
        for node, outcome in self.outcomes.items():
            if outcome == "failed":
                return node, self.messages.get(node, "")
        return None

    @property
    def status(self) -> str:
        if self.stub:
            return "not attempted"
        if self.error:
            return "error"
        return "pass" if self.ok else ("partial" if self.passed else "fail")


def _belongs(nodeid: str, selector: str) -> bool:
    return nodeid == selector or nodeid.startswith(selector + "::") or nodeid.startswith(selector + "[")


def run_tests(root: Path, exercises, *, timeout: float = 1800, stop_at_first_failure: bool = False,
              env: dict | None = None) -> list[Result]:
    """Run every test the exercises list, in one pytest run inside ``root``, and sort the outcomes by
    exercise (a test listed by two exercises counts for both). ``env`` adds environment variables."""
    root = Path(root).resolve()
    selectors = list(dict.fromkeys(t for e in exercises for t in e.tests))
    regions = find_regions(root)
    results = [Result(e, stub=is_stub(root, regions.get(e.id, []))) for e in exercises]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.jsonl"
        env = dict(os.environ, **(env or {}), MINIPAGED_RESULTS=str(out), PYTHONPATH=str(root))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
               "minipaged.lab.exercises.pytest_results", "--no-header", "-o", "addopts=--import-mode=importlib",
               *(["-x"] if stop_at_first_failure else []), *selectors]
        try:
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
            printed = proc.stdout + proc.stderr
            error = "" if proc.returncode in (0, 1) else _tail(printed)
        except subprocess.TimeoutExpired:
            printed, error = "", f"the tests did not finish within {timeout:.0f} s (an endless loop?)"
        records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    for result in results:
        result.error = error
        for rec in records:
            if any(_belongs(rec["nodeid"], s) for s in result.exercise.tests):
                if result.outcomes.get(rec["nodeid"]) != "failed":  # a failed teardown outranks a passed call
                    result.outcomes[rec["nodeid"]] = rec["outcome"]
                    if rec["message"]:
                        result.messages[rec["nodeid"]] = rec["message"]
        if not result.outcomes and not result.error:
            result.error = "none of its tests ran: " + _tail(printed)
    return results


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def grading_tree(student: Path, reference: Path, dst: Path) -> Path:
    """A tree to grade ``student`` in: the reference repository with the student's ``minipaged/`` in
    place of its own (so that a test edited in the student's copy changes nothing)."""
    student, reference = Path(student).resolve(), Path(reference).resolve()
    if not (student / "minipaged").is_dir():
        raise ValueError(f"DIR={str(student)!r} holds no minipaged/ folder; is it a student copy?")
    shutil.copytree(reference, dst, ignore=lambda f, n: _ignore(f, n) + (["minipaged"] if Path(f) == reference
                                                                         else []), dirs_exist_ok=True)
    shutil.copytree(student / "minipaged", dst / "minipaged", ignore=_ignore)
    return dst
