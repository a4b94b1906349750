"""The graded exercises, one module per chapter (ch00.py ... ch11.py), each a list ``EXERCISES``.

An exercise names its solution region in ``minipaged/`` (by its id, ``NN.K``: chapter NN, exercise K),
says in a few sentences what to write, which invariant must hold and a hint, and lists the tests that
grade it: pytest node ids or test files, run from the repository root. Most are the chapter's own
tests; each must fail while the region is a stub and pass with the reference code
(tests/test_exercises.py proves both for every exercise).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

CHAPTER_MODULES = ("ch00", "ch01", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08", "ch09", "ch10", "ch11")


@dataclass(frozen=True)
class Exercise:
    id: str  # "NN.K"
    title: str  # a few words: what the student writes
    task: str  # what to implement and which invariant must hold
    hint: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the repository root
    minutes: int = 30  # about how long it takes a student who has read the chapter

    @property
    def chapter(self) -> str:
        return self.id.split(".")[0]


def all_exercises() -> list[Exercise]:
    """Every exercise, in chapter and number order."""
    found: list[Exercise] = []
    for name in CHAPTER_MODULES:
        module = importlib.import_module(f"minipaged.lab.exercises.catalog.{name}")
        found += module.EXERCISES
    ids = [e.id for e in found]
    if len(set(ids)) != len(ids):
        raise ValueError(f"an exercise id is listed twice: {sorted(i for i in ids if ids.count(i) > 1)}")
    return sorted(found, key=lambda e: tuple(int(p) for p in e.id.split(".")))
