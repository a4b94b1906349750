"""Focused checks for chapter 09's graded exercises: the verification loop (``verify``) and prompt
lookup (``propose_ngram``), each against a rule written out here from the chapter's definition."""

import random

import pytest

from minipaged.spec import accept_greedy, propose_ngram, verify


class Rows:
    """A fake forward pass: row j's token is rows[j]; the sequence finishes on the row in `finish_at`.
    Records which rows were asked for, in order."""

    def __init__(self, rows, finish_at=None):
        self.rows, self.finish_at, self.asked = rows, finish_at, []

    def __call__(self, j):
        self.asked.append(j)
        return self.rows[j], j == self.finish_at


def expected_emitted(argmaxes, draft):
    """The chapter's rule: the longest prefix of the draft that agrees with the rows, then one more row."""
    accepted = 0
    while accepted < len(draft) and draft[accepted] == argmaxes[accepted]:
        accepted += 1
    return argmaxes[:accepted + 1]


@pytest.mark.parametrize("rows, draft, asked", [
    ([8], [], [0]),  # no draft: plain decoding, one token
    ([4, 5, 6, 7], [4, 5, 6], [0, 1, 2, 3]),  # every guess right: the bonus row too
    ([3, 5, 6, 7], [4, 5, 6], [0]),  # the first guess wrong: row 0 is the correction
    ([4, 5, 0, 7], [4, 5, 6], [0, 1, 2]),  # the third wrong: two accepted, then the correction
    ([4, 9, 6, 7], [4, 5, 6], [0, 1]),  # a later guess that happens to match does not count
])
def test_verify_asks_for_the_rows_in_order_and_stops_at_the_first_disagreement(rows, draft, asked):
    emit = Rows(rows)
    assert verify(draft, emit) == len(asked)
    assert emit.asked == asked, "rows past the first disagreement were computed on a wrong guess"


def test_verify_stops_as_soon_as_the_sequence_finishes():
    emit = Rows([4, 5, 6, 7], finish_at=0)  # finished on its first token, which was a right guess
    assert verify([4, 5, 6], emit) == 1 and emit.asked == [0]
    emit = Rows([4, 5, 6, 7], finish_at=2)
    assert verify([4, 5, 6], emit) == 3 and emit.asked == [0, 1, 2]
    emit = Rows([4, 5, 6, 7], finish_at=3)  # finished on the bonus token: it still counts
    assert verify([4, 5, 6], emit) == 4 and emit.asked == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", range(5))
def test_accepted_tokens_are_the_longest_agreeing_prefix_and_one_more(seed):
    rng = random.Random(seed)
    for _ in range(300):
        k = rng.randint(0, 6)
        draft = [rng.randrange(3) for _ in range(k)]  # a small alphabet: many right guesses
        argmaxes = [rng.randrange(3) for _ in range(k + 1)]
        assert accept_greedy(argmaxes, draft) == expected_emitted(argmaxes, draft), (argmaxes, draft)


def next_token(context) -> int:
    """A deterministic 'model': the greedy next token of a context."""
    return (sum(context) * 7 + len(context) * 3) % 5


@pytest.mark.parametrize("seed", range(5))
def test_speculative_decoding_gives_the_tokens_of_plain_decoding(seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(5) for _ in range(rng.randint(1, 8))]
    n = 30
    plain = list(prompt)
    while len(plain) < len(prompt) + n:
        plain.append(next_token(plain))
    seq, steps = list(prompt), 0
    while len(seq) < len(prompt) + n:
        steps += 1
        truth = plain[len(seq):len(seq) + 4]  # some guesses right, some wrong
        draft = [t if rng.random() < 0.7 else rng.randrange(5) for t in truth[:rng.randint(0, 4)]]
        base = list(seq)

        def emit(j, base=base, draft=draft):
            # row j was computed on the sequence followed by the first j guesses
            token = next_token(base + draft[:j])
            seq.append(token)
            return token, len(seq) >= len(prompt) + n

        emitted = verify(draft, emit)
        assert 1 <= emitted <= len(draft) + 1 and len(seq) == len(base) + emitted
    assert seq == plain
    assert steps < n, "right guesses should save steps"


@pytest.mark.parametrize("ids, k, max_n, min_n, want", [
    ([], 3, 4, 1, []),  # nothing to look up
    ([7], 3, 4, 1, []),  # one token: no earlier place to find it at
    ([7, 7], 3, 4, 1, [7]),  # the last token appeared just before it
    ([1, 2, 1, 2], 3, 4, 3, []),  # "2 1 2" never appeared before; shorter matches are below min_n
    ([1, 2, 1, 2], 3, 4, 2, [1, 2]),  # "1 2" at 0, followed by 1 2
    ([1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3], 2, 3, 1, [9, 5]),  # the longest match "1 2 3" wins
    ([1, 2, 3, 9, 5, 2, 3, 8, 1, 2, 3], 2, 2, 1, [8, 1]),  # capped at 2: the most recent "2 3"
    ([4, 6, 4, 6, 4, 6], 9, 4, 1, [4, 6]),  # "4 6 4 6" at 0: what follows it, up to the end
    ([5, 0, 1, 2, 0, 1, 3], 4, 4, 1, []),  # "1 3", "3" never came before
])
def test_prompt_lookup_edge_cases(ids, k, max_n, min_n, want):
    assert propose_ngram(ids, k, max_n, min_n) == want


def test_prompt_lookup_takes_any_sequence_and_leaves_it_alone():
    ids = (3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4)
    assert propose_ngram(ids, 3) == [1, 5, 9]  # "3 1 4" came before, followed by 1 5 9
    as_list = list(ids)
    assert propose_ngram(as_list, 3) == [1, 5, 9] and as_list == list(ids)
