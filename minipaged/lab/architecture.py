"""The architecture page's picture and tables, generated from the code so that they cannot drift.

    python -m minipaged.lab.architecture            write docs/pages/architecture.svg and the generated
                                                    parts of docs/pages/architecture.md
    python -m minipaged.lab.architecture --check    exit 1, naming what is stale, if either would change
    python -m minipaged.lab.architecture --trace    trace one chat request again first (loads the model,
                                                    lab/request_path.py) and rewrite docs/pages/request_path.json

Three things are read from the code. The **layers**: every engine module's imports, read from its
source (at module level or inside a function), give it a floor: 0 if it imports nothing of the
package, else one above the highest module it imports, so every import points down and a circle
would have no floor at all. The **request's path**: the files one chat request runs through, in the
order it meets them, from the committed trace (docs/pages/request_path.json, retaken with --trace),
with their lengths now. The **lab** beside the engine: its folders and files; the engine imports
none of it (tests/test_layout.py). Only the request's files carry their length, so an edit anywhere
else leaves the picture as it is; an edit to one of them, or a module added or moved, redraws it.

Not handled: drawing the import arrows themselves (about 200; the floors say where they point).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "minipaged"
LAB = "minipaged.lab"
PAGE = ROOT / "docs" / "pages" / "architecture.md"
SVG = ROOT / "docs" / "pages" / "architecture.svg"
TRACE = ROOT / "docs" / "pages" / "request_path.json"
COMMAND = "python -m minipaged.lab.architecture"


# ---------------------------------------------------------------- the import graph


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that the file at ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` imports the module pkg.sub when there is one, else pkg itself
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # ``import a.b.c`` of a module a.b: a.b
                name = name.rpartition(".")[0]
            if name.startswith("minipaged"):
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def floors(edges: dict[str, set[str]]) -> dict[str, int]:
    """Each module's floor (see the module docstring). ValueError naming the circle if there is one."""
    found = cycle(edges)
    if found:
        raise ValueError("the modules import each other in a circle: " + " -> ".join(found))
    floor: dict[str, int] = {}

    def of(name: str) -> int:
        if name not in floor:
            floor[name] = 1 + max((of(d) for d in edges[name]), default=-1)
        return floor[name]

    for name in edges:
        of(name)
    return floor


# ---------------------------------------------------------------- what the page shows


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def summary(path: Path) -> str:
    """The first sentence of the module's docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    return first.split(". ")[0].rstrip(".").replace("|", "/")


def facts() -> dict:
    """Everything the picture and the tables show, as plain data."""
    known = modules()
    engine_edges = {m: {d for d in deps if not d.startswith(LAB)} for m, deps in graph().items()
                    if not m.startswith(LAB)}
    floor = floors(engine_edges)
    trace = json.loads(TRACE.read_text())
    by_path = {rel(p): m for m, p in known.items()}
    missing = [f for f in trace["files"] if f not in by_path]
    if missing:
        raise ValueError(f"{rel(TRACE)} names files that are gone: {missing}; retake it with `{COMMAND} --trace`")
    order = {by_path[f]: i for i, f in enumerate(trace["files"], 1)}
    engine = [{"module": m, "path": rel(known[m]), "lines": lines(known[m]), "floor": floor[m],
               "step": order.get(m)} for m in sorted(engine_edges)]
    lab: dict[str, int] = {}  # folder/ or module: how many files
    for m, p in known.items():
        if m.startswith(LAB):
            parts = p.relative_to(PACKAGE / "lab").parts
            group = parts[0] + "/" if len(parts) > 1 else parts[0]
            lab[group] = lab.get(group, 0) + 1
    path = sorted((e for e in engine if e["step"]), key=lambda e: e["step"])
    return {"engine": engine, "lab": lab, "path": path, "trace": trace}


# ---------------------------------------------------------------- the picture

BOX_W, BOX_H, GAP, ROW_H, LEFT, LAB_W = 126, 38, 8, 56, 70, 250
BLUE, GREY = "#2563eb", "#9ca3af"


def svg(f: dict) -> str:
    rows: dict[int, list[dict]] = {}
    for e in f["engine"]:
        rows.setdefault(e["floor"], []).append(e)
    for row in rows.values():  # the request's files first, in the order it meets them, then the rest
        row.sort(key=lambda e: (e["step"] is None, e["step"] or 0, e["path"]))
    top = max(rows)
    lab = sorted(f["lab"].items(), key=lambda item: (not item[0].endswith("/"), item[0]))
    lab_h = 56 + len(lab) * 17
    lab_rows = range(top, top - lab_h // ROW_H - 2, -1)  # the floors beside which the lab's box stands
    lab_x = LEFT + max(len(rows.get(r, [])) for r in lab_rows) * (BOX_W + GAP) + 40
    width = max(LEFT + max(len(r) for r in rows.values()) * (BOX_W + GAP), lab_x + LAB_W) + 20
    height = 60 + (top + 1) * ROW_H + 40
    total = sum(e["lines"] for e in f["path"])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
           ' font-family="DejaVu Sans, Arial, sans-serif">',
           '<style>.n{font-size:11px}.s{font-size:9px;fill:#4b5563}.t{font-size:15px;font-weight:bold}'
           '.l{font-size:10px;fill:#6b7280}.k{font-size:9px;font-weight:bold;fill:#fff}</style>',
           '<rect width="100%" height="100%" fill="#ffffff"/>',
           f'<text class="t" x="12" y="24">The engine by floor (every import points down), one chat request\'s '
           f'path through it ({len(f["path"])} files, {total:,} lines), and the lab beside it</text>',
           f'<text class="l" x="12" y="42">generated by {escape(COMMAND)} from the code and {escape(rel(TRACE))}; '
           'blue: the files the request runs, numbered in the order it first enters them</text>']
    centres, boxes = {}, []
    for floor_no in range(top, -1, -1):
        y = 60 + (top - floor_no) * ROW_H
        boxes.append(f'<text class="l" x="12" y="{y + 24}">floor {floor_no}</text>')
        for i, e in enumerate(rows.get(floor_no, [])):
            x, on = LEFT + i * (BOX_W + GAP), e["step"] is not None
            folder, _, name = e["path"].removeprefix("minipaged/").rpartition("/")
            where = folder + "/" if folder else "minipaged/"
            boxes.append(f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4" '
                         f'fill="{"#dbeafe" if on else "#f9fafb"}" stroke="{BLUE if on else GREY}"/>')
            boxes.append(f'<text class="s" x="{x + 5}" y="{y + 12}">{escape(where)}</text>')
            boxes.append(f'<text class="n" x="{x + 5}" y="{y + 25}">{escape(name)}</text>')
            if on:  # only the request's files carry their length: any other edit leaves the picture alone
                boxes.append(f'<text class="s" x="{x + 5}" y="{y + 35}">{e["lines"]:,} lines</text>')
            if on:
                cx, cy = x + BOX_W - 11, y + 11
                centres[e["step"]] = (x + BOX_W / 2, y + BOX_H / 2)
                boxes.append(f'<circle cx="{cx}" cy="{cy}" r="8" fill="{BLUE}"/>')
                boxes.append(f'<text class="k" x="{cx}" y="{cy + 3}" text-anchor="middle">{e["step"]}</text>')
    if centres:  # the request's path, drawn under the boxes
        d = " ".join(f"{'M' if i == 0 else 'L'}{x:.0f},{y:.0f}" for i, (x, y) in
                     enumerate(centres[k] for k in sorted(centres)))
        out.append(f'<path d="{d}" fill="none" stroke="{BLUE}" stroke-opacity="0.3" stroke-width="2" '
                   'stroke-dasharray="5,4"/>')
    out += boxes
    out.append(f'<rect x="{lab_x}" y="60" width="{LAB_W}" height="{lab_h}" rx="6" fill="#fef9c3" stroke="#ca8a04"/>')
    out.append(f'<text class="n" x="{lab_x + 10}" y="78" font-weight="bold">minipaged/lab/: the instruments</text>')
    out.append(f'<text class="s" x="{lab_x + 10}" y="92">it imports the engine; the engine never imports it</text>')
    for i, (group, n) in enumerate(lab):
        out.append(f'<text class="s" x="{lab_x + 10}" y="{110 + i * 17}">{escape(group)}'
                   f'{f"  {n} files" if n > 1 else ""}</text>')
    out.append(f'<text class="l" x="12" y="{height - 14}">{len(f["engine"])} engine modules; the lab '
               f'{sum(f["lab"].values())}. The C++ kernels (minipaged/csrc/) are not drawn.</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the page's tables

BEGIN, END = "<!-- {name}: generated by python -m minipaged.lab.architecture -->", "<!-- {name}: end -->"


def path_table(f: dict) -> str:
    rows = ["| # | file | lines | floor | what it is |", "|---:|---|---:|---:|---|"]
    for e in f["path"]:
        rows.append(f"| {e['step']} | [`{e['path']}`](../../{e['path']}) | {e['lines']:,} | {e['floor']} | "
                    f"{summary(ROOT / e['path'])} |")
    rows.append(f"| | **{len(f['path'])} files** | **{sum(e['lines'] for e in f['path']):,}** | | |")
    return "\n".join(rows)


def layers_table(f: dict) -> str:
    rows = ["| floor | modules (blue in the picture: on the request's path) |", "|---:|---|"]
    for floor_no in range(max(e["floor"] for e in f["engine"]), -1, -1):
        names = [(f"**{e['path']}**" if e["step"] else e["path"]).replace("minipaged/", "", 1)
                 for e in sorted(f["engine"], key=lambda e: e["path"]) if e["floor"] == floor_no]
        rows.append(f"| {floor_no} | {', '.join(names)} |")
    return "\n".join(rows)


def page(text: str, f: dict) -> str:
    for name, table in (("request path", path_table(f)), ("layers", layers_table(f))):
        begin, end = BEGIN.format(name=name), END.format(name=name)
        if begin not in text or end not in text:
            raise ValueError(f"{rel(PAGE)} has no '{begin}' ... '{end}' block for the {name} table")
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + table + "\n" + end + rest.split(end, 1)[1]
    return text


def outputs() -> dict[Path, str]:
    f = facts()
    return {SVG: svg(f), PAGE: page(PAGE.read_text(), f)}


def retrace(model: str = "smollm2-135m") -> None:
    from minipaged.lab.request_path import MESSAGES, trace

    files = [f["path"] for f in trace(model)]
    TRACE.write_text(json.dumps({"command": f"{COMMAND} --trace", "model": model, "messages": MESSAGES,
                                 "max_tokens": 8, "files": files}, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the picture or the page is stale")
    parser.add_argument("--trace", action="store_true", help="trace one chat request again first (loads the model)")
    args = parser.parse_args(argv)
    if args.trace:
        retrace()
    stale = [rel(p) for p, text in outputs().items() if not p.exists() or p.read_text() != text]
    if args.check:
        if stale:
            print(f"stale: {', '.join(stale)}; run `{COMMAND}`", file=sys.stderr)
            return 1
        print("the architecture page and its picture are up to date")
        return 0
    for p, text in outputs().items():
        p.write_text(text)
    print(f"wrote {', '.join(rel(p) for p in (SVG, PAGE))}" + (f" (changed: {', '.join(stale)})" if stale else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
