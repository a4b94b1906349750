"""The graded exercises' command line (the instructor's page, docs/pages/instructors.md, walks through it).

    python -m minipaged.lab.exercises list [--chapter 03] [--json]
    python -m minipaged.lab.exercises student DIR [--upto 04] [--only 03.1,03.2] [--keep-answers]
    python -m minipaged.lab.exercises check 03.1
    python -m minipaged.lab.exercises grade DIR [DIR ...] [--csv grades.csv]
    python -m minipaged.lab.exercises render [--check]

``student`` writes a copy of this repository in which each chosen exercise's solution region is a stub
that raises NotImplementedError, with its task in a comment, and the chapters leave out their worked
answers and the quotes of the code to write (``--keep-answers`` keeps them). ``check`` runs one exercise's tests in the
repository you stand in (your copy) and says how many pass and what failed first. ``grade`` runs every
exercise's tests against each student copy's ``minipaged/``, with this repository's tests, and prints
one row per exercise (CSV with ``--csv``). ``render`` writes the catalog into each chapter's Exercises
section and the instructor page's table.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import tempfile
from pathlib import Path

from minipaged.lab.exercises.catalog import all_exercises
from minipaged.lab.exercises.grader import grading_tree, repo_root, run_tests, student_copy
from minipaged.lab.exercises.regions import files_of, find_regions
from minipaged.lab.exercises.render import rendered_files, stale_files


def _chapter(value: str) -> str:
    if not value.isdigit() or not 0 <= int(value) <= 99:
        raise argparse.ArgumentTypeError(f"a chapter is a number such as 04, got {value!r}")
    return f"{int(value):02d}"


def _select(exercises, ids: str | None, upto: str | None = None, chapter: str | None = None):
    known = {e.id: e for e in exercises}
    if ids:
        wanted = [i.strip() for i in ids.split(",") if i.strip()]
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise ValueError(f"unknown exercise ids {unknown}; `python -m minipaged.lab.exercises list` shows them "
                             f"({', '.join(known)})")
        exercises = [known[i] for i in wanted]
    if upto:
        exercises = [e for e in exercises if e.chapter <= upto]
    if chapter:
        exercises = [e for e in exercises if e.chapter == chapter]
    return exercises


def cmd_list(args) -> int:
    exercises = _select(all_exercises(), None, chapter=args.chapter)
    regions = find_regions(repo_root())
    if args.json:
        print(json.dumps([{"id": e.id, "chapter": e.chapter, "title": e.title, "minutes": e.minutes,
                           "files": [r.path.as_posix() for r in regions.get(e.id, [])],
                           "task": e.task, "hint": e.hint, "tests": list(e.tests)} for e in exercises], indent=2))
        return 0
    for e in exercises:
        where = files_of(regions[e.id]) if e.id in regions else "(no region!)"
        print(f"{e.id}  ch{e.chapter}  {e.title}  [{where}, ~{e.minutes} min, {len(e.tests)} test selector(s)]")
    print(f"\n{len(exercises)} exercises. `python -m minipaged.lab.exercises check ID` runs one exercise's tests.")
    return 0


def cmd_student(args) -> int:
    exercises = _select(all_exercises(), args.only, upto=args.upto)
    if not exercises:
        raise ValueError("no exercise matches --upto/--only; `python -m minipaged.lab.exercises list` shows them")
    copy = student_copy(repo_root(), Path(args.dir), exercises, keep_answers=args.keep_answers)
    done = copy.stubbed
    print(f"Wrote a student copy to {args.dir} with {len(done)} exercise(s) to write: {', '.join(done)}.")
    if args.keep_answers:
        print("The chapters keep their worked answers and quoted solutions (--keep-answers).")
    else:
        print(f"Left out of its text: {copy.left_out.answers} worked answers and {len(copy.left_out.quotes)} "
              "quotes of the code to write (--keep-answers keeps them).")
    print(f"Start there (in an environment with the requirements installed): cd {args.dir} && "
          f"python -m minipaged.lab.exercises check {done[0]}")
    return 0


def cmd_check(args) -> int:
    (exercise,) = _select(all_exercises(), args.id)
    root = repo_root()
    print(f"exercise {exercise.id}: {exercise.title}")
    (result,) = run_tests(root, [exercise], timeout=args.timeout)
    if result.error:
        print(f"The tests could not run:\n{result.error}")
        return 2
    print(f"{result.passed} of {result.total} tests pass.")
    failure = result.first_failure()
    if failure is None:
        print("Done: every test of this exercise passes.")
        return 0
    node, message = failure
    if result.stub:
        print("The region still holds the stub: replace the `raise NotImplementedError` with your code.")
    print(f"First failure: {node}\n    {message}")
    print(f"See it in full: python -m pytest -x '{node}'")
    print(f"Task: {exercise.task}\nHint: {exercise.hint}")
    return 1


def cmd_grade(args) -> int:
    exercises = _select(all_exercises(), args.only, upto=args.upto)
    reference = repo_root()
    rows = []
    for folder in args.dirs:
        with tempfile.TemporaryDirectory() as tmp:
            tree = grading_tree(Path(folder), reference, Path(tmp) / "graded")
            print(f"grading {folder} ...", file=sys.stderr)
            for r in run_tests(tree, exercises, timeout=args.timeout):
                failure = r.first_failure()
                why = failure[0] if failure else (r.error.splitlines() or [""])[-1]
                rows.append({"copy": folder, "exercise": r.exercise.id, "chapter": r.exercise.chapter,
                             "title": r.exercise.title, "passed": r.passed, "total": r.total,
                             "status": r.status, "first_failure": why})
    fields = ["copy", "exercise", "chapter", "title", "passed", "total", "status", "first_failure"]
    if args.csv:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        if args.csv == "-":
            sys.stdout.write(out.getvalue())
        else:
            Path(args.csv).write_text(out.getvalue())
            print(f"wrote {len(rows)} rows to {args.csv}", file=sys.stderr)
    else:
        for row in rows:
            print(f"{row['copy']}  {row['exercise']}  {row['passed']}/{row['total']}  {row['status']}")
    return 0


def cmd_render(args) -> int:
    root, exercises = repo_root(), all_exercises()
    if args.check:
        stale = stale_files(root, exercises)
        for path in stale:
            print(f"out of date: {path.relative_to(root)} (run `python -m minipaged.lab.exercises render`)")
        return 1 if stale else 0
    for path, text in rendered_files(root, exercises).items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"rendered {path.relative_to(root)}")
    return 0


def _command(sub, name: str, run, text: str) -> argparse.ArgumentParser:
    """Add the subcommand ``name``, which calls ``run(args)``; its options go on the parser returned."""
    p = sub.add_parser(name, help=text)
    p.set_defaults(run=run)
    return p


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.exercises", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = _command(sub, "list", cmd_list, "every exercise: id, chapter, title, its file and tests")
    p.add_argument("--chapter", type=_chapter, help="only this chapter's (e.g. 03)")
    p.add_argument("--json", action="store_true", help="as JSON, with each task, hint and test list")
    p = _command(sub, "student", cmd_student, "write a student copy of this repository with the solutions stubbed")
    p.add_argument("dir", help="a new folder to write the copy to")
    p.add_argument("--upto", type=_chapter, help="stub only the exercises of chapters up to this one (e.g. 04)")
    p.add_argument("--only", help="stub only these exercise ids, comma-separated (e.g. 03.1,03.2)")
    p.add_argument("--keep-answers", action="store_true",
                   help="keep the chapters' worked answers and quotes of the code to write (self-study, "
                        "or the instructor's copy)")
    p = _command(sub, "check", cmd_check, "run one exercise's tests here and say how many pass and what failed first")
    p.add_argument("id", help="the exercise id, e.g. 03.1")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before the run is stopped (default 1800)")
    p = _command(sub, "grade", cmd_grade, "grade student copies: one row per copy and exercise")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="student copies (each holds a minipaged/ folder)")
    p.add_argument("--csv", metavar="FILE", help="write CSV to FILE ('-' for standard output)")
    p.add_argument("--upto", type=_chapter, help="only the exercises of chapters up to this one")
    p.add_argument("--only", help="only these exercise ids, comma-separated")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before one copy's run is stopped")
    p = _command(sub, "render", cmd_render,
                 "write the catalog into the chapters' Exercises sections and the instructor page")
    p.add_argument("--check", action="store_true", help="only report files that are out of date (exit 1 if any)")
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ValueError as e:
        parser.error(str(e))


if __name__ == "__main__":
    sys.exit(main())
