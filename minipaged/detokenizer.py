"""Incremental detokenization: turn a stream of generated token ids into text a client can be shown.

Decoding every output id again after each new token, and searching the whole text for stop strings,
is quadratic in the output's length. ``IncrementalDetokenizer`` gives the same text (``.text`` equals
``tokenizer.decode(ids)`` cut at the earliest stop string) with work proportional to each new token:

- decoding: text before the offset ``read`` is committed; each step decodes the window
  ``ids[prefix:]`` and removes the text of ``ids[prefix:read]``. New text that ends in U+FFFD (half a
  UTF-8 character) stays pending until the next token completes it.
- stop strings: a new match must end in the new text, so only its last len(new) + max_stop_len - 1
  characters are searched.
- streaming: ``stream_text`` / ``delta()`` hold back a trailing partial character and, until the end,
  the last max_stop_len - 1 characters, which a stop string could still cut; ``finish()`` releases them.

vLLM's vllm/v1/engine/detokenizer.py uses the same two offsets and ``stop_buffer_length``.

Not handled yet: tokenizers whose window decode needs more context than one committed chunk
(SentencePiece's leading spaces; an assertion fires), ``spaces_between_special_tokens``, and long runs
of tokens that each end in U+FFFD (the window grows until a clean token arrives).
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Per-sequence text state. `add(token_id)` after each sampled token; `finish()` when it ends."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True, stop=(), include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = [stop] if isinstance(stop, str) else list(stop or ())
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError(f"stop={stop!r}: expected non-empty strings")
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.hold_back = 0 if include_stop_str_in_output or not self.stop else self.max_stop_len - 1
        self.token_ids: list[int] = []
        self.stop_reason: str | None = None  # the stop string that ended the text, if any
        self.finished = False
        self._prefix = 0  # ids[prefix:read]: context for the window decode; its text is _prefix_text
        self._read = 0  # ids[:read] are committed: their text is _committed
        self._prefix_text = ""
        self._committed = ""
        self._pending = ""  # text of ids[read:], ends in U+FFFD (or is empty)
        self._final: str | None = None  # the text once cut at a stop string
        self._floor: int | None = None  # where a stop string may start: after the first min_tokens tokens' text
        self._sent = 0  # characters returned by delta() so far

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int, check_stop: bool = True) -> str | None:
        """Feed one generated token. Returns the stop string if the text now holds one (the text is
        then cut and the detokenizer finished), else None. ``check_stop=False`` (before min_tokens)
        looks for none, and once stop strings count, only one that starts after the text of the
        tokens fed before then can end the text: the output keeps at least min_tokens tokens' text."""
        if self._final is not None:
            raise RuntimeError("add() after a stop string ended the text")
        if check_stop and self._floor is None:  # min_tokens tokens exist: a stop string may start here
            self._floor = len(self._committed)
        self.token_ids.append(token_id)
        searched = len(self._committed)  # everything before this was searched for stop strings already
        window = self._decode(self.token_ids[self._prefix:])
        assert window.startswith(self._prefix_text), "window decode disagrees with its context; not byte-level?"
        new = window[len(self._prefix_text):]
        if new.endswith(REPLACEMENT):
            self._pending = new  # a partial character: the next token may complete it
        else:
            self._committed += new
            self._pending = ""
            self._prefix, self._read = self._read, len(self.token_ids)
            self._prefix_text = self._decode(self.token_ids[self._prefix:self._read])
        return self._check_stop(searched) if self.stop and check_stop else None

    def _check_stop(self, searched: int) -> str | None:
        start = max(self._floor, searched - self.max_stop_len + 1)
        tail = self._committed[start:] + self._pending
        hits = [(tail.find(s), s) for s in self.stop if s in tail]
        if not hits:
            return None
        at, s = min(hits)  # earliest position, ties broken as Sequence breaks them
        cut = start + at + (len(s) if self.include_stop_str_in_output else 0)
        self._final = (self._committed + self._pending)[:cut]
        self.stop_reason, self.finished = s, True
        return s

    @property
    def text(self) -> str:
        """The full output text so far: decode(token_ids), cut at a stop string once one is found."""
        return self._final if self._final is not None else self._committed + self._pending

    def _stream_len(self) -> int:
        """How many characters of `text` a client may be shown now."""
        # exercise 11.1: begin
        if self.finished:
            return len(self.text)
        return max(0, len(self._committed) - self.hold_back)
        # exercise 11.1: end

    def safe_text(self) -> str:
        """The prefix of `text` that may be streamed now: no trailing partial character and, until the
        request ends, not the characters a later stop string could still cut."""
        return self.text[: self._stream_len()]

    stream_text = property(safe_text)

    def finish(self) -> None:
        """The sequence ended (any reason): release the held-back text and any trailing U+FFFD."""
        self.finished = True

    def delta(self) -> str:
        """The streamable text added since the last call; all deltas joined after finish() == text.

        Invariant: the streamable text only grows (committed text is never re-decoded, and a stop cut
        falls at or after len(committed) - hold_back), so each delta extends what was shown before."""
        # exercise 11.1: begin
        end = self._stream_len()
        assert end >= self._sent, "streamed text would be taken back"
        source = self.text if self.finished else self._committed  # avoid joining the pending text
        out, self._sent = source[self._sent:end], end
        return out
        # exercise 11.1: end
