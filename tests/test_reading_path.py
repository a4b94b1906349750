"""The course's reading path: each chapter's core path fits its budget, and what it leaves out is linked.

The word counter (minipaged/lab/reading.py) is tested on a page whose counts are known; then every
chapter's README.md, its core path, is held to about 30 minutes of reading, and a chapter with a
deep-dive page links to it (and the page back to the chapter).
"""
from __future__ import annotations

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
def test_a_deep_dive_is_linked_both_ways(folder):
    deep = folder / "deep-dive.md"
    if not deep.exists():
        return
    assert "deep-dive.md" in (folder / "README.md").read_text(), f"{folder.name}/README.md never links its deep dive"
    assert "README.md" in deep.read_text(), f"{folder.name}/deep-dive.md never links back to the chapter"
