"""Every chapter's quoted code still matches the package, line for line.

A chapter quotes source in a ```python block whose first line names it, e.g.
``# minipaged/kv/on_demand.py, OnDemandPolicy._grow``. The quote (indentation removed) must appear in
that file as consecutive lines. A line "..." in a quote stands for lines left out:
the pieces between must each match consecutive lines, in order. A header that says "trimmed" or "left
out" quotes with lines left out anywhere: each quoted line must still appear in the file, in order.
Runs of spaces (comment alignment) do not count, nor do the graded exercises' region markers
(``# exercise NN.K: begin`` / ``end``, minipaged/exercises/regions.py).
"""

import re
from pathlib import Path

import pytest

from minipaged.exercises.regions import MARKER

ROOT = Path(__file__).resolve().parents[1]
QUOTE = re.compile(r"```python\n# (minipaged/[\w/]+\.py)([^\n]*)\n(.*?)```", re.S)


def quotes():
    for chapter in sorted((ROOT / "chapters").glob("*/README.md")):
        for m in QUOTE.finditer(chapter.read_text()):
            yield pytest.param(m.group(1), m.group(2), m.group(3), id=f"{chapter.parent.name}:{m.group(1)}{m.group(2)}")


def normalized(lines):
    return [" ".join(line.split()) for line in lines if line.strip() and not MARKER.match(line)]


def find_run(source, run, start):
    """Index just past the first match of run in source at or after start, or None."""
    for i in range(start, len(source) - len(run) + 1):
        if source[i:i + len(run)] == run:
            return i + len(run)
    return None


@pytest.mark.parametrize("path,header,body", list(quotes()))
def test_quote_matches_the_source(path, header, body):
    source = normalized((ROOT / path).read_text().splitlines())
    quoted = normalized(body.splitlines())
    if "trimmed" in header or "left out" in header:
        it = iter(source)
        assert all(line in it for line in quoted if line != "..."), (
            f"{path}{header}: a quoted line is missing or out of order")
        return
    pieces, piece = [], []
    for line in quoted:  # "..." splits the quote into runs that must each match, in order
        if line == "...":
            pieces.append(piece)
            piece = []
        else:
            piece.append(line)
    pieces.append(piece)
    at = 0
    for piece in filter(None, pieces):
        at = find_run(source, piece, at)
        assert at is not None, f"{path}{header}: the quote no longer matches the file; copy it again: {piece[0]!r}"


def test_chapters_quote_something():
    assert len(list(quotes())) >= 20
