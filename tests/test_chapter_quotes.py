"""Every chapter's quoted code still matches the package, line for line.

A chapter quotes source in a ```python block whose first line names it, e.g.
``# minipaged/kv/on_demand.py, OnDemandPolicy._grow``. The quote (indentation removed) must appear in
that file as consecutive lines. A line "..." in a quote stands for lines left out:
the pieces between must each match consecutive lines, in order. A header that says "trimmed" or "left
out" quotes with lines left out anywhere: each quoted line must still appear in the file, in order.
Runs of spaces (comment alignment) do not count, nor do the graded exercises' region markers
(``# exercise NN.K: begin`` / ``end``, minipaged/lab/exercises/regions.py). The matching lives in
minipaged/lab/exercises/answers.py, which a student copy also uses to leave out the quotes of the code a
student writes.
"""

from pathlib import Path

import pytest

from minipaged.lab.exercises.answers import quote_mismatch, quoted_blocks

ROOT = Path(__file__).resolve().parents[1]


def quotes():
    for chapter, path, header, body in quoted_blocks(ROOT):
        yield pytest.param(path, header, body, id=f"{chapter.parent.name}:{path}{header}")


@pytest.mark.parametrize("path,header,body", list(quotes()))
def test_quote_matches_the_source(path, header, body):
    problem = quote_mismatch(ROOT, path, header, body)
    assert problem is None, problem


def test_chapters_quote_something():
    assert len(list(quotes())) >= 20
