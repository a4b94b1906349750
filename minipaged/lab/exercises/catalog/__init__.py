"""The graded exercises, one file per chapter (ch00.toml ... ch11.toml): the chapter's time estimates
(``[chapter]``) and its exercises (``[[exercise]]``).

An exercise names its solution region in ``minipaged/`` (by its id, ``NN.K``: chapter NN, exercise K),
says in a few sentences what to write, which invariant must hold and a hint, and lists the tests that
grade it: pytest node ids or test files, run from the repository root. Most are the chapter's own
tests; each must fail while the region is a stub and pass with the reference code
(tests/test_exercises.py proves both for every exercise). The files are data, so that an instructor
edits them without touching code; a missing or unknown key is an error that names the file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent


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


@dataclass(frozen=True)
class Chapter:
    chapter: str  # "00"
    title: str
    folder: str  # the folder under chapters/ and the notebook's name
    reading: int  # minutes: the chapter's text, following its code walk in the source
    notebook: int  # minutes: running and reading its notebook
    open_questions: int  # minutes, all of the chapter's questions without a grader


def _made(cls, values: dict, where: str):
    """cls(**values), or a ValueError that names the file and the keys it should have."""
    known = [f.name for f in fields(cls)]
    unknown, missing = set(values) - set(known), [k for k in known if k not in values and k != "minutes"]
    if unknown or missing:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}, missing keys {missing}; the keys are {known}")
    return cls(**values)


@functools.cache
def _load() -> tuple[tuple[Chapter, ...], tuple[Exercise, ...]]:
    chapters, exercises = [], []
    for path in sorted(HERE.glob("ch*.toml")):
        data = tomllib.loads(path.read_text())
        where = f"minipaged/lab/exercises/catalog/{path.name}"
        chapters.append(_made(Chapter, {"chapter": path.stem[2:], **data["chapter"]}, f"{where} [chapter]"))
        for i, values in enumerate(data.get("exercise", [])):
            exercise = _made(Exercise, {**values, "tests": tuple(values.get("tests", ()))}, f"{where} exercise {i}")
            if exercise.chapter != chapters[-1].chapter:
                raise ValueError(f"{where}: exercise {exercise.id} belongs to chapter {exercise.chapter}'s file")
            exercises.append(exercise)
    ids = [e.id for e in exercises]
    if len(set(ids)) != len(ids):
        raise ValueError(f"an exercise id is listed twice: {sorted(i for i in ids if ids.count(i) > 1)}")
    return tuple(chapters), tuple(sorted(exercises, key=lambda e: tuple(int(p) for p in e.id.split("."))))


def all_exercises() -> list[Exercise]:
    """Every exercise, in chapter and number order."""
    return list(_load()[1])


def all_chapters() -> list[Chapter]:
    """Every chapter's title, folder and time estimates, in order."""
    return list(_load()[0])
