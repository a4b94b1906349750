"""Chapter 06: incremental detokenization for streaming gives Sequence's text, streams only what stays.

The oracle decodes every id from scratch and cuts at the earliest stop string (the earliest position,
then the first stop string listed); the detokenizer must agree at every step while decoding only a
window.
"""

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.detokenizer import IncrementalDetokenizer
from minipaged.model.random import ByteTokenizer
from minipaged.request import Sequence
from minipaged.sampling_params import SamplingParams

BYTES = ByteTokenizer()
ALPHABET = "ab \n日é😀"  # 1-, 2-, 3- and 4-byte UTF-8 characters


def oracle(tok, ids, stop, include, skip=True):
    text = tok.decode(ids, skip_special_tokens=skip)
    hits = [(text.find(s), s) for s in stop if s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return (text[: at + len(s)] if include else text[:at]), s


def run(tok, ids, stop=(), include=False, skip=True, delta_every=1):
    """Feed ids one by one, checking each step against the oracle; returns (detokenizer, deltas joined)."""
    d = IncrementalDetokenizer(tok, skip_special_tokens=skip, stop=stop, include_stop_str_in_output=include)
    shown = ""
    for i, t in enumerate(ids):
        reason = d.add(t)
        want, want_reason = oracle(tok, ids[: i + 1], stop, include, skip)
        assert d.text == want and reason == want_reason, (i, d.text, want)
        if i % delta_every == 0:
            shown += d.delta()
        # what has been shown is never taken back: it is a prefix of the text now (and so of the final text)
        assert d.text.startswith(shown) and d.text.startswith(d.stream_text)
        assert shown == d.stream_text[: len(shown)]
        if reason is not None:
            assert d.finished and d.stream_text == d.text
            break
    d.finish()
    shown += d.delta()
    assert d.stream_text == d.text == shown
    assert d.delta() == ""
    return d, shown


# A token stream over the byte tokenizer: text split into single bytes (so multi-byte characters span
# several tokens), stray bytes (lone continuation bytes, truncated sequences) and the special tokens.
pieces = st.one_of(
    st.text(alphabet=ALPHABET, max_size=6).map(lambda s: list(s.encode())),
    st.lists(st.integers(0x80, 0xFF), min_size=1, max_size=3),
    st.sampled_from([[256], [257], [258]]),
)
token_ids = st.lists(pieces, max_size=12).map(lambda ps: [t for p in ps for t in p])
stops = st.lists(st.text(alphabet=ALPHABET + "\ufffd", min_size=1, max_size=3), max_size=3)


@settings(max_examples=300, deadline=None)
@given(ids=token_ids, skip=st.booleans(), delta_every=st.integers(1, 4))
def test_random_bytes_text_matches_full_decode(ids, skip, delta_every):
    d, shown = run(BYTES, ids, skip=skip, delta_every=delta_every)
    assert shown == BYTES.decode(ids, skip_special_tokens=skip)


@settings(max_examples=400, deadline=None)
@given(ids=token_ids, stop=stops, include=st.booleans(), skip=st.booleans(), delta_every=st.integers(1, 3))
def test_random_stop_strings_never_stream_past_the_cut(ids, stop, include, skip, delta_every):
    d, shown = run(BYTES, ids, stop, include, skip, delta_every)
    final, reason = oracle(BYTES, ids[: len(d.token_ids)], stop, include, skip)
    assert shown == final and d.stop_reason == reason
    if reason is not None and not include:
        assert reason not in shown


@settings(max_examples=400, deadline=None)
@given(ids=token_ids, include=st.booleans(), skip=st.booleans(), data=st.data())
def test_stop_strings_taken_from_the_text(ids, include, skip, data):
    # stop strings cut out of the text itself, so that most examples do stop (often mid-character)
    text = BYTES.decode(ids, skip_special_tokens=skip)
    spans = st.tuples(st.integers(0, len(text)), st.integers(1, 4)).map(lambda p: text[p[0]:p[0] + p[1]])
    stop = [s for s in data.draw(st.lists(spans, min_size=1, max_size=3)) if s]
    d, shown = run(BYTES, ids, stop, include, skip)
    assert shown == oracle(BYTES, ids[: len(d.token_ids)], stop, include, skip)[0]


@settings(max_examples=200, deadline=None)
@given(ids=token_ids, stop=stops, include=st.booleans(), skip=st.booleans())
def test_same_text_as_sequence(ids, stop, include, skip):
    params = SamplingParams(max_tokens=len(ids) + 1, ignore_eos=True, stop=stop or None,
                            include_stop_str_in_output=include, skip_special_tokens=skip)
    seq = Sequence(0, [1], params, eos_token_id=-1, max_model_len=10_000, tokenizer=BYTES)
    d = IncrementalDetokenizer(BYTES, skip, stop, include)
    for t in ids:
        seq.append(t)
        reason = d.add(t)
        assert d.text == seq.text and reason == seq.stop_reason
        if seq.finished:
            break


def test_hold_back_and_partial_characters():
    d = IncrementalDetokenizer(BYTES, stop=["abc"])
    for t in b"xyab":
        assert d.add(t) is None
    assert d.text == "xyab" and d.stream_text == "xy" and d.delta() == "xy"
    assert d.add(ord("c")) == "abc"
    assert d.text == d.stream_text == "xy" and d.delta() == ""

    d = IncrementalDetokenizer(BYTES, stop=["abc"], include_stop_str_in_output=True)
    for t in b"xyab":
        d.add(t)
    assert d.stream_text == "xyab"  # the cut would fall after "abc": nothing to hold back
    assert d.add(ord("c")) == "abc" and d.text == "xyabc" and d.delta() == "xyabc"

    d = IncrementalDetokenizer(BYTES)
    for t in "a日".encode()[:-1]:
        d.add(t)
    assert d.text == "a\ufffd" and d.safe_text() == "a" and d.delta() == "a"
    d.add("日".encode()[-1])
    assert d.text == d.stream_text == "a日" and d.delta() == "日"
    d.add(0xF0)  # the request ends in the middle of a 4-byte character
    assert d.stream_text == "a日"
    d.finish()
    assert d.stream_text == d.text == "a日\ufffd" and d.delta() == "\ufffd"


def test_stop_string_completed_by_a_partial_character():
    # "ab" is committed and "\ufffd" pending: neither may be shown, the next byte makes "ab日" whole
    d = IncrementalDetokenizer(BYTES, stop=["ab日"])
    for t in b"ab" + "日".encode()[:2]:
        assert d.add(t) is None
    assert d.text == "ab\ufffd" and d.delta() == ""
    assert d.add("日".encode()[2]) == "ab日" and d.text == "" and d.delta() == ""


def test_earliest_stop_string_wins_ties_as_in_sequence():
    d = IncrementalDetokenizer(BYTES, skip_special_tokens=False, stop=["bc", "abc"])
    assert [d.add(t) for t in b"xabc"] == [None, None, None, "abc"] and d.text == "x"
    # one token adds "<|im_end|>": both stop strings start at 0; min() over (position, string) picks "<|im"
    d = IncrementalDetokenizer(BYTES, skip_special_tokens=False, stop=["<|im_end|>", "<|im"])
    assert d.add(ord("x")) is None and d.add(257) == "<|im" and d.text == "x"


class CountingTokenizer:
    def __init__(self, inner):
        self.inner, self.ids_decoded, self.largest = inner, 0, 0

    def decode(self, ids, skip_special_tokens=True):
        self.ids_decoded += len(ids)
        self.largest = max(self.largest, len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("stop", [(), ("never appears here",)])
def test_decode_work_is_linear(stop):
    ids = ("Héllo wörld 日本語 😀🚀, " * 200).encode()[:2000]
    tok = CountingTokenizer(BYTES)
    d = IncrementalDetokenizer(tok, stop=stop)
    shown = ""
    for t in ids:
        d.add(t)
        shown += d.delta()
    d.finish()
    shown += d.delta()
    assert shown == d.text == BYTES.decode(ids)
    assert tok.ids_decoded < 50 * len(ids), tok.ids_decoded  # re-decoding everything: ~2,000,000
    assert tok.largest <= 8  # the window: one committed token of context plus a partial character


@functools.lru_cache(maxsize=1)  # building it takes seconds; a skip is not cached
def smollm_tokenizer():
    from minipaged.model.fetch import find_gguf
    from minipaged.model.gguf_loader import open_gguf
    from minipaged.model.tokenizer import GGUFTokenizer

    path = find_gguf()
    if path is None:
        pytest.skip("SmolLM2-135M GGUF file not on disk (run `minipaged` once to fetch it, or set MINIPAGED_GGUF)")
    return GGUFTokenizer(open_gguf(path))


REAL_TEXTS = [
    "Héllo wörld! Ça va? naïve café, crème brûlée.",
    "Emojis 😀🚀👍🏽 and a family 👨‍👩‍👧‍👦 in a row: 🇫🇷🇯🇵",
    "日本語のテキスト、中文文本和한국어 텍스트。",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "<|im_start|>user\nMixed 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑∫√ text<|im_end|>\n",
]


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", REAL_TEXTS)
def test_smollm_tokenizer_streams_exact_text(text, skip):
    tok = smollm_tokenizer()
    ids = tok.encode(text)
    d, shown = run(tok, ids, skip=skip)
    assert shown == d.text == tok.decode(ids, skip_special_tokens=skip)
    if not skip:
        assert d.text == text


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("stop", [["\n"], ["🚀", "😀"], ["return", "文本"], ["√ t"]])
def test_smollm_tokenizer_stop_strings(stop, include):
    tok = smollm_tokenizer()
    for text in REAL_TEXTS:
        ids = tok.encode(text)
        d, shown = run(tok, ids, stop, include)
        assert shown == oracle(tok, ids[: len(d.token_ids)], stop, include)[0]
