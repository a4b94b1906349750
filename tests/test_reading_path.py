"""The course's reading path: each chapter's core path fits its budget, and what it leaves out is linked.

The word counter (minipaged/lab/reading.py) is tested on a page whose counts are known; then every
chapter's README.md, its core path, is held to about 30 minutes of reading, and a chapter with a
deep-dive page links to it (and the page back to the chapter).
"""
from __future__ import annotations

import re

import pytest

from minipaged.lab import reading

PAGE = """# Title words

Two words. <!-- a comment of seven words is not read -->

```python
x = 1  # code is counted apart
```

    ```
    a fenced block inside a list
    ```

- a list item
    its continuation line

| a | table |
|---|---|

[link text](../some/where.md) ![an image](fig.png)

<details markdown="1"><summary>Answer</summary>

Folded words here.

</details>
"""


def test_the_counter_reads_prose_and_leaves_code_and_folded_blocks_apart():
    counts = reading.count(PAGE)
    # Title words / Two words. / a list item / its continuation line / a table / link text
    assert counts.core == 2 + 2 + 3 + 3 + 2 + 2
    assert counts.folded == 1 + 3  # "Answer" in the summary, then "Folded words here."
    assert counts.code == 6 + 6  # "x 1 code is counted apart", then the fence inside the list


@pytest.mark.parametrize("folder", reading.chapters(), ids=lambda p: p.name)
def test_each_core_path_reads_in_about_30_minutes(folder):
    counts = reading.chapter_counts(folder)
    assert counts.core <= reading.CORE_WORD_BUDGET, (
        f"{folder.name}/README.md holds {counts.core:,} words outside code and folded blocks, over the "
        f"{reading.CORE_WORD_BUDGET:,} of a 30-minute core path: move the rest to {folder.name}/deep-dive.md "
        f"(python -m minipaged.lab.reading counts them)")


@pytest.mark.parametrize("folder", reading.chapters(), ids=lambda p: p.name)
def test_the_syllabus_reading_time_agrees_with_the_words(folder):
    """about.md's time table (the catalog's estimates) at the rate it states: core path and code walk."""
    from minipaged.lab.exercises.catalog import all_chapters

    listed = {t.folder: t.reading for t in all_chapters()}[folder.name]
    counts = reading.chapter_counts(folder)
    needed = (counts.core + counts.code) / reading.WORDS_PER_MINUTE
    assert needed <= listed <= needed + 15, (
        f"{folder.name}: the catalog lists {listed} min of reading; its core path and code take "
        f"{needed:.0f} min at {reading.WORDS_PER_MINUTE} words a minute (edit reading = in "
        f"minipaged/lab/exercises/catalog/ch{folder.name[:2]}.toml, then python -m minipaged.lab.exercises render)")


@pytest.mark.parametrize("folder", reading.chapters(), ids=lambda p: p.name)
def test_a_deep_dive_is_linked_both_ways(folder):
    deep = folder / "deep-dive.md"
    if not deep.exists():
        return
    assert "deep-dive.md" in (folder / "README.md").read_text(), f"{folder.name}/README.md never links its deep dive"
    assert "README.md" in deep.read_text(), f"{folder.name}/deep-dive.md never links back to the chapter"


@pytest.mark.parametrize("folder", reading.chapters(), ids=lambda p: p.name)
def test_each_chapter_opens_with_what_it_needs_and_needs_no_later_chapter(folder):
    lines = [line for line in (folder / "README.md").read_text().splitlines() if line.strip()]
    assert lines[0].startswith(f"# {folder.name[:2]} "), f"{folder.name}: the first line is not the title"
    assert lines[1].startswith("**Needs:**"), f"{folder.name}: the line after the title should say what it needs"
    needed = [int(n) for n in re.findall(r"\b(\d\d)\b", lines[1])]
    later = [n for n in needed if n >= int(folder.name[:2])]
    assert not later, f"{folder.name} needs chapters {later}, which come after it (or are itself)"


def test_every_notebook_carries_the_outputs_of_its_current_code():
    """A student reading a notebook on a forge sees what each cell printed (minipaged/lab/notebooks.py)."""
    from minipaged.lab import notebooks

    problems = notebooks.check()
    assert not problems, ("stale or missing notebook outputs; run python docs/build.py --check-notebooks "
                          f"and python -m minipaged.lab.notebooks store: {problems}")


def test_the_outputs_check_catches_an_edited_code_cell(tmp_path, monkeypatch):
    import json

    from minipaged.lab import notebooks

    nb = {"cells": [{"cell_type": "code", "source": ["print(1)"], "outputs": [], "execution_count": 1,
                     "metadata": {}}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    nb["metadata"][notebooks.KEY] = {"code_sha256": notebooks.code_hash(nb), "commit": "x"}
    (tmp_path / "a.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(notebooks, "NOTEBOOKS", tmp_path)
    assert notebooks.check() == []
    nb["cells"][0]["source"] = ["print(2)"]
    (tmp_path / "a.ipynb").write_text(json.dumps(nb))
    assert "changed" in notebooks.check()[0]
