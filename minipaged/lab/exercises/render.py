"""The graded exercises as text: each chapter's list, and the instructor page's table, rendered from
the catalog between two HTML comments, so that the text and the grader never disagree; and the
course's time budget and semester plan (syllabus.py), which add the catalog's minutes up.

    python -m minipaged.lab.exercises render       rewrite them
    python -m minipaged.lab.exercises render --check   exit 1 if any is out of date (a test runs this)

In chapters/NN_slug/README.md the list goes right under ``## Exercises``, before the open questions;
in docs/pages/instructors.md the table goes where its markers are.

Not handled: chapters with exercises but no ``## Exercises`` heading (an error names them).
"""

from __future__ import annotations

from pathlib import Path

from minipaged.lab.exercises import syllabus
from minipaged.lab.exercises.regions import files_of, find_regions

BEGIN = "<!-- graded exercises: begin (rendered by `python -m minipaged.lab.exercises render`; edit the catalog) -->"
END = "<!-- graded exercises: end -->"
HEADING = "## Exercises"
OPEN_QUESTIONS = "### Open questions"


def _md(text: str) -> str:
    """Plain catalog text for markdown: underscores outside `code` escaped, so that names such as
    self._free_queue never turn into emphasis."""
    parts = text.split("`")
    return "`".join(p.replace("_", "\\_") if i % 2 == 0 else p for i, p in enumerate(parts))


def chapter_block(exercises, regions) -> str:
    lines = [BEGIN, "", "### Graded exercises", "",
             "Each one is a solution region in `minipaged/` that a student copy "
             "(`python -m minipaged.lab.exercises student DIR`) replaces by a stub; the tests named by `check` "
             "grade it ([for instructors](../../docs/pages/instructors.md)).", ""]
    for e in exercises:
        links = ", ".join(f"[`{f}`](../../{f})" for f in files_of(regions.get(e.id, [])).split(", ") if f)
        lines += [f"**{e.id}: {_md(e.title)}** ({links}, about {e.minutes} minutes). {_md(e.task)}",
                  f"*Hint:* {_md(e.hint)} Check it with `python -m minipaged.lab.exercises check {e.id}`.", ""]
    lines.append(END)
    return "\n".join(lines)


def instructor_table(exercises, regions) -> str:
    lines = [BEGIN, "", "| id | chapter | what the student writes | file | minutes | tests |",
             "|---|---|---|---|---|---|"]
    for e in exercises:
        where = files_of(regions.get(e.id, [])).replace(", ", "`, `")
        lines.append(f"| {e.id} | {e.chapter} | {_md(e.title)} | `{where}` | {e.minutes} | {len(e.tests)} |")
    total = sum(e.minutes for e in exercises)
    lines += ["", f"{len(exercises)} exercises, about {total / 60:.1f} hours in all.", "", END]
    return "\n".join(lines)


def replace_between(text: str, begin: str, end: str, block: str) -> str | None:
    """``text`` with everything from the ``begin`` marker to the ``end`` marker replaced by ``block``
    (which carries the markers again), or None if the markers are missing."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        return None
    return text[:start] + block + text[stop + len(end):]


def render_chapter(text: str, block: str, path) -> str:
    replaced = replace_between(text, BEGIN, END, block)
    if replaced is not None:
        return replaced
    at = text.find("\n" + HEADING + "\n")
    if at < 0:
        raise ValueError(f"{path} has graded exercises but no '{HEADING}' heading to put them under")
    head_end = at + len(HEADING) + 2
    rest = text[head_end:].lstrip("\n")
    return text[:head_end] + "\n" + block + "\n\n" + OPEN_QUESTIONS + "\n\n" + rest


def rendered_files(root: Path, exercises) -> dict[Path, str]:
    """Every file the catalog renders into, with the text it should hold."""
    regions = find_regions(root)
    out: dict[Path, str] = {}
    chapters = {p.name[:2]: p for p in (root / "chapters").iterdir() if p.is_dir() and p.name[:2].isdigit()}
    for chapter in sorted({e.chapter for e in exercises}):
        readme = chapters[chapter] / "README.md"
        block = chapter_block([e for e in exercises if e.chapter == chapter], regions)
        out[readme] = render_chapter(readme.read_text(), block, readme.relative_to(root))
    page = root / "docs" / "pages" / "instructors.md"
    if page.exists():
        replaced = replace_between(page.read_text(), BEGIN, END, instructor_table(exercises, regions))
        if replaced is None:
            raise ValueError(f"{page.relative_to(root)} lacks the graded-exercise markers")
        out[page] = replaced
    for path, begin, end, block in (
            (root / "docs" / "pages" / "about.md", syllabus.TIME_BEGIN, syllabus.TIME_END,
             syllabus.time_table(exercises)),
            (page, syllabus.PLAN_BEGIN, syllabus.PLAN_END, syllabus.semester_plan(exercises)),
            (root / "README.md", syllabus.TOTAL_BEGIN, syllabus.TOTAL_END, syllabus.course_length(exercises))):
        if not path.exists():
            continue
        replaced = replace_between(out.get(path, path.read_text()), begin, end, block)
        if replaced is None:
            raise ValueError(f"{path.relative_to(root)} lacks the markers {begin!r} ... {end!r}")
        out[path] = replaced
    return out


def stale_files(root: Path, exercises) -> list[Path]:
    return [p for p, text in rendered_files(root, exercises).items() if p.read_text() != text]
