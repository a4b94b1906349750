"""The chapter's notebook: its hand-written block keys still match the package, and it runs top to bottom."""

import random
from pathlib import Path

import pytest

from minipaged.kv.prefix_cache import block_keys

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "07_prefix-caching.ipynb"


@pytest.mark.parametrize("seed", range(8))
def test_notebook_block_keys_match_the_package(rederive, seed):
    by_hand = rederive(NOTEBOOK)["keys_by_hand"]
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    ids = [rng.randrange(3) for _ in range(rng.randint(0, 70))]  # a small alphabet: repeated blocks
    assert by_hand(ids, block_size) == block_keys(ids, block_size)
    keys = block_keys(ids, block_size)
    for start in range(len(keys) + 1):  # a walk that starts in the middle, from the previous block's key
        parent = keys[start - 1] if start else None
        assert by_hand(ids, block_size, parent, start) == block_keys(ids, block_size, parent, start) == keys[start:]


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(run_notebook):
    text = run_notebook(NOTEBOOK)
    assert "same tokens: True" in text
    assert "same tokens, same key after a different prefix? False" in text
    assert "findable after the rollback: 0 tokens" in text
    assert "an unbounded cache would serve" in text
