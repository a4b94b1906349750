"""What every KV policy shares: the interface, the waste accounting, the errors and the input checks.

A KV policy decides where each sequence's keys and values live in a pool of ``num_slots`` token
slots (slot = ``block * block_size + offset``). The scheduler is the only caller of its mutating
calls: ``allocate`` at admission (with the prompt's ids, so a prefix cache can count what it holds),
``append_slots(seq_id, n)`` for the slots of the next n tokens (the prompt's, then one per step),
``commit_tokens`` once their K/V is written, ``truncate`` to forget rejected draft tokens, ``free``.
It asks first with ``can_allocate`` / ``can_append_slots`` / ``can_append_all``; the runner reads
``block_table``. What a policy supports it declares as class attributes, read and never probed:
``shares_blocks`` (fork and copy-on-write, chapter 05), ``can_fork`` (beam search),
``caches_prefixes`` (chapter 07), ``can_swap`` (chapter 06), ``bounded`` (all but chapter 00's) and
``watermark_blocks`` (chapter 04).

Errors, the same for every policy: ``ValueError`` for nonsense input or a request that can never fit
(the message names the field); ``NoFreeMemory`` for one that would fit an empty pool but not now
(``can_allocate`` returns False instead); ``ReservationExceeded`` when a sequence outgrows what it
reserved (chapters 01-03). A call that raises leaves the books as they were.

Waste accounting (chapter 01). ``usage(head)`` splits the pool into five disjoint parts, in slots:
``tokens`` (holding K/V), ``reserved`` (allocated, and the sequence will still fill them: up to
``final_len`` when known, else prompt_len + max_new_tokens), ``internal`` (allocated past that, never
filled), ``external`` (free, but the request at the head of the queue cannot use them because no
hole is big enough although all of them together would be; always 0 for a paged policy) and
``free``. They add up to ``num_slots``; utilization = tokens / (tokens + reserved + internal).

Not handled here: sharing blocks (kv/shared.py, chapter 05; kv/prefix_cache.py, chapter 07) and the
choice of what to admit or preempt (the scheduler, chapter 06).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass


class NoFreeMemory(RuntimeError):
    """The request would fit in an empty pool, but not in the free memory left now."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ReservationExceeded(RuntimeError):
    """A sequence tried to grow past the room it reserved when it was admitted."""


@dataclass(frozen=True)
class Usage:
    """Where the pool's slots went at one moment (the module docstring names each part)."""

    total: int
    tokens: int
    reserved: int
    internal: int
    external: int
    free: int
    num_seqs: int

    @property
    def occupied(self) -> int:
        return self.tokens + self.reserved + self.internal

    @property
    def utilization(self) -> float:
        return self.tokens / self.occupied if self.occupied else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "occupied": self.occupied, "utilization": self.utilization}


@dataclass
class SequenceState:
    """Bookkeeping every policy keeps per sequence; policies subclass it to add where it lives."""

    prompt_len: int
    max_new_tokens: int
    final_len: int  # the length it will reach: final_len if given, else prompt_len + max_new_tokens
    num_tokens: int = 0


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_request(prompt_len, max_new_tokens, final_len, max_model_len: int) -> None:
    """Reject nonsense sizes and requests longer than the model allows, naming the field."""
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("max_new_tokens", max_new_tokens)
    if prompt_len + max_new_tokens > max_model_len:
        raise ValueError(f"prompt_len + max_new_tokens = {prompt_len} + {max_new_tokens} = "
                         f"{prompt_len + max_new_tokens} exceeds max_model_len={max_model_len}")
    if final_len is not None:
        check_positive_int("final_len", final_len)
        if not prompt_len <= final_len <= prompt_len + max_new_tokens:
            raise ValueError(f"final_len must lie in [prompt_len, prompt_len + max_new_tokens] = "
                             f"[{prompt_len}, {prompt_len + max_new_tokens}], got {final_len}")


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold num_tokens tokens (the last one may be partly filled)."""
    return -(-num_tokens // block_size)


class KVPolicy:
    """Base class: the shared bookkeeping, input checks and waste accounting.

    A subclass says how much it needs for a request (``_slots_needed``), whether that fits now
    (``_fits_now``), how to place and release a sequence (``_place``, ``_release``), where token i of
    a sequence lives (``append_slots``), how many slots a sequence occupies (``_occupied_slots``) and
    how big the largest free hole is (``_largest_hole``).
    """

    name = "base"
    shares_blocks = False  # True for policies with fork / copy-on-write (chapter 05, kv/shared.py)
    caches_prefixes = False  # True when allocate(..., token_ids=) can find cached blocks (chapter 07)
    can_fork = False  # True when fork(parent, child) exists: beam search needs it (chapter 05)
    can_swap = False  # True when detach / attach_swapped exist: preemption by swap (chapter 06)
    bounded = True  # the pool has a size (False only for chapter 00's UnboundedPolicy)
    watermark_blocks = 0  # free blocks admission leaves for growth (chapter 04's on_demand sets it)

    def __init__(self, num_slots: int, block_size: int, max_model_len: int):
        check_positive_int("block_size", block_size)
        check_positive_int("max_model_len", max_model_len)
        check_positive_int("num_slots", num_slots, minimum=block_size)
        self.block_size = block_size
        self.num_blocks = num_slots // block_size
        self.num_slots = self.num_blocks * block_size  # rounded down to whole blocks
        self.max_model_len = max_model_len
        self._seqs: dict[Hashable, SequenceState] = {}

    # ---- what subclasses provide -------------------------------------------------------------

    def _slots_needed(self, prompt_len: int, max_new_tokens: int, final_len: int | None) -> int:
        """Slots taken at admission, rounded up to whole blocks."""
        raise NotImplementedError

    def _longest_slots(self, prompt_len: int, max_new_tokens: int, final_len: int | None) -> int:
        """The most slots this request could ever hold at once (to refuse what can never fit)."""
        return self._slots_needed(prompt_len, max_new_tokens, final_len)

    def _fits_now(self, slots: int) -> bool:
        raise NotImplementedError

    def _place(self, seq_id, state: SequenceState, slots: int) -> SequenceState:
        raise NotImplementedError

    def _release(self, state: SequenceState) -> None:
        raise NotImplementedError

    def _occupied_slots(self, state: SequenceState) -> int:
        raise NotImplementedError

    def _largest_hole(self) -> int:
        """Slots in the largest free region one new request could be placed in."""
        raise NotImplementedError

    def append_slots(self, seq_id, n: int) -> list[int]:
        raise NotImplementedError

    def block_table(self, seq_id) -> list[int]:
        raise NotImplementedError

    def allocated_blocks(self, seq_id) -> Sequence[int]:
        """Every block the sequence holds, in logical order: the block table plus what is reserved
        past its tokens (a ``range`` when the blocks are consecutive)."""
        raise NotImplementedError

    def check_invariants(self) -> None:
        raise NotImplementedError

    # ---- the shared public interface ---------------------------------------------------------

    @property
    def label(self) -> str:
        """A name for tables and plots, e.g. "contiguous(max)"."""
        return self.name

    def seq_ids(self) -> list:
        return list(self._seqs)

    def num_tokens(self, seq_id) -> int:
        return self._state(seq_id).num_tokens

    def num_free_slots(self) -> int:
        return self.num_slots - sum(self._occupied_slots(s) for s in self._seqs.values())

    def _check_never_fits(self, prompt_len, max_new_tokens, final_len) -> int:
        check_request(prompt_len, max_new_tokens, final_len, self.max_model_len)
        longest = self._longest_slots(prompt_len, max_new_tokens, final_len)
        if longest > self.num_slots:
            raise ValueError(f"request (prompt_len={prompt_len}, max_new_tokens={max_new_tokens}) needs "
                             f"{longest} slots under {self.label} but the whole pool has num_slots="
                             f"{self.num_slots}; it can never fit")
        return self._slots_needed(prompt_len, max_new_tokens, final_len)

    def can_allocate(self, prompt_len: int, max_new_tokens: int, final_len: int | None = None) -> bool:
        """True if ``allocate`` would succeed now. ValueError if the request can never fit."""
        return self._fits_now(self._check_never_fits(prompt_len, max_new_tokens, final_len))

    def allocate(self, seq_id, prompt_len: int, max_new_tokens: int, final_len: int | None = None,
                 token_ids=None) -> None:
        """Admit a sequence: reserve what this policy reserves up front. No tokens are written yet.
        ``token_ids`` (the prompt's) only matter to a prefix cache (chapter 07).

        Raises ValueError (bad input, duplicate seq_id, can never fit) or NoFreeMemory (not now).
        """
        slots = self._check_never_fits(prompt_len, max_new_tokens, final_len)
        if seq_id in self._seqs:
            raise ValueError(f"seq_id={seq_id!r} is already allocated; free it first")
        if not self._fits_now(slots):
            raise NoFreeMemory(f"{self.label}: seq {seq_id!r} needs {slots} slots at admission; "
                               f"{self.num_free_slots()} slots are free, the largest usable hole "
                               f"has {self._largest_hole()}")
        final = final_len if final_len is not None else prompt_len + max_new_tokens
        state = SequenceState(prompt_len, max_new_tokens, final)
        self._seqs[seq_id] = self._place(seq_id, state, slots)

    def cached_prefix_tokens(self, token_ids) -> int:
        """Tokens of this prompt whose K/V a prefix cache holds already (chapter 07); 0 here."""
        return 0

    def can_append_slots(self, seq_id, n: int = 1) -> bool:
        """True if ``append_slots(seq_id, n)`` would succeed now (a scheduler asks before a step)."""
        raise NotImplementedError

    def can_append_all(self, appends) -> bool:
        """True if appending n tokens to each (seq_id, n) of ``appends``, in order, would succeed now
        (a scheduler asks this for a whole request before it changes anything)."""
        return all(self.can_append_slots(seq_id, n) for seq_id, n in appends)

    def drain_copies(self) -> list[tuple[int, int]]:
        """Block copies (src, dst) the engine must make in K and V before the next write, oldest first,
        and forget them. Only copy-on-write policies (chapter 05) ever ask for one."""
        return []

    def commit_tokens(self, seq_id, token_ids) -> None:
        """The engine has written the K/V of these next tokens of the sequence. Only a prefix cache
        (chapter 07) needs to know which tokens they were."""

    def truncate(self, seq_id, num_tokens: int) -> None:
        """Forget the sequence's tokens from ``num_tokens`` on, as if they had never been appended
        (chapter 09: the slots of rejected draft tokens). A policy that takes blocks as tokens come
        gives back the blocks past the new end (``_shrink``); a reserving one keeps its reservation."""
        state = self._state(seq_id)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or not 0 <= num_tokens <= state.num_tokens:
            raise ValueError(f"num_tokens={num_tokens!r} must be an integer in [0, {state.num_tokens}] "
                             f"(seq {seq_id!r} has {state.num_tokens} tokens)")
        state.num_tokens = num_tokens
        self._shrink(seq_id, state)

    def _shrink(self, seq_id, state: SequenceState) -> None:
        """Hook: let go of memory past the sequence's (new, shorter) end."""

    def free(self, seq_id) -> None:
        """Give back everything the sequence holds. It may be allocated again later (preemption)."""
        state = self._state(seq_id)
        self._release(state)
        del self._seqs[seq_id]

    def allocated_slots(self, seq_id) -> list[int]:
        """Every slot the sequence holds, in logical order (its tokens first, then unused room)."""
        bs = self.block_size
        return [b * bs + offset for b in self.allocated_blocks(seq_id) for offset in range(bs)]

    def token_slots(self, seq_id) -> list[int]:
        """The physical slot of every token of the sequence, in order (the prefill slot mapping)."""
        table, bs = self.block_table(seq_id), self.block_size
        return [table[i // bs] * bs + i % bs for i in range(self.num_tokens(seq_id))]

    def usage(self, head: tuple[int, int, int | None] | None = None) -> Usage:
        """Where the slots went now. ``head``: (prompt_len, max_new_tokens, final_len) of the request
        at the head of the waiting queue, or None if nothing waits (then external is 0)."""
        # exercise 01.3: begin
        tokens = reserved = internal = 0
        for state in self._seqs.values():
            occupied = self._occupied_slots(state)
            will_fill = min(occupied, max(state.final_len, state.num_tokens))
            tokens += state.num_tokens
            reserved += will_fill - state.num_tokens
            internal += occupied - will_fill
        free_total = self.num_slots - tokens - reserved - internal
        external = 0
        if head is not None:
            need = self._slots_needed(*head)
            if self._largest_hole() < need <= free_total:
                external = free_total
        return Usage(self.num_slots, tokens, reserved, internal, external, free_total - external,
                     len(self._seqs))
        # exercise 01.3: end

    # ---- helpers for subclasses --------------------------------------------------------------

    def _state(self, seq_id) -> SequenceState:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"seq_id={seq_id!r} is not allocated in {self.label}") from None

    def _check_append(self, seq_id, n) -> SequenceState:
        check_positive_int("n", n, minimum=0)
        return self._state(seq_id)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.label}, num_slots={self.num_slots}, "
                f"block_size={self.block_size}, seqs={len(self._seqs)})")
