"""Every file, folder, module and command that the README, the chapters, the docs pages and the
notebooks' text name exists.

What is checked, in each text (record blocks left out: they show what a command printed when it ran):

    [text](relative/link)              the file the link points to, relative to the text
    `minipaged/kv/base.py`, `kv/`      a path in backticks: relative to the text, to the repository
                                       or to minipaged/; a bare name (`sim.py`) must exist somewhere
    minipaged.lab.records              a module (or a name one defines at top level)
    python -m minipaged bench serving  a command of the command line, and its benchmark

A name of another project's file (vLLM's, FlashInfer's) is listed in FOREIGN with whose it is.
``NN`` in a name stands for a chapter number, ``NN_slug`` for a chapter's folder.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minipaged"
OURS = {"minipaged", "tests", "scripts", "chapters", "notebooks", "docs", ".ci"}
FOREIGN = {  # files the texts name in other projects, with whose they are
    "naive_block.py": "vLLM", "kv_cache_manager.py": "vLLM", "eagle.py": "vLLM", "ngram_proposer.py": "vLLM",
    "flash_attn.py": "vLLM", "flashinfer.py": "vLLM", "api_server.py": "vLLM", "serving_chat.py": "vLLM",
    "csrc/attention/": "vLLM", "csrc/cpu/": "vLLM", "site/": "the docs build's output",
}
RECORD_BLOCK = re.compile(r"<!-- record: .*?<!-- /record -->", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
PATH = re.compile(r"[\w.\-/]+\.(py|md|ipynb|json|sh|png|svg|cpp|html|txt|yml|toml)|[\w.\-]+(/[\w.\-]+)*/")


def texts() -> list[tuple[Path, str]]:
    """(file, its text as a reader sees it): the README, chapters, docs pages and notebooks' markdown."""
    found = []
    for path in [ROOT / "README.md", *sorted(ROOT.glob("chapters/*/*.md")), *sorted(ROOT.glob("docs/pages/*.md"))]:
        found.append((path, COMMENT.sub("", RECORD_BLOCK.sub("", path.read_text()))))
    for path in sorted(ROOT.glob("notebooks/*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        found.append((path, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
    return found


def _exists(candidate: Path, name: str) -> bool:
    if "NN" in name:  # a pattern: NN_slug is a chapter's folder, NN its number
        pattern = name.replace("NN_slug", "[0-9][0-9]_*").replace("NN", "[0-9][0-9]")
        return any(candidate.parent.glob(Path(pattern).name)) if "/" in name else bool(list(ROOT.glob(pattern)))
    return candidate.exists()


def missing_path(text_file: Path, name: str) -> bool:
    """Whether a path named in text_file is nowhere to be found."""
    name = name.rstrip(",.:;")
    if name in FOREIGN:
        return False
    first = name.split("/")[0]
    if "/" in name.rstrip("/") and first not in OURS and not (PACKAGE / first).exists() \
            and not (text_file.parent / first).exists():
        return False  # a path of another project's tree (vllm/v1/...)
    if any(_exists(base / name, name) for base in (text_file.parent, ROOT, PACKAGE)):
        return False
    if "/" not in name and name in basenames():
        return False
    if "NN" in name:
        return not list(ROOT.glob(name.replace("NN_slug", "[0-9][0-9]_*").replace("NN", "[0-9][0-9]")))
    return True


@functools.cache
def basenames() -> set[str]:
    """The name of every file of the project (a bare `name.py` in a text must be one of them)."""
    return {p.name for top in OURS for p in (ROOT / top).rglob("*") if p.is_file()}


def _top_level_names(source: Path) -> set[str]:
    tree = ast.parse(source.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if source.name == "__init__.py":  # a lazy package (``__getattr__``) names what it gives in __all__
        names |= set(re.findall(r'"(\w+)"', source.read_text()))
    return names


def missing_module(dotted: str) -> bool:
    """Whether ``minipaged.x.y[.name]`` is neither a module nor a name a module defines."""
    path = ROOT
    for i, part in enumerate(dotted.split(".")):
        if (path / part).is_dir():
            path = path / part
        elif (path / f"{part}.py").exists():
            return False  # a module; what follows it (if anything) is an attribute of it
        else:
            return i == 0 or part not in _top_level_names(path / "__init__.py")
    return False


def commands() -> tuple[set[str], set[str]]:
    """The command line's commands and the benchmarks of ``bench``."""
    from minipaged.cli import build_parser
    from minipaged.lab.cli import build_parser as lab_parser

    def names(parser):
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        return action.choices

    top, lab = names(build_parser()), names(lab_parser())
    return set(top), set(names(lab["bench"]))


def problems(scanned=None) -> list[str]:
    found = []
    top, benches = commands()
    for text_file, text in texts() if scanned is None else scanned:
        where = text_file.relative_to(ROOT)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            target = link.split("#")[0]
            if target and not re.match(r"[a-z]+:", target) and not (text_file.parent / target).exists():
                found.append(f"{where}: the link ({link}) leads nowhere")
        for name in re.findall(r"`([^`\s]+)`", text):
            name = re.sub(r"[:#].*$", "", name)
            if PATH.fullmatch(name.rstrip(",.:;")) and missing_path(text_file, name):
                found.append(f"{where}: `{name}` does not exist")
        for dotted in re.findall(r"\b(minipaged(?:\.\w+)+)", text):
            if missing_module(dotted.rstrip(".")):
                found.append(f"{where}: {dotted} is not a module of minipaged nor a name one defines")
        for command, rest in re.findall(r"python -m minipaged (\w+)((?: [\w-]+)?)", text):
            if command not in top:
                found.append(f"{where}: `python -m minipaged {command}` is not a command ({sorted(top)})")
            elif command == "bench" and rest.strip() and not rest.strip().startswith("-") \
                    and rest.strip() not in benches:
                found.append(f"{where}: `python -m minipaged bench{rest}` is not a benchmark ({sorted(benches)})")
    return sorted(set(found))


def test_every_named_path_module_and_command_exists():
    found = problems()
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text,bad", [
    ("see `minipaged/kv/nothing_here.py`", True),
    ("see `minipaged/kv/base.py`", False),
    ("see `kv/base.py` and [the chapter](chapters/03_block-table/README.md)", False),
    ("vLLM keeps it in `vllm/v1/core/kv_cache_manager.py`", False),
    ("run `python -m minipaged.lab.records render`", False),
    ("run `python -m minipaged.records render`", True),
    ("`paged_engine.py`", True),
])
def test_the_scan_finds_what_is_missing(text, bad):
    found = problems([(ROOT / "README.md", text)])
    assert bool(found) is bad, found
