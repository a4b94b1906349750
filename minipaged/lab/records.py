"""Results records: what a benchmark or simulation printed, kept with where and when it ran, so that
every figure a chapter quotes can be traced to one run and re-rendered from it.

    python -m minipaged simulate --policy contiguous --record         writes a record
    python -m minipaged bench serving --record serving_small          ... under a name of your choosing
    python -m minipaged.lab.records render                            rewrites the chapters from them
    python -m minipaged.lab.records render --check                    exit 1 if a chapter disagrees
    python -m minipaged.lab.records list                              every record and where it is quoted
    python -m minipaged.lab.records measure [--chapter NN] [--only NAME]  run every record's command again

A record is ``chapters/NN_slug/results/NAME.json``. It holds the command line (without ``--record``),
the git commit of the code it measured, the date, the machine (CPU model, cores, torch and Python
versions), everything the command printed on stdout, and ``results``: the numbers the command
computed, as its ``--json`` output gives them. The chapter is the one the command belongs to
(``bench serving``: 06); ``--record 03/NAME`` puts it in another chapter's folder.

In a chapter's text, two kinds of marker tie the words to a record:

- A block. Everything between ``<!-- record: NAME -->`` and ``<!-- /record -->`` is rendered: the
  command, what it printed, and a line saying at which commit, on which machine and by which command
  it was measured. ``<!-- record: NAME lines=3-7 -->`` keeps only those lines of the output (1-based,
  inclusive), for a command that prints more than the chapter needs; ``part=NAME`` keeps the lines
  after the output's line ``== NAME ==`` up to the next such line (an output printed in parts).
- A figure in a sentence. ``98.5%<!-- fig: NAME policies.on_demand.utilization .1% -->``: the value
  at that path in the record's ``results`` (dots between keys; a list index is a number), written
  with that format spec (Python's ``format``). ``render`` rewrites the number right before the
  comment (digits, signs, ``.``, ``,``, ``%``, ``×``); ``--check`` fails when it differs. The spec may
  end in ``x`` for a ratio written with ``×`` (``.2fx``: ``3.25×``), and start with ``ms:`` for a time
  in seconds written in milliseconds (``ms:.0f``: 0.4531 is written ``453``). A path whose keys hold
  spaces is written in double quotes: ``<!-- fig: NAME "systems.whole prefills.itl_p99_s" ms:.0f -->``.

A third marker ties a number to a deterministic computation instead of a record, for the numbers a
worked answer computes in a moment (a simulator run, arithmetic on a model's shapes or on a record's
figures): ``100<!-- calc: 06/saw_tooth steps d -->``. The name is one of the computations registered
in ``minipaged/lab/answers.py`` (``python -m minipaged.lab.answers NN/NAME`` prints its results); path and spec
are a figure's. ``render`` runs the computations the text names and rewrites the numbers, and
``--check`` fails when one differs, as for a figure.

A record of a GPU run (chapter 10's ``gpu_check``) names its GPU in ``machine["gpu"]``; it was measured
on another machine by ``scripts/gpu_check.sh``, so ``measure`` skips it and says how to take it again.

A marker may name another chapter's record as ``NN/NAME`` (``<!-- fig: 05/bench_sharing ... -->``).
The site pages in docs/pages/ are rendered too, and name every record that way: docs/pages/paper.md
sets the vLLM paper's results beside the course's.

Not handled: a figure computed from two records (write the inputs, or add the figure to the
command's results), and records of commands that do not run in this process (the notebooks).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from minipaged.lab.capture import CHAPTERS, ROOT, git_commit, load

# ---------------------------------------------------------------- rendering the chapters

NAME = r"(?:\d\d/)?[A-Za-z0-9_.-]+"  # a record of this chapter, or NN/NAME: one of chapter NN's
BLOCK = re.compile(rf"<!-- record: (?P<name>{NAME})(?P<opts>[^>]*?) -->\n(?P<body>.*?)<!-- /record -->", re.S)
VALUE = r"(?P<value>[0-9][0-9.,]*[%×]?|[−+-][0-9][0-9.,]*[%×]?)?"  # the number a marker rewrites
PATH_SPEC = r' (?P<path>"[^"]+"|\S+) (?P<spec>\S+) -->'
FIG = re.compile(VALUE + rf"<!-- fig: (?P<name>{NAME})" + PATH_SPEC)
CALC = re.compile(VALUE + r"<!-- calc: (?P<name>\d\d/[A-Za-z0-9_.-]+)" + PATH_SPEC)  # answers.py's NN/NAME
PAGES = ROOT / "docs" / "pages"  # site pages may quote any chapter's records, as NN/NAME




def lookup(record: dict, path: str):
    value = record["results"]
    for key in path.strip('"').split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def fmt(value, spec: str) -> str:
    if spec.startswith("ms:"):
        return fmt(1000 * value, spec[3:])
    if spec.endswith("x"):
        return format(value, spec[:-1]) + "×"
    return format(value, spec)


def measured_line(record: dict) -> str:
    m = record["machine"]
    commit = record["commit"] + (" (with uncommitted changes)" if record.get("dirty") else "")
    if m.get("gpu"):
        return (f"*Measured at commit `{commit}` on {record['date'][:10]}, on an {m['gpu']} ({m['sms']} SMs, driver "
                f"{m['driver']}, CUDA {m['cuda']}, torch {m['torch']}, numba-cuda {m['numba_cuda']}), by "
                f"`{record['command']}`.*")
    return (f"*Measured at commit `{commit}` on {record['date'][:10]}, on this machine ({m['cpu']}, "
            f"{m['cores']} cores, torch {m['torch']}), by `{record['command']}`.*")


def stdout_part(lines: list[str], name: str) -> list[str]:
    """The lines between ``== name ==`` and the next ``== ... ==`` line."""
    heads = [i for i, line in enumerate(lines) if re.fullmatch(r"== [A-Za-z0-9_-]+ ==", line)]
    for n, i in enumerate(heads):
        if lines[i] == f"== {name} ==":
            return lines[i + 1:heads[n + 1] if n + 1 < len(heads) else len(lines)]
    raise ValueError(f"the record's output has no part {name!r}; it has "
                     f"{[lines[i].strip('= ') for i in heads]}")


def render_block(record: dict, opts: str) -> str:
    out = record["stdout"].rstrip("\n").split("\n")
    m = re.search(r"lines=(\d+)-(\d+)", opts)
    if m:
        out = out[int(m.group(1)) - 1:int(m.group(2))]
    part = re.search(r"part=([A-Za-z0-9_-]+)", opts)
    if part:
        out = stdout_part(out, part.group(1))
    return "\n".join(["```bash", record["command"], "```", "", "```", *out, "```", "",
                      measured_line(record), ""])


@dataclass
class Rendered:
    text: str
    records: set[str]
    figures: int
    calcs: set[str] = field(default_factory=set)  # the answers.py computations the text names


def _rewrite_figure(m: re.Match, value, what: str) -> str:
    """A figure or calc marker ``m`` with the number before it written anew: ``value`` in the marker's
    spec. ``what`` names the figure in the error raised when the spec cannot write the value."""
    try:
        written = fmt(value, m["spec"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{what} is {value!r}, which the spec {m['spec']!r} cannot write ({e})") from None
    return written + m.group(0)[len(m["value"] or ""):]


def render_text(text: str, chapter: Path | None, calcs: bool = True) -> Rendered:
    """``text`` with its record blocks and figures rendered, and, unless ``calcs`` is False, its
    computed figures (answers.py runs each computation once per process)."""
    used: set[str] = set()
    cache: dict[str, dict] = {}
    where = chapter.name if chapter is not None else "a docs page"

    def get(name):
        used.add(name)
        if name not in cache:
            cache[name] = load(chapter, name)
        return cache[name]

    def block(m):
        body = render_block(get(m["name"]), m["opts"])
        return f"<!-- record: {m['name']}{m['opts']} -->\n{body}<!-- /record -->"

    count = 0

    def figure(m):
        nonlocal count
        count += 1
        try:
            value = lookup(get(m["name"]), m["path"])
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise ValueError(f"{where}: figure {m['path']!r} is not in record {m['name']!r} ({e!r})") from None
        return _rewrite_figure(m, value, f"{where}: figure {m['path']!r} of record {m['name']!r}")

    named: set[str] = set()

    def calc(m):
        from minipaged.lab import answers

        named.add(m["name"])
        try:
            value = lookup({"results": answers.compute(m["name"])}, m["path"])
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"{where}: {m['path']!r} is not in the results of `python -m minipaged.lab.answers "
                             f"{m['name']}` ({e!r})") from None
        return _rewrite_figure(m, value, f"{where}: {m['path']!r} of answer {m['name']!r}")

    text = BLOCK.sub(block, text)
    text = FIG.sub(figure, text)
    if calcs:
        text = CALC.sub(calc, text)
    return Rendered(text, used, count, named)


def chapters() -> list[Path]:
    return sorted(p for p in CHAPTERS.glob("[0-9][0-9]_*") if (p / "README.md").exists())


def pages() -> list[Path]:
    """The site pages that quote records (docs/pages/*.md with a record marker)."""
    return sorted(p for p in PAGES.glob("*.md") if re.search(r"<!-- (record|fig): ", p.read_text()))


def chapter_pages(chapter: Path) -> list[Path]:
    """A chapter's text: README.md (the core path) and deep-dive.md, where there is one."""
    return [p for p in (chapter / "README.md", chapter / "deep-dive.md") if p.exists()]


def rendered_files() -> list[tuple[Path, Path | None]]:
    """(file, its chapter or None for a docs page): everything ``render`` writes."""
    return ([(page, chapter) for chapter in chapters() for page in chapter_pages(chapter)]
            + [(page, None) for page in pages()])


def render(check: bool = False) -> int:
    stale = []
    for readme, chapter in rendered_files():
        text = readme.read_text()
        new = render_text(text, chapter).text
        if new != text:
            if check:
                stale.append(readme.relative_to(ROOT))
            else:
                readme.write_text(new)
                print(f"rendered {readme.relative_to(ROOT)}")
    if stale:
        print("these chapters differ from what their records render; run `python -m minipaged.lab.records "
              "render` and look at the diff:\n  " + "\n  ".join(map(str, stale)))
        return 1
    return 0


def list_records() -> int:
    used = set()  # NN/NAME of every record some chapter or page quotes
    for text_file, chapter in rendered_files():
        for name in render_text(text_file.read_text(), chapter).records:
            used.add(name if "/" in name else f"{chapter.name[:2]}/{name}")
    for chapter in chapters():
        for path in sorted((chapter / "results").glob("*.json")):
            r = json.loads(path.read_text())
            where = "quoted" if f"{chapter.name[:2]}/{path.stem}" in used else "NOT QUOTED"
            print(f"{path.relative_to(ROOT)}  {r['commit']}  {r['date']}  {where}\n    {r['command']}")
    return 0


def measure(chapter: str | None = None, only: list[str] | None = None, dry_run: bool = False) -> int:
    """Run the command of every record again, one after the other, each writing its record anew: the way
    to re-measure a chapter (or the course) at one commit. Refuses uncommitted changes to minipaged/,
    since the records would say they measured a commit they did not. Run it alone on the machine: a
    second process on the cores slows every timing in it."""
    folders = chapters()
    numbers = [folder.name[:2] for folder in folders]
    wanted = f"{int(chapter):02d}" if chapter is not None and str(chapter).isdigit() else chapter
    if wanted is not None and wanted not in numbers:
        raise ValueError(f"--chapter must be one of the chapter numbers {', '.join(numbers)}, got {chapter!r}")
    todo, skipped = [], []
    for folder in folders:
        if wanted is not None and folder.name[:2] != wanted:
            continue
        for path in sorted((folder / "results").glob("*.json")):
            if only and path.stem not in only:
                continue
            record = json.loads(path.read_text())
            if record["machine"].get("gpu"):
                print(f"[{folder.name[:2]}/{path.stem}] skipped: measured on an {record['machine']['gpu']} by "
                      f"`{record['command']}`; take it again there (see the record's assembled_by)")
                skipped.append(path.stem)
                continue
            todo.append((folder.name[:2], path.stem, record["command"]))
    unknown = sorted(set(only or ()) - {name for _, name, _ in todo} - set(skipped))
    if unknown:
        raise ValueError(f"--only: no record named {', '.join(unknown)} (in the chapters chosen); "
                         f"`python -m minipaged.lab.records list` shows them all")
    if not todo and skipped:
        return 0
    if not todo:
        raise ValueError(f"no record matches --chapter {chapter}; `python -m minipaged.lab.records list` shows "
                         "them all")
    if not dry_run and git_commit()["dirty"]:
        raise ValueError("minipaged/ has uncommitted changes: commit them first, so that the records name "
                         "the code they measured")
    failed = []
    for number, name, command in todo:
        argv = shlex.split(command)[3:]  # the words after "python -m minipaged"
        print(f"[{number}/{name}] {command}", flush=True)
        if dry_run:
            continue
        done = subprocess.run([sys.executable, "-m", "minipaged", *argv, "--record", f"{number}/{name}"],
                              cwd=ROOT, stdout=subprocess.DEVNULL)
        if done.returncode:
            failed.append(f"{number}/{name} (exit code {done.returncode})")
    if failed:
        print("these commands failed, and their records were not rewritten:\n  " + "\n  ".join(failed))
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.records", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="write every chapter's record blocks and figures from its records")
    r.add_argument("--check", action="store_true", help="change nothing; exit 1 if a chapter is out of date")
    sub.add_parser("list", help="every record, its commit, and whether a chapter quotes it")
    m = sub.add_parser("measure", help="run every record's command again at this commit (alone on the machine)")
    m.add_argument("--chapter", default=None, help="only this chapter's records (a number, e.g. 06)")
    m.add_argument("--only", nargs="+", default=None, metavar="NAME", help="only the records of these names")
    m.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "measure":
            return measure(args.chapter, args.only, args.dry_run)
        return render(args.check) if args.cmd == "render" else list_records()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
