"""Capture: writing a results record, the lab's leaf (it imports nothing else of minipaged).

A benchmark or a simulation that takes ``--record [[NN/]NAME]`` is run inside ``recording``: what it
prints is copied, and the numbers it computed (``publish``, or ``emit`` which also prints them with
``--json``) are kept with the command line, the git commit of the code it measured, the date and the
machine, in ``chapters/NN_slug/results/NAME.json``. ``load`` reads one back. Rendering
them into the chapters is records.py's job (the top of the lab).

    add_argument(parser, "06/bench_serving")   give a command --record
    call(args, argv)                           run a parsed command, recording it if asked
    emit(results, as_json)                     hand over the numbers (and print them with --json)

Not handled: records of commands that do not run in this process (the notebooks).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = ROOT / "chapters"


# ---------------------------------------------------------------- writing a record


def add_argument(parser: argparse.ArgumentParser, default) -> None:
    """Give a command ``--record [[NN/]NAME]``. ``default`` is where a bare ``--record`` goes: "NN/name",
    or a function of the parsed arguments that returns one (for a command whose mode picks the chapter)."""
    shown = default if isinstance(default, str) else "depends on the mode"
    parser.add_argument("--record", nargs="?", const="", default=None, metavar="[NN/]NAME",
                        help=f"also write this run to chapters/NN_slug/results/NAME.json (default: {shown}): "
                             f"the command, commit, date, machine, output and results, which "
                             f"`python -m minipaged.lab.records render` writes into the chapter")
    parser.set_defaults(record_default=default)


def call(args: argparse.Namespace, argv: list[str]) -> int:
    """Run a parsed command, inside a recording when it was given ``--record``."""
    spec = getattr(args, "record", None)
    if spec is None:
        return args.func(args) or 0
    default = args.record_default if isinstance(args.record_default, str) else args.record_default(args)
    chapter, _, name = default.rpartition("/")
    if spec:
        spec_chapter, _, name = spec.rpartition("/")
        chapter = spec_chapter or chapter
    with recording(record_path(name, chapter), argv) as done:
        rc = args.func(args) or 0
        done(rc == 0)
    return rc


def chapter_dir(number: str) -> Path:
    found = sorted(CHAPTERS.glob(f"{int(number):02d}_*"))
    if not found:
        known = sorted(p.name[:2] for p in CHAPTERS.glob("[0-9][0-9]_*"))
        raise ValueError(f"--record: no chapter {number!r}; chapters are {known}")
    return found[0]


def record_path(name: str, chapter: str) -> Path:
    """chapters/NN_slug/results/NAME.json."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"--record: a name is letters, digits, '_', '.' and '-', got {name!r}")
    if not chapter.isdigit():
        raise ValueError(f"--record: a chapter is a number such as 06, got {chapter!r}")
    return chapter_dir(chapter) / "results" / f"{name}.json"


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads()}


def git_commit() -> dict:
    """The commit of the code being measured, and whether minipaged/ differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short=7", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--", "minipaged"))
    return {"commit": commit, "dirty": dirty}


class _Tee(io.TextIOBase):
    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, s):
        self.copy.write(s)
        return self.stream.write(s)

    def flush(self):
        self.stream.flush()

    def isatty(self):
        return False


_active: dict | None = None


def publish(results: dict) -> None:
    """A command hands over the numbers it computed; kept only while a record is being made."""
    if _active is not None:
        _active["results"] = json.loads(json.dumps(results, default=str))


def emit(results: dict, as_json: bool) -> None:
    """What every recordable command does with its numbers: publish them, and print them with --json."""
    publish(results)
    if as_json:
        print(json.dumps(results, indent=2))


@contextlib.contextmanager
def recording(path: Path, argv: list[str]):
    """Run the body with stdout copied; it calls the yielded function with True to write the record."""
    global _active
    command = " ".join(["python -m minipaged", *_without_record(argv)])
    _active = {"command": command, **git_commit(),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": machine(), "results": None}
    tee, saved = _Tee(sys.stdout), sys.stdout
    ok = []
    sys.stdout = tee
    try:
        yield ok.append
    finally:
        sys.stdout, record = saved, dict(_active, stdout=tee.copy.getvalue())
        _active = None
    if ok and ok[0]:
        if record["results"] is None:
            raise RuntimeError(f"{command}: the command published no results to record")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"recorded in {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", file=sys.stderr)


def _without_record(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--record":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = nxt is not None and not nxt.startswith("-")
            continue
        if a.startswith("--record="):
            continue
        out.append(a)
    return out


# ---------------------------------------------------------------- reading a record

def load(chapter: Path | None, name: str) -> dict:
    """The record NAME of ``chapter``, or NN/NAME of chapter NN (the only form a docs page may use)."""
    if "/" in name:
        number, name = name.split("/")
        chapter = chapter_dir(number)
    if chapter is None:
        raise ValueError(f"a docs page quotes record {name!r}: name its chapter, as NN/{name}")
    path = chapter / "results" / f"{name}.json"
    if not path.exists():
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        raise ValueError(f"{chapter.name}/README.md quotes record {name!r}, but {shown} does not exist: "
                         f"run its command with --record {chapter.name[:2]}/{name}")
    return json.loads(path.read_text())
