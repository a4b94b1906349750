"""The architecture page is generated from the code, and one chat request stays small.

The page's picture and tables (docs/pages/architecture.svg, the generated blocks of
docs/pages/architecture.md) are redrawn by ``python -m minipaged.lab.architecture`` from the import
graph and the committed trace of one request (docs/pages/request_path.json); a test fails when
either would change. The trace itself is taken again here on the real model and compared with the
committed one, and its size is held to the bound the course promises: one chat request runs through
at most 20 of the package's files, 4,000 lines together.
"""

from __future__ import annotations

import json

import pytest

from minipaged.lab import architecture
from minipaged.lab.request_path import trace

MAX_FILES, MAX_LINES = 20, 4000


def test_the_page_and_its_picture_are_generated_from_the_code():
    stale = [architecture.rel(path) for path, text in architecture.outputs().items() if path.read_text() != text]
    assert not stale, f"{stale} are stale; run `python -m minipaged.lab.architecture`"


def test_every_module_stands_above_what_it_imports():
    edges = {m: deps for m, deps in architecture.graph().items() if not m.startswith(architecture.LAB)}
    edges = {m: {d for d in deps if d in edges} for m, deps in edges.items()}
    floor = architecture.floors(edges)
    assert all(floor[m] > floor[d] for m, deps in edges.items() for d in deps)
    assert floor["minipaged.kv.base"] == 0
    assert floor["minipaged.llm"] > floor["minipaged.core"] > floor["minipaged.runner"]
    with pytest.raises(ValueError, match="a -> b -> a"):
        architecture.floors({"a": {"b"}, "b": {"a"}})


@pytest.mark.slow
def test_one_chat_request_runs_through_few_files_and_lines(real_llm):
    files = trace(real_llm)
    paths, total = [f["path"] for f in files], sum(f["lines"] for f in files)
    listing = "\n".join(f"{f['lines']:>5}  {f['path']}" for f in files)
    assert len(files) <= MAX_FILES and total <= MAX_LINES, (
        f"one chat request runs through {len(files)} files, {total:,} lines (at most {MAX_FILES} and "
        f"{MAX_LINES:,}):\n{listing}")
    committed = json.loads(architecture.TRACE.read_text())["files"]
    assert paths == committed, ("the request's path changed; retake the page's trace with "
                                f"`python -m minipaged.lab.architecture --trace`:\n{listing}")
