"""Build the course site in one command: execute the notebooks, assemble the pages, run mkdocs --strict.

    python docs/build.py                    # everything; the site lands in site/ (open site/index.html)
    python docs/build.py --skip-execute     # render the notebooks as they are (fast; no outputs)
    python docs/build.py --only 00          # execute chapter 00's notebook; the others come from the
                                            #   cache of earlier builds, or as they are
    python docs/build.py --check-notebooks  # only execute the notebooks (for CI); fail on the first error
    python docs/build.py --force            # execute again even when nothing changed
    python docs/build.py --serve            # build, then serve the site on http://127.0.0.1:8000
    python docs/build.py --skip-figures     # keep the committed figures of chapters 06-11 (see below)

What goes where (everything generated lives under build/docs/, the site under site/):

    README.md                      -> index.md (a generated chapter list when there is no README yet)
    chapters/NN_slug/ (all files)  -> chapters/NN_slug/, its README.md as the page index.md (the core
                                      path) and deep-dive.md, where there is one, beside it in the nav
    notebooks/NN_slug.ipynb        -> notebooks/NN_slug.ipynb, executed with nbclient (cached in
                                      build/docs/executed/ until the notebook or minipaged/ changes)
    docs/pages/*.md                -> *.md (site-level pages, e.g. about.md)
    docs/stylesheets/              -> stylesheets/ (the theme's extra CSS)
    minipaged/**/*.py              -> code/minipaged/**.py.md (the source, highlighted, line-numbered)
    any other repository file a page links to: a markdown page is included as is, a text file gets a
    code page, a folder gets a listing, anything else is copied.

Figures. The explanatory figures of chapters 00 and 06-11 are drawn again at every build, by
docs/figures_00.py and docs/figures_06_11.py (a few seconds: small seeded runs of the engine, the
tiny model, the kernels in numba's simulator), into the assembled copy build/docs/src/chapters/NN_slug/,
over the committed PNGs copied there. So the site always shows what the current code draws, and the
build never changes a file of the repository; the committed copies, for reading the chapters on a
forge, are refreshed by running the script by hand. A script that fails fails the build. The other
figures of chapters 00-05 (docs/figures_01_04.py, docs/figures_05.py, the benchmarks' --plot-dir)
take minutes or the real model, so the site shows their committed copies.

Links are written for reading the repository on disk or on a forge (README.md -> chapters/NN_slug/
README.md -> ../../notebooks/NN_slug.ipynb -> ../../minipaged/kv/per_request.py#L20); the build
rewrites them to the site's pages. Chapters and notebooks are found by globbing, so new ones appear in
the navigation, ordered by their number, without touching this file. A link to a chapter that is not
written yet becomes plain text (with a warning); every other broken link fails the build.

Needs pyproject.toml's "docs" extra (pip install -r requirements.txt -e ".[docs]"). Works offline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "docs"
SRC = BUILD / "src"  # mkdocs' docs_dir: the assembled pages
EXECUTED = BUILD / "executed"  # executed notebooks, reused while their inputs are unchanged
SITE = ROOT / "site"
PAGES = ROOT / "docs" / "pages"
FIRST_PAGE = "about.md"  # "How to use this course": first in the navigation
STYLESHEETS = ROOT / "docs" / "stylesheets"  # copied to the site as stylesheets/ (see extra_css in mkdocs.yml)
KERNEL_NAME = "minipaged-docs"
# each takes --out-dir; run at every build (see above)
FIGURE_SCRIPTS = [ROOT / "docs" / "figures_00.py", ROOT / "docs" / "figures_06_11.py"]

NUMBERED = re.compile(r"^(\d+)_(.+)$")
SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache"}
TEXT_SUFFIXES = {".py", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".json", ".sh", ".in", ".csv", ".j2", ""}
LEXERS = {".py": "python", ".toml": "toml", ".yml": "yaml", ".yaml": "yaml", ".json": "json", ".sh": "bash",
          ".cfg": "ini", ".ini": "ini"}
MAX_CODE_PAGE_BYTES = 300_000


def rel(path: Path) -> str:
    """A path for messages: relative to the repository when inside it."""
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def log(msg: str) -> None:
    print(f"[docs] {msg}", flush=True)


class BuildError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------ discovery
@dataclass
class Chapter:
    number: str  # "00"
    slug: str  # "the-kv-cache"
    folder: Path | None = None  # chapters/00_the-kv-cache (None: a notebook without a chapter text)
    notebooks: list[Path] = field(default_factory=list)

    @property
    def title(self) -> str:
        if self.folder is not None and (self.folder / "README.md").exists():
            h1 = first_heading((self.folder / "README.md").read_text(encoding="utf-8"))
            if h1:
                return h1
        return f"{self.number} · {self.slug.replace('-', ' ').replace('_', ' ').capitalize()}"


def first_heading(markdown: str) -> str | None:
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and line.startswith("# "):
            return line[2:].strip()
    return None


def notebook_title(path: Path) -> str | None:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            h1 = first_heading(cell.source)
            if h1:
                return h1
    return None


def discover() -> list[Chapter]:
    """Chapters (chapters/NN_slug/README.md) and notebooks (notebooks/NN_slug.ipynb), paired by number."""
    chapters: dict[str, Chapter] = {}
    for readme in sorted((ROOT / "chapters").glob("*/README.md")):
        m = NUMBERED.match(readme.parent.name)
        if not m:
            log(f"warning: {readme.parent.relative_to(ROOT)} is not named NN_slug; left out")
            continue
        chapters[m.group(1)] = Chapter(m.group(1), m.group(2), folder=readme.parent)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        m = NUMBERED.match(nb.stem)
        if not m:
            log(f"warning: {nb.relative_to(ROOT)} is not named NN_slug.ipynb; left out")
            continue
        chapters.setdefault(m.group(1), Chapter(m.group(1), m.group(2))).notebooks.append(nb)
    return [chapters[k] for k in sorted(chapters, key=lambda n: (int(n), n))]


# ------------------------------------------------------------------------------------------ notebooks
def inputs_hash(nb_path: Path) -> str:
    """What an executed notebook depends on: its own text and the package it imports."""
    h = hashlib.sha256(nb_path.read_bytes())
    for f in sorted((ROOT / "minipaged").rglob("*.py")):
        if not SKIP_PARTS & set(f.parts):
            h.update(str(f.relative_to(ROOT)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def prepare_kernel() -> None:
    """A kernelspec for this very interpreter, and PYTHONPATH set so the kernel imports this checkout."""
    spec_dir = BUILD / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python (minipaged docs)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(BUILD / "jupyter"),
                                                               os.environ.get("JUPYTER_PATH")]))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # silences a debugger warning per kernel


def execute_notebook(nb_path: Path, timeout: int):
    """Run every cell in a fresh kernel, with the notebook's folder as working directory."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(nb_path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME, allow_errors=False,
                            resources={"metadata": {"path": str(nb_path.parent)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError) as e:
        failed = EXECUTED / "failed" / nb_path.name
        failed.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, failed)
        raise BuildError(f"{rel(nb_path)} failed (the partly executed notebook is in {rel(failed)}):\n{e}") from None
    seconds = time.perf_counter() - t0
    nb.metadata["minipaged_docs"] = {"inputs_sha256": inputs_hash(nb_path), "seconds": round(seconds, 1)}
    return nb, seconds


def write_executed(nb_path: Path, nb) -> Path:
    """Keep an executed notebook in build/docs/executed/ (the site's cache, and what
    ``python -m minipaged.lab.notebooks store`` copies the outputs from)."""
    import nbformat

    cached = EXECUTED / nb_path.name
    cached.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, cached)
    return cached


def notebook_for_site(nb_path: Path, mode: str, timeout: int, force: bool) -> Path:
    """The notebook file to render: freshly executed, from the cache, or as it is.

    mode: "execute" (run it unless the cache is current), "cached-or-raw" (never run it).
    """
    import nbformat

    cached = EXECUTED / nb_path.name
    rel_path = rel(nb_path)
    if cached.exists() and not force:
        meta = nbformat.read(cached, as_version=4).metadata.get("minipaged_docs", {})
        if meta.get("inputs_sha256") == inputs_hash(nb_path):
            log(f"{rel_path}: unchanged since it was last executed; using build/docs/executed/{nb_path.name}")
            return cached
    if mode != "execute":
        log(f"{rel_path}: not executed (rendered as it is, without outputs)")
        return nb_path
    log(f"{rel_path}: executing (cell timeout {timeout} s) ...")
    nb, seconds = execute_notebook(nb_path, timeout)
    write_executed(nb_path, nb)
    log(f"{rel_path}: executed in {seconds:.0f} s")
    return cached


# ------------------------------------------------------------------------------------------ the site
LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\]\()(<[^>]*>|[^)\s]+)((?:\s+\"[^\"]*\")?\))")
REF_LINK = re.compile(r"^( {0,3}\[(?!\^)[^\]]+\]:\s*)(\S+)(.*)$", re.M)  # not footnotes [^1]:
HTML_LINK = re.compile(r"""(\b(?:src|href)=)(["'])([^"']+)\2""")
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})")
LINE_ANCHOR = re.compile(r"^L(\d+)(?:-L\d+)?$")


def split_fences(markdown: str):
    """Yield (is_code, text) chunks, so that links are never rewritten inside fenced code blocks."""
    chunk, in_fence, fence = [], False, ""
    for line in markdown.splitlines(keepends=True):
        m = FENCE.match(line)
        if not in_fence and m:
            if chunk:
                yield False, "".join(chunk)
            chunk, in_fence, fence = [line], True, m.group(2)
        elif in_fence and m and m.group(2)[0] == fence[0] and len(m.group(2)) >= len(fence) \
                and not line.strip()[len(m.group(2)):]:
            chunk.append(line)
            yield True, "".join(chunk)
            chunk, in_fence = [], False
        else:
            chunk.append(line)
    if chunk:
        yield in_fence, "".join(chunk)


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith(("#", "/", "//"))


class Site:
    """Maps repository paths to site pages, creating the pages that links ask for."""

    def __init__(self, chapters: list[Chapter]):
        self.chapters = chapters
        self.pages: dict[str, str] = {}  # repo path -> site path (both posix, relative)
        self.todo: list[tuple[str, str]] = []  # (repo path, site path) of markdown to rewrite
        self.notebooks: list[tuple[Path, str]] = []  # (file to render, site path)
        self.code_pages: dict[str, str] = {}  # repo path -> site path of generated code pages
        self.warnings: list[str] = []

    # -- registering
    def add_markdown(self, repo_path: str, site_path: str, text: str | None = None) -> None:
        self.pages[repo_path] = site_path
        dest = SRC / site_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text if text is not None else (ROOT / repo_path).read_text(encoding="utf-8"),
                        encoding="utf-8")
        self.todo.append((repo_path, site_path))

    def add_file(self, repo_path: str, site_path: str | None = None) -> str:
        site_path = site_path or repo_path
        dest = SRC / site_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / repo_path, dest)
        self.pages[repo_path] = site_path
        return site_path

    def add_code_page(self, repo_path: str) -> str:
        if repo_path in self.code_pages:
            return self.code_pages[repo_path]
        site_path = f"code/{repo_path}.md"
        text = (ROOT / repo_path).read_text(encoding="utf-8")
        longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=0)
        fence = "`" * max(3, longest + 1)
        lang = LEXERS.get(PurePosixPath(repo_path).suffix, "text")
        page = (f"# `{repo_path}`\n\n"
                f"<small>[source index]({posix_rel('code/index.md', site_path)})</small>\n\n"
                f'{fence}{lang} linenums="1"\n{text}{"" if text.endswith(chr(10)) else chr(10)}{fence}\n')
        dest = SRC / site_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(page, encoding="utf-8")
        self.code_pages[repo_path] = site_path
        self.pages[repo_path] = site_path
        return site_path

    def add_folder_page(self, repo_dir: str) -> str:
        """A page listing a folder's files (for links such as tests/ch00_the_kv_cache/)."""
        site_path = f"code/{repo_dir}/index.md" if repo_dir else "code/root.md"
        if repo_dir + "/" in self.pages:
            return self.pages[repo_dir + "/"]
        self.pages[repo_dir + "/"] = site_path
        lines = [f"# `{repo_dir}/`\n"]
        for f in sorted((ROOT / repo_dir).iterdir()):
            if f.name.startswith(".") or f.name in SKIP_PARTS or f.suffix == ".pyc":
                continue
            rel = f.relative_to(ROOT).as_posix()
            target = self.site_path_for(rel + ("/" if f.is_dir() else ""))
            if target:
                lines.append(f"- [`{f.name}{'/' if f.is_dir() else ''}`]({posix_rel(target, site_path)})")
        dest = SRC / site_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return site_path

    # -- resolving
    def site_path_for(self, repo_path: str) -> str | None:
        """The site path that stands for a repository path (creating a page if needed), or None."""
        is_dir = repo_path.endswith("/")
        repo_path = repo_path.rstrip("/")
        if repo_path in self.pages:
            return self.pages[repo_path]
        if repo_path + "/" in self.pages:
            return self.pages[repo_path + "/"]
        full = ROOT / repo_path
        if not full.exists() or SKIP_PARTS & set(PurePosixPath(repo_path).parts):
            return None
        if full.is_dir() or is_dir:
            if (full / "README.md").exists():  # a folder with a README: that is its page
                return self.site_path_for(f"{repo_path}/README.md")
            return self.add_folder_page(repo_path)
        if full.suffix == ".md":
            site_path = repo_path[: -len("README.md")] + "index.md" if full.name == "README.md" else repo_path
            self.add_markdown(repo_path, site_path)
            return site_path
        if full.suffix.lower() in TEXT_SUFFIXES and full.stat().st_size <= MAX_CODE_PAGE_BYTES:
            try:
                full.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                return self.add_file(repo_path)
            return self.add_code_page(repo_path)
        return self.add_file(repo_path)

    def missing_chapter(self, repo_path: str) -> bool:
        parts = PurePosixPath(repo_path).parts
        if len(parts) >= 2 and parts[0] == "chapters" and NUMBERED.match(parts[1]):
            return not (ROOT / "chapters" / parts[1] / "README.md").exists()
        if len(parts) == 2 and parts[0] == "notebooks" and parts[1].endswith(".ipynb"):
            return not (ROOT / repo_path).exists()
        return False

    def rewrite_target(self, target: str, repo_page: str, site_page: str, html: bool):
        """New link target, or None when the target is a chapter not written yet. Unknown: unchanged."""
        if is_external(target):
            return target
        path, _, anchor = target.partition("#")
        path = path.split("?", 1)[0]
        if not path:
            return target
        resolved = os.path.normpath(os.path.join(os.path.dirname(repo_page), path)).replace(os.sep, "/")
        if resolved.startswith("../") or resolved == "..":
            return target
        site_path = self.site_path_for(resolved + ("/" if path.endswith("/") else ""))
        if site_path is None:
            if self.missing_chapter(resolved):
                return None
            self.warnings.append(f"{repo_page}: broken link {target!r}")
            return target
        if anchor and site_path in self.code_pages.values():
            m = LINE_ANCHOR.match(anchor)
            if m:
                anchor = f"__codelineno-0-{m.group(1)}"
        new = posix_rel(site_path, site_page)
        if html:  # notebooks are rendered outside mkdocs' link handling: point at the .html page
            new = re.sub(r"\.(md|ipynb)$", ".html", new)
        return new + (f"#{anchor}" if anchor else "")

    def rewrite_markdown(self, text: str, repo_page: str, site_page: str, html: bool = False) -> str:
        def inline(m):
            raw = m.group(2)
            target = raw[1:-1] if raw.startswith("<") else raw
            new = self.rewrite_target(target, repo_page, site_page, html)
            if new is None:  # a chapter not written yet: keep the words, drop the link
                self.warnings.append(f"{repo_page}: link {target!r} points to a chapter not written yet; "
                                     "shown as plain text")
                return m.group(0) if m.group(1).startswith("!") else m.group(1)[1:-2]
            return f"{m.group(1)}{new}{m.group(3)}"

        def reference(m):
            new = self.rewrite_target(m.group(2), repo_page, site_page, html)
            return f"{m.group(1)}{new if new is not None else '#'}{m.group(3)}"

        def attribute(m):
            new = self.rewrite_target(m.group(3), repo_page, site_page, html)
            return f"{m.group(1)}{m.group(2)}{new if new is not None else '#'}{m.group(2)}"

        out = []
        for is_code, chunk in split_fences(text):
            if not is_code:
                chunk = LINK.sub(inline, chunk)
                chunk = REF_LINK.sub(reference, chunk)
                chunk = HTML_LINK.sub(attribute, chunk)
            out.append(chunk)
        return "".join(out)

    def finish(self) -> None:
        """Rewrite links in every markdown page (pages found on the way are processed too)."""
        while self.todo:
            repo_path, site_path = self.todo.pop(0)
            dest = SRC / site_path
            dest.write_text(self.rewrite_markdown(dest.read_text(encoding="utf-8"), repo_path, site_path),
                            encoding="utf-8")

    def write_notebook(self, source: Path, repo_path: str, site_path: str) -> None:
        import nbformat

        nb = nbformat.read(source, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = self.rewrite_markdown(cell.source, repo_path, site_path, html=True)
        dest = SRC / site_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)
        self.pages[repo_path] = site_path


def posix_rel(target: str, from_page: str) -> str:
    return os.path.relpath(target, os.path.dirname(from_page) or ".").replace(os.sep, "/")


def module_summary(path: Path) -> str:
    m = re.match(r'\s*(?:#.*\n\s*)*(?:"""|\'\'\')\s*(.+)', path.read_text(encoding="utf-8"))
    return m.group(1).strip().rstrip('"').strip() if m else ""


def generated_home(chapters: list[Chapter]) -> str:
    lines = ["# minipaged", "",
             "A small LLM engine, built chapter by chapter, that shows how a server manages KV-cache memory "
             "the way vLLM's PagedAttention does.", "",
             "| # | chapter | notebook |", "|---|---|---|"]
    for ch in chapters:
        text = f"[{ch.title}](chapters/{ch.folder.name}/README.md)" if ch.folder else ch.title
        nbs = ", ".join(f"[{nb.stem}](notebooks/{nb.name})" for nb in ch.notebooks) or "–"
        lines.append(f"| {ch.number} | {text} | {nbs} |")
    return "\n".join(lines) + "\n"


def code_index(site: Site) -> str:
    lines = ["# Source code", "",
             "Every module of the `minipaged` package, with the first line of its docstring. "
             "Chapters link here when they walk through the code.", ""]
    current = None
    for f in sorted((ROOT / "minipaged").rglob("*.py")):
        if SKIP_PARTS & set(f.parts):
            continue
        rel = f.relative_to(ROOT).as_posix()
        folder = f.parent.relative_to(ROOT).as_posix()
        if folder != current:
            lines += ["", f"## `{folder}/`", ""]
            current = folder
        page = site.site_path_for(rel)
        summary = module_summary(f)
        lines.append(f"- [`{f.name}`]({posix_rel(page, 'code/index.md')})" + (f": {summary}" if summary else ""))
    return "\n".join(lines) + "\n"


def assemble(chapters: list[Chapter], notebook_files: dict[Path, Path]) -> tuple[Site, list]:
    if SRC.exists():
        shutil.rmtree(SRC)
    SRC.mkdir(parents=True)
    site = Site(chapters)

    readme = ROOT / "README.md"
    if readme.exists():
        site.add_markdown("README.md", "index.md")
    else:
        log("README.md is missing: the home page is a generated chapter list")
        site.add_markdown("README.md", "index.md", text=generated_home(chapters))

    nav: list = [{"Home": "index.md"}]
    for ch in chapters:
        items = []
        if ch.folder is not None:
            for f in sorted(ch.folder.rglob("*")):
                if f.is_file() and not SKIP_PARTS & set(f.parts):
                    rel = f.relative_to(ROOT).as_posix()
                    if f.name == "README.md" and f.parent == ch.folder:
                        site.add_markdown(rel, f"chapters/{ch.folder.name}/index.md")
                    elif f.suffix == ".md":
                        site.add_markdown(rel, rel)
                    else:
                        site.add_file(rel)
            items.append({"Chapter text": f"chapters/{ch.folder.name}/index.md"})
            if (ch.folder / "deep-dive.md").exists():  # what the core path leaves for a second reading
                items.append({"Deep dive": f"chapters/{ch.folder.name}/deep-dive.md"})
        for nb in ch.notebooks:
            rel = nb.relative_to(ROOT).as_posix()
            site.pages[rel] = rel  # registered before any link is rewritten; written below
            label = "Notebook" if len(ch.notebooks) == 1 else f"Notebook: {nb.stem}"
            items.append({label: rel})
        nav.append({ch.title: items} if len(items) > 1 else {ch.title: next(iter(items[0].values()))})

    for page in sorted(PAGES.glob("*.md")) if PAGES.exists() else []:
        site_path = page.name
        site.add_markdown(page.relative_to(ROOT).as_posix(), site_path)
        entry = {first_heading(page.read_text(encoding="utf-8")) or page.stem: site_path}
        if page.name == FIRST_PAGE:
            nav.insert(1, entry)  # right after Home, before the chapters
        else:
            nav.append(entry)

    if STYLESHEETS.exists():
        shutil.copytree(STYLESHEETS, SRC / "stylesheets")

    (SRC / "code").mkdir(exist_ok=True)
    (SRC / "code" / "index.md").write_text(code_index(site), encoding="utf-8")
    site.pages["minipaged/"] = "code/index.md"  # a link to the package folder lands on the source index
    nav.append({"Source code": "code/index.md"})

    for ch in chapters:
        for nb in ch.notebooks:
            rel = nb.relative_to(ROOT).as_posix()
            site.write_notebook(notebook_files[nb], rel, rel)
    site.finish()
    return site, nav


def draw_figures() -> None:
    """Run each figure script into the assembled pages (SRC), over the committed PNGs copied there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for script in FIGURE_SCRIPTS:
        t0 = time.perf_counter()
        result = subprocess.run([sys.executable, str(script), "--out-dir", str(SRC)], cwd=ROOT, env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise BuildError(f"{rel(script)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        log(f"{rel(script)}: figures drawn into {rel(SRC)} in {time.perf_counter() - t0:.0f} s")


def write_config(nav: list) -> Path:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config["docs_dir"] = str(SRC)
    config["site_dir"] = str(SITE)
    config["nav"] = nav
    for plugin in config.get("plugins", []):
        if isinstance(plugin, dict) and "mkdocs-jupyter" in plugin:
            plugin["mkdocs-jupyter"]["cache_dir"] = str(BUILD / "mkdocs-jupyter-cache")
    path = BUILD / "mkdocs.yml"
    path.write_text("# Generated by docs/build.py from ../../mkdocs.yml; edit that file instead.\n"
                    + yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python docs/build.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--skip-execute", action="store_true",
                   help="do not execute notebooks: use outputs cached by an earlier build, else render them as is")
    p.add_argument("--only", action="append", metavar="NN", default=None,
                   help="execute only the notebooks of chapter NN (repeatable); others as with --skip-execute")
    p.add_argument("--check-notebooks", action="store_true",
                   help="only execute the notebooks (never reusing the cache, but refreshing it; no site); "
                        "exit 1 on the first error")
    p.add_argument("--force", action="store_true", help="execute notebooks even when their cached run is current")
    p.add_argument("--timeout", type=int, default=600, help="seconds allowed per notebook cell (default: 600)")
    p.add_argument("--serve", action="store_true", help="after building, serve the site on 127.0.0.1:8000")
    p.add_argument("--skip-figures", action="store_true",
                   help="do not draw chapters 06-11's figures again; the site shows the committed ones")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    chapters = discover()
    notebooks = [nb for ch in chapters for nb in ch.notebooks]
    only = {n.zfill(2) for n in args.only} if args.only else None
    if only:
        unknown = only - {ch.number for ch in chapters}
        if unknown:
            log(f"error: --only {sorted(unknown)}: no such chapter; found {[ch.number for ch in chapters]}")
            return 2
    log(f"found {sum(ch.folder is not None for ch in chapters)} chapter texts and {len(notebooks)} notebooks")

    try:
        if notebooks and not (args.skip_execute and not args.check_notebooks):
            prepare_kernel()
        if args.check_notebooks:
            for ch in chapters:
                if only and ch.number not in only:
                    continue
                for nb in ch.notebooks:
                    log(f"{nb.relative_to(ROOT)}: executing ...")
                    executed, seconds = execute_notebook(nb, args.timeout)
                    write_executed(nb, executed)  # for python -m minipaged.lab.notebooks store
                    log(f"{nb.relative_to(ROOT)}: ok in {seconds:.0f} s")
            log(f"all notebooks ran in {time.perf_counter() - t_start:.0f} s")
            return 0

        notebook_files = {}
        for ch in chapters:
            mode = "execute" if not args.skip_execute and (only is None or ch.number in only) else "cached-or-raw"
            for nb in ch.notebooks:
                notebook_files[nb] = notebook_for_site(nb, mode, args.timeout, args.force)

        site, nav = assemble(chapters, notebook_files)
        for w in dict.fromkeys(site.warnings):  # each once, in order
            log(f"warning: {w}")
        broken = [w for w in site.warnings if "broken link" in w]
        if broken:
            raise BuildError(f"{len(broken)} broken link(s); see the warnings above")
        if not args.skip_figures:
            draw_figures()
        config = write_config(nav)
        log(f"assembled {sum(1 for _ in SRC.rglob('*.md'))} pages in {SRC.relative_to(ROOT)}; running mkdocs")
        t0 = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config)],
                                cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        if result.returncode != 0:
            raise BuildError("mkdocs build --strict failed (see its messages above)")
        log(f"mkdocs built the site in {time.perf_counter() - t0:.0f} s")
    except BuildError as e:
        log(f"FAILED: {e}")
        return 1
    log(f"done in {time.perf_counter() - t_start:.0f} s: open {SITE.relative_to(ROOT)}/index.html")
    if args.serve:
        subprocess.run([sys.executable, "-m", "mkdocs", "serve", "--config-file", str(config)], cwd=ROOT,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
