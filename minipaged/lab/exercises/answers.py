"""The answer key: what a student copy leaves out of the text, so that reading on gives nothing away.

A chapter holds two kinds of answer:

    worked answers   <details markdown="1"><summary>Answer</summary> ... </details> under an open
                     question: replaced by one line saying the answer is in the instructor's copy
    quoted solutions a ```python block whose first line names a file (``# minipaged/kv/block_table.py,
                     BlockPool.take``) and that quotes a line of a region being stubbed: replaced by a
                     pointer to the file the student is writing

    strip_answers(text, solutions)          -> (text, what was left out)
    quote_mismatch(root, path, header, body) -> why a quoted block no longer matches its file, or None

A quoted block counts as a quote of a region when one of its lines (spaces squeezed, comments and
the region markers left out, at least ``MIN_CHARS`` characters long, so that ``return out`` alone
proves nothing) is a line of that region's reference code. The same test finds quotes in any
markdown file; ``python -m minipaged.lab.exercises student`` applies it to the chapters and the docs pages.

Not handled: answers in notebooks (the notebooks hold none: they import the package, whose regions
are stubbed in the copy), and code blocks that quote a region without naming its file in their first
line (tests/test_exercises.py checks that no chapter does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from minipaged.lab.exercises.regions import MARKER, Region

MIN_CHARS = 16  # a quoted line shorter than this (``return out``) is too common to count as a quote

ANSWER = re.compile(r"^(?P<indent>[ \t]*)<details[^>]*>\s*<summary>Answer</summary>.*?^[ \t]*</details>[ \t]*$",
                    re.S | re.M)
QUOTE = re.compile(r"^(?P<indent>[ \t]*)```python\n[ \t]*# (?P<path>minipaged/[\w/]+\.py)(?P<rest>[^\n]*)\n"
                   r"(?P<body>.*?)^[ \t]*```[ \t]*$", re.S | re.M)

ANSWER_NOTE = "*The worked answer is in the instructor's copy of the course.*"


@dataclass(frozen=True)
class LeftOut:
    answers: int  # worked answers replaced
    quotes: tuple[str, ...]  # the exercise ids whose quoted solutions were replaced (one per quote)


def solution_lines(reference_root: Path, regions: list[Region]) -> set[str]:
    """The lines of the regions' reference code that would give a solution away, squeezed."""
    lines: set[str] = set()
    for region in regions:
        body = (Path(reference_root) / region.path).read_text().splitlines()[region.begin + 1:region.end]
        lines |= {s for s in map(squeeze, body) if _telling(s)}
    return lines


def squeeze(line: str) -> str:
    return " ".join(line.split())


def _telling(line: str) -> bool:
    return len(line) >= MIN_CHARS and not line.startswith("#") and not MARKER.match(line)


def quoted_exercises(path: str, body: str, solutions: dict[str, dict[str, set[str]]]) -> list[str]:
    """The ids of the exercises whose solution lines the block quoting ``path`` contains."""
    quoted = {squeeze(line) for line in body.splitlines()}
    return [ex for ex, lines in solutions.get(path, {}).items() if quoted & lines]


def strip_answers(text: str, solutions: dict[str, dict[str, set[str]]]) -> tuple[str, LeftOut]:
    """``text`` without its worked answers, and with each quote of a solution replaced by a pointer.

    ``solutions`` maps a file (``minipaged/kv/block_table.py``) to {exercise id: its solution lines}
    for the exercises being stubbed (``solution_lines`` makes the sets).
    """
    text, answers = ANSWER.subn(lambda m: m["indent"] + ANSWER_NOTE, text)
    replaced: list[str] = []

    def pointer(m: re.Match) -> str:
        ids = quoted_exercises(m["path"], m["body"], solutions)
        if not ids:
            return m.group(0)
        replaced.extend(ids)
        what = m["rest"].strip(" ,")
        names = " and ".join(f"exercise {i}" for i in ids)
        return (f"{m['indent']}> *Left out of the student copy: the code quoted here ({what or m['path']}) is "
                f"what {names} asks you to write in `{m['path']}`, where a comment holds the task.*")

    text = QUOTE.sub(pointer, text)
    return text, LeftOut(answers, tuple(replaced))


def text_files(root: Path) -> list[Path]:
    """The markdown a student reads: the chapters (README.md, the core path, and deep-dive.md where there
    is one), the docs pages and the README."""
    root = Path(root)
    return [*sorted(root.glob("chapters/*/*.md")), *sorted(root.glob("docs/pages/*.md")),
            *([root / "README.md"] if (root / "README.md").exists() else [])]


def quoted_blocks(root: Path):
    """(chapter, path, header, body) of every ```python block in the chapters whose first line names a
    file of the package: the quotes tests/test_chapter_quotes.py holds to the source."""
    for chapter in sorted(Path(root).glob("chapters/*/*.md")):
        for m in QUOTE.finditer(chapter.read_text()):
            yield chapter, m["path"], m["rest"], m["body"]


def quote_mismatch(root: Path, path: str, header: str, body: str) -> str | None:
    """None when the quote still matches ``root / path``; else what is wrong.

    The quote (indentation, runs of spaces and region markers aside) must be consecutive lines of the
    file. A line "..." stands for lines left out: the pieces between must each match, in order. A
    header that says "trimmed" or "left out" allows lines left out anywhere: each quoted line must
    still appear, in order.
    """
    source = _normalized((Path(root) / path).read_text().splitlines())
    quoted = _normalized(body.splitlines())
    if "trimmed" in header or "left out" in header:
        it = iter(source)
        ok = all(line in it for line in quoted if line != "...")
        return None if ok else f"{path}{header}: a quoted line is missing or out of order"
    pieces, piece = [], []
    for line in quoted:
        if line == "...":
            pieces.append(piece)
            piece = []
        else:
            piece.append(line)
    pieces.append(piece)
    at = 0
    for piece in filter(None, pieces):
        at = _find_run(source, piece, at)
        if at is None:
            return f"{path}{header}: the quote no longer matches the file; copy it again: {piece[0]!r}"
    return None


def _normalized(lines):
    return [squeeze(line) for line in lines if line.strip() and not MARKER.match(line)]


def _find_run(source, run, start):
    """Index just past the first match of run in source at or after start, or None."""
    for i in range(start, len(source) - len(run) + 1):
        if source[i:i + len(run)] == run:
            return i + len(run)
    return None
