"""The chapter's notebook: its hand-written prompt lookup still matches the package, and it runs top to bottom."""

import random
from pathlib import Path

import pytest

from minipaged.spec import propose_ngram

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "09_speculative-decoding.ipynb"


@pytest.mark.parametrize("seed", range(8))
def test_notebook_prompt_lookup_matches_the_package(rederive, seed):
    by_hand = rederive(NOTEBOOK)["propose_by_hand"]
    rng = random.Random(seed)
    for _ in range(50):
        ids = [rng.randrange(3) for _ in range(rng.randint(0, 30))]  # a small alphabet: many repeats
        k, max_n = rng.randint(1, 6), rng.randint(1, 5)
        min_n = rng.randint(1, max_n)
        assert by_hand(ids, k, max_n, min_n) == propose_ngram(ids, k, max_n, min_n)


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(run_notebook):
    text = run_notebook(NOTEBOOK)
    assert "guess:    sat on the" in text
    assert "the package agrees: True" in text
    assert "emit [5, 6, 7, 8]" in text and "emit [5, 9]" in text and "emit [4]" in text
    assert "after the check:          8 tokens" in text
    assert "same tokens: True" in text
