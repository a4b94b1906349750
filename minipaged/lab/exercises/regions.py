"""Solution regions: where they are in the source, and what a student copy puts in their place.

A region is the body a student writes, between two comment lines in ``minipaged/``:

    # exercise 03.1: begin
    ...the reference code...
    # exercise 03.1: end

The markers are comments, so the reference engine reads and runs as if they were not there. A
student copy keeps both marker lines and replaces what lies between them by the task statement, as
comments, and one ``raise NotImplementedError("exercise 03.1: ...")``, indented like the code it
replaces. Nothing else in the file changes, so the copy imports, and every test that does not reach
a stub still runs.

An exercise may have several regions (each one contiguous piece of one function), in one file or
several: they are stubbed, graded and attempted together.

Not handled: regions that nest inside one another, and marker lines inside strings.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^(?P<indent>[ \t]*)# exercise (?P<id>\d\d\.\d+): (?P<edge>begin|end)[ \t]*$")


@dataclass(frozen=True)
class Region:
    exercise_id: str
    path: Path  # the file, relative to the repository root
    begin: int  # line index of the begin marker (0-based)
    end: int  # line index of the end marker
    indent: str  # the indentation of the code inside


def find_regions(root: Path) -> dict[str, list[Region]]:
    """Every region under ``root / "minipaged"``, by exercise id (an exercise may have several, e.g. the
    two halves of a free list, in source order). ValueError for a marker without its partner, a region
    whose begin and end are indented differently, or regions that nest."""
    regions: dict[str, list[Region]] = {}
    for path in sorted((root / "minipaged").rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[:3] == ("minipaged", "lab", "exercises"):  # this package only talks about markers
            continue
        open_at: tuple[str, int, str] | None = None
        for i, line in enumerate(path.read_text().splitlines()):
            m = MARKER.match(line)
            if not m:
                continue
            ex, edge, indent = m["id"], m["edge"], m["indent"]
            if edge == "begin":
                if open_at is not None:
                    raise ValueError(f"{rel}:{i + 1}: exercise {ex} begins inside exercise {open_at[0]}'s region "
                                     f"(line {open_at[1] + 1}); regions do not nest")
                open_at = (ex, i, indent)
                continue
            if open_at is None or open_at[0] != ex:
                raise ValueError(f"{rel}:{i + 1}: 'exercise {ex}: end' without its begin")
            _, begin, begin_indent = open_at
            if indent != begin_indent:
                raise ValueError(f"{rel}:{i + 1}: the end marker of exercise {ex} is indented differently "
                                 f"from its begin (line {begin + 1})")
            regions.setdefault(ex, []).append(Region(ex, rel, begin, i, indent))
            open_at = None
        if open_at is not None:
            raise ValueError(f"{rel}:{open_at[1] + 1}: 'exercise {open_at[0]}: begin' without its end")
    return regions


def stub_lines(exercise, indent: str) -> list[str]:
    """What a student copy holds between the markers: the task as comments, then the raise."""
    width = max(40, 100 - len(indent))
    lines = []
    for label, text in (("Task", exercise.task), ("Hint", exercise.hint)):
        wrapped = textwrap.wrap(f"{label}: {text}", width=width - 2)
        lines += [f"{indent}# {w}" for w in wrapped]
    lines.append(f"{indent}# Check your work: python -m minipaged.lab.exercises check {exercise.id}")
    message = f"exercise {exercise.id}: {exercise.title} (the task is in a comment above this line)"
    lines.append(f"{indent}raise NotImplementedError({message!r})")
    return lines


def stub_file(text: str, regions: list[Region], exercises: dict) -> str:
    """``text`` with each of ``regions`` (all in this file) replaced by its stub."""
    lines = text.splitlines()
    for region in sorted(regions, key=lambda r: r.begin, reverse=True):  # bottom up: indices stay valid
        lines[region.begin + 1:region.end] = stub_lines(exercises[region.exercise_id], region.indent)
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def is_stub(root: Path, regions: list[Region]) -> bool:
    """Whether every one of an exercise's regions in ``root`` still holds its stub (never attempted)."""
    if not regions:
        return False
    for region in regions:
        body = (root / region.path).read_text().splitlines()[region.begin + 1:region.end]
        if not any("raise NotImplementedError(" in line and f"exercise {region.exercise_id}: " in line
                   for line in body):
            return False
    return True


def files_of(regions: list[Region]) -> str:
    """The files an exercise's regions are in, for listings: "a.py" or "a.py, b.py"."""
    return ", ".join(dict.fromkeys(r.path.as_posix() for r in regions))
