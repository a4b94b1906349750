"""How long each chapter's core path is to read: its words outside code and folded blocks.

A chapter's README is its core path: the idea, an analogy, a worked example, the code, one
measurement and a summary. What a student may skip on a first reading is folded (``<details>``:
the answers, the derivations) or lives on the chapter's deep-dive page (``chapters/NN_*/deep-dive.md``).
The budget is 4,500 words, about 30 minutes at the 150 words a minute that the time table in
docs/pages/about.md assumes for technical text with code beside it.

    python -m minipaged.lab.reading          a table: words in the core path, in folded blocks, in code,
                                             on the deep-dive page, and the minutes the core path takes

What is counted as a word: a run of letters or digits in prose, a table, a heading or inline code.
What is not: fenced code blocks (indented ones too), ``<details>`` blocks (however deeply nested), HTML
comments and tags, link targets and image paths.

Not handled: code marked by indentation alone (the chapters fence theirs), notebooks (their reading
time is the syllabus's estimate), words a figure shows.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from minipaged.lab.records import chapter_pages, chapters

CORE_WORD_BUDGET = 4500
WORDS_PER_MINUTE = 150

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’.,-]*")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Counts:
    core: int  # words a student reads on the core path
    folded: int  # words inside <details> blocks
    code: int  # words inside code blocks
    deep_dive: int  # words on the chapter's deep-dive page, counted the same way as core

    @property
    def minutes(self) -> int:
        return round(self.core / WORDS_PER_MINUTE)


def _words(text: str) -> int:
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)  # images: neither alt text nor path
    text = re.sub(r"\]\([^)]*\)", "]", text)  # links: keep the text, drop the target
    text = re.sub(r"<[^>]+>", " ", text)  # tags
    return len(_WORD.findall(text))


def count(markdown: str) -> Counts:
    """Split one page into core, folded and code words."""
    markdown = re.sub(r"<!--.*?-->", " ", markdown, flags=re.S)
    core = folded = code = 0
    depth = 0  # how many <details> are open
    fence = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            fence = not fence
            continue
        if fence:
            code += _words(line)
            continue
        opens, closes = line.count("<details"), line.count("</details>")
        inside = depth > 0 or opens > 0
        depth = max(0, depth + opens - closes)
        if inside:
            folded += _words(line)
        else:
            core += _words(line)
    return Counts(core, folded, code, 0)


def chapter_counts(folder: Path) -> Counts:
    readme, *deep = chapter_pages(folder)  # README.md, then deep-dive.md where there is one
    counts = count(readme.read_text())
    for page in deep:
        d = count(page.read_text())
        counts.deep_dive += d.core + d.folded
    return counts


def table() -> str:
    rows = ["| chapter | core path | minutes | folded | code | deep dive |", "|---|---|---|---|---|---|"]
    for folder in chapters():
        c = chapter_counts(folder)
        over = " (over)" if c.core > CORE_WORD_BUDGET else ""
        rows.append(f"| {folder.name} | {c.core:,}{over} | {c.minutes} | {c.folded:,} | {c.code:,} | {c.deep_dive:,} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m minipaged.lab.reading", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    print(table())
    print(f"\ncore path budget: {CORE_WORD_BUDGET:,} words, about {CORE_WORD_BUDGET // WORDS_PER_MINUTE} minutes "
          f"at {WORDS_PER_MINUTE} words a minute")


if __name__ == "__main__":
    main()
