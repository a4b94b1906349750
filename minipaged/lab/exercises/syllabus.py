"""The course's time budget and its semester plan, rendered from one table so that no page disagrees.

Each chapter has four kinds of work:

    reading         the chapter's text, following its code walk in the source
    notebook        running and reading its notebook (not counting the first download of the weights)
    graded          its graded exercises: the sum of their minutes in the catalog (catalog/chNN.toml)
    open questions  its questions without a grader: predictions, measurements, extensions

The first, second and fourth are estimates kept beside the exercises, in each catalog file's
``[chapter]`` table; the third is the exercises' own. They
are estimates for a student who has done the chapters before, not measurements: reading at about 150
words a minute of technical text with code beside it, a notebook at a little over a minute a cell,
an open question at 10 to 20 minutes (an extension, such as a kernel optimization or a server
feature, longer).

``python -m minipaged.lab.exercises render`` writes three blocks from them, between HTML comments:

    docs/pages/about.md          the time per chapter
    docs/pages/instructors.md    a 14-week semester plan: weeks, chapters, notebooks, exercises, hours
    README.md                    one line: how long the whole course takes

Not handled: time for the benchmarks that exercises ask to run (the chapters give those beside the
commands), and a plan for a course of another length (the weeks are one table below; edit it).
"""

from __future__ import annotations

import textwrap

from minipaged.lab.exercises.catalog import Chapter, Exercise, all_chapters

CHAPTER_TIMES = tuple(all_chapters())  # each chapter's [chapter] table in its catalog file

# A 14-week semester: (week, chapters, what the week is about). Weeks without a chapter are the
# project's, whose time is the class's own choice.
SEMESTER = (
    (1, ("00",), "the model, the generate loop, the KV cache and what it costs"),
    (2, ("01", "02"), "contiguous slabs and fixed blocks: where memory is wasted"),
    (3, ("03",), "block tables and paged attention in PyTorch"),
    (4, ("04",), "on-demand allocation: waste below one block a request"),
    (5, ("05",), "copy-on-write: parallel sampling and beam search"),
    (6, ("06",), "continuous batching, admission and preemption"),
    (7, (), "review: chapters 01-06 against sections 4 and 6 of the vLLM paper"),
    (8, ("07",), "prefix caching"),
    (9, ("08",), "chunked prefill"),
    (10, ("09",), "speculative decoding"),
    (11, ("10",), "the PagedAttention kernel, from the reference to the memory roof"),
    (12, ("11",), "serving: the async engine, the OpenAI server, latency against load"),
    (13, (), "project: extend a stage, or reproduce a measurement of the paper on your machine"),
    (14, (), "project presentations"),
)

TIME_BEGIN = "<!-- time per chapter: begin (rendered by `python -m minipaged.lab.exercises render`) -->"
TIME_END = "<!-- time per chapter: end -->"
PLAN_BEGIN = "<!-- semester plan: begin (rendered by `python -m minipaged.lab.exercises render`) -->"
PLAN_END = "<!-- semester plan: end -->"
TOTAL_BEGIN = "<!-- course length: begin (rendered by `python -m minipaged.lab.exercises render`) -->"
TOTAL_END = "<!-- course length: end -->"


def graded_minutes(exercises: list[Exercise], chapter: str) -> int:
    return sum(e.minutes for e in exercises if e.chapter == chapter)


def chapter_minutes(t: Chapter, exercises: list[Exercise]) -> int:
    return t.reading + t.notebook + graded_minutes(exercises, t.chapter) + t.open_questions


def totals(exercises: list[Exercise]) -> dict[str, int]:
    """Minutes of each kind over the whole course."""
    out = {"reading": sum(t.reading for t in CHAPTER_TIMES), "notebook": sum(t.notebook for t in CHAPTER_TIMES),
           "graded": sum(graded_minutes(exercises, t.chapter) for t in CHAPTER_TIMES),
           "open_questions": sum(t.open_questions for t in CHAPTER_TIMES)}
    out["all"] = sum(out.values())
    return out


def _h(minutes: int) -> str:
    """Minutes for a table: '40 min' below an hour, else hours to the quarter ('1.25 h')."""
    if minutes < 60:
        return f"{minutes} min"
    return f"{round(minutes / 15) / 4:g} h"


def time_table(exercises: list[Exercise]) -> str:
    lines = [TIME_BEGIN, "", "| # | chapter | read | notebook | graded exercises | open questions | in all |",
             "|---|---|---|---|---|---|---|"]
    for t in CHAPTER_TIMES:
        graded = graded_minutes(exercises, t.chapter)
        n = sum(e.chapter == t.chapter for e in exercises)
        lines.append(f"| {t.chapter} | [{t.title}](../../chapters/{t.folder}/README.md) | {_h(t.reading)} | "
                     f"{_h(t.notebook)} | {_h(graded)} ({n}) | {_h(t.open_questions)} | "
                     f"{_h(chapter_minutes(t, exercises))} |")
    s = totals(exercises)
    lines.append(f"| | **the course** | **{_h(s['reading'])}** | **{_h(s['notebook'])}** | **{_h(s['graded'])}** | "
                 f"**{_h(s['open_questions'])}** | **{_h(s['all'])}** |")
    return "\n".join([*lines, "", TIME_END])


def semester_plan(exercises: list[Exercise]) -> str:
    times = {t.chapter: t for t in CHAPTER_TIMES}
    lines = [PLAN_BEGIN, "", "| week | chapters | notebooks | graded exercises | hours | the week |",
             "|---|---|---|---|---|---|"]
    for week, chapters, about in SEMESTER:
        links = ", ".join(f"[{c}](../../chapters/{times[c].folder}/README.md)" for c in chapters) or "none"
        books = ", ".join(f"[{c}](../../notebooks/{times[c].folder}.ipynb)" for c in chapters) or ""
        ids = ", ".join(e.id for e in exercises if e.chapter in chapters) or ""
        minutes = sum(chapter_minutes(times[c], exercises) for c in chapters)
        lines.append(f"| {week} | {links} | {books} | {ids} | {_h(minutes) if chapters else ''} | {about} |")
    s = totals(exercises)
    lines += ["", f"The chapter weeks add up to about {s['all'] / 60:.0f} hours of a student's time: "
              f"{s['reading'] / 60:.1f} reading, {s['notebook'] / 60:.1f} in the notebooks, "
              f"{s['graded'] / 60:.1f} on the {len(exercises)} graded exercises and "
              f"{s['open_questions'] / 60:.1f} on the open questions.", "", PLAN_END]
    return "\n".join(lines)


def course_length(exercises: list[Exercise]) -> str:
    """The README's bullet on the course's length, wrapped like the bullets around it."""
    s = totals(exercises)
    text = (f"- **How long.** About {s['all'] / 60:.0f} hours in all: {s['reading'] / 60:.0f} of reading, "
            f"{s['notebook'] / 60:.1f} of notebooks and {(s['graded'] + s['open_questions']) / 60:.0f} of "
            f"exercises ({len(exercises)} graded ones among them), over twelve chapters. The "
            f"[time per chapter](docs/pages/about.md#time-per-chapter) and a fourteen-week "
            f"[semester plan](docs/pages/instructors.md#a-semester-plan) break it down.")
    lines = textwrap.wrap(text, width=100, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join([TOTAL_BEGIN, *lines, TOTAL_END])

