"""Every class, method and function the chapters and the notebooks' text name in backticks exists.

tests/test_paths.py checks the files, modules and commands a text names; this checks the code names
in its prose (code blocks aside, which tests/test_chapter_quotes.py holds to the source):

    `ContinuousScheduler._victim`   a class of the package and an attribute it has (inherited, a
                                    method, a class attribute, or one its methods set on self)
    `PrefixCachingPolicy`           a class of the package, or a name of vLLM, Python or a library
                                    that the text discusses (FOREIGN below)
    `drain_copies()`                a function or method defined somewhere in the package

A `Class.attr` under a heading that names vLLM is vLLM's (its BlockPool is not ours), and is skipped.
"""
from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Names the texts use that are not the package's: vLLM's classes (the chapters compare), Python's
# and libraries' exceptions and types, and a class an exercise asks the student to add.
FOREIGN = set("""
AllocStatus AsyncLLM AttentionSpec BadRequestError CacheEngine CancelledError CopyOnWriteTracker
EngineCoreProc EngineCoreRequest FreeKVCacheBlockQueue GeneratorExit MsgpackDecoder MsgpackEncoder
NaiveBlockAllocator OutputProcessor ParentRequest PrometheusStatLogger RefCounter SpecDecodeWorker
StreamingResponse ValueError KeyError RuntimeError TypeError
EngineBusy
""".split())


@cache
def package_index():
    """(classes: name -> {attributes named in its body or set on self}, its bases' names; functions)."""
    classes: dict[str, tuple[set, list]] = {}
    functions: set[str] = set()
    for path in ROOT.glob("minipaged/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                attrs = set()
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        attrs.add(item.name)
                    elif (isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name)
                          and item.value.id == "self"):
                        attrs.add(item.attr)
                    elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                        attrs.add(item.id)
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                old = classes.get(node.name, (set(), []))
                classes[node.name] = (old[0] | attrs, old[1] + bases)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.add(node.name)
    return classes, functions


def has_attr(cls: str, attr: str, seen=()) -> bool:
    classes, _ = package_index()
    if cls not in classes or cls in seen:
        return False
    attrs, bases = classes[cls]
    return attr in attrs or any(has_attr(b, attr, seen + (cls,)) for b in bases)


def texts():
    """(name, prose): each chapter page without its code blocks, each notebook's markdown."""
    for path in sorted(ROOT.glob("chapters/*/*.md")):
        yield f"{path.parent.name}/{path.name}", path.read_text()
    for path in sorted(ROOT.glob("notebooks/*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path.name, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def problems(text: str) -> list[str]:
    classes, functions = package_index()
    text = re.sub(r"^\s*(```|~~~).*?^\s*\1", "", text, flags=re.S | re.M)
    found = []
    for section in re.split(r"^(?=#{1,4} )", text, flags=re.M):
        vllm = "vLLM" in section.split("\n", 1)[0]
        for m in re.finditer(r"`([A-Z][A-Za-z0-9]+)\.([A-Za-z_][A-Za-z0-9_]*)(?:\([^`]*\))?`", section):
            cls, attr = m.groups()
            if cls in classes and not vllm and not has_attr(cls, attr):
                found.append(m.group(0))
        for m in re.finditer(r"`([A-Z][a-z]+[A-Z][A-Za-z0-9]*)`", section):
            if m.group(1) not in classes and m.group(1) not in FOREIGN:
                found.append(m.group(0))
        for m in re.finditer(r"`([a-z_][a-z0-9_]*)\(\)`", section):
            if m.group(1) not in functions and m.group(1) not in dir(__builtins__):
                found.append(m.group(0))
    return found


@pytest.mark.parametrize("name,text", list(texts()), ids=lambda v: v if isinstance(v, str) and len(v) < 60 else "")
def test_every_named_class_method_and_function_exists(name, text):
    missing = problems(text)
    assert not missing, f"{name} names code the package does not have (renamed? removed?): {missing}"


def test_the_scan_finds_what_is_missing():
    assert problems("`ContinuousScheduler._victim` and `PrefixCachingPolicy.free()` and `drain_copies()`") == []
    assert problems("`SharedPolicy.check_invariants()` is inherited") == []
    assert problems("`PrefixCachingPolicy.no_such_method`, `NoSuchPolicy`, `no_such_function()`") == [
        "`PrefixCachingPolicy.no_such_method`", "`NoSuchPolicy`", "`no_such_function()`"]
    assert problems("## How vLLM does it\n\n`BlockPool.free_block_queue`") == []
    assert problems("```python\nPrefixCachingPolicy._release\n```\n") == []
