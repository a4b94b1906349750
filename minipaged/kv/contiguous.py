"""Chapter 01: one contiguous slab per request, placed first-fit in a single arena.

This is how servers managed KV memory before paging. The pool is one arena of ``num_slots`` token
slots. When a request is admitted it reserves one contiguous slab, sized by a reservation rule
("max", "pow2" or "oracle", see ``reservation_tokens``), at the lowest address where it fits
(first fit). Its tokens fill the slab from the start; the slab is returned whole when it finishes.

Three kinds of waste show up, each measured by ``usage()``:
    reserved   slots the request will fill later but nobody else may use meanwhile,
    internal   slots past the request's real end that it never fills (over-reservation),
    external   holes between slabs, each too small for the next request, although together
               they would hold it: a request is refused while the total free memory would fit it.

The arena has ``block_size == 1``: its "block table" is simply the list of slots the tokens occupy,
so the paged attention functions can read it like any other cache.

Not handled: moving slabs to close holes (compaction), growing a slab in place.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

from minipaged.kv.base import KVPolicy, ReservationExceeded, SequenceState

RESERVATION_RULES = ("max", "pow2", "oracle")  # how much a reserving policy sets aside (chapters 01-03)


def next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def reservation_tokens(rule: str, prompt_len: int, max_new_tokens: int, final_len: int | None,
                       max_model_len: int) -> int:
    """How many token slots a reserving policy sets aside at admission (the Orca variants).

    "max"     the model's maximum length, whatever the request: what a server without any
              knowledge of the output must do.
    "pow2"    the next power of two of prompt_len + max_new_tokens (at most max_model_len): an
              allocator that rounds sizes up, over-reserving by less than 2x.
    "oracle"  exactly the final length (prompt + real output): impossible in practice, the best a
              reserving design could ever do. Without final_len, prompt_len + max_new_tokens.
    """
    # exercise 01.1: begin
    if rule == "max":
        return max_model_len
    if rule == "pow2":
        return min(next_power_of_two(prompt_len + max_new_tokens), max_model_len)
    if rule == "oracle":
        return final_len if final_len is not None else prompt_len + max_new_tokens
    raise ValueError(f"reservation={rule!r} is not known; choose one of {list(RESERVATION_RULES)}")
    # exercise 01.1: end


@dataclass
class Slab(SequenceState):
    start: int = 0  # first slot of the slab
    size: int = 0  # slots reserved


class ContiguousArena(KVPolicy):
    name = "contiguous"

    def __init__(self, num_slots: int, max_model_len: int = 2048, reservation: str = "max"):
        super().__init__(num_slots, block_size=1, max_model_len=max_model_len)
        reservation_tokens(reservation, 1, 1, None, max_model_len)  # ValueError for an unknown rule
        self.reservation = reservation
        self._slabs: list[tuple[int, int]] = []  # (start, size) of every slab, sorted by start
        self._holes_cache: list[tuple[int, int]] | None = None  # recomputed only after a change

    @property
    def label(self) -> str:
        return f"{self.name}({self.reservation})"

    # ---- sizes and placement -----------------------------------------------------------------

    def _slots_needed(self, prompt_len, max_new_tokens, final_len) -> int:
        return reservation_tokens(self.reservation, prompt_len, max_new_tokens, final_len,
                                  self.max_model_len)

    def holes(self) -> list[tuple[int, int]]:
        """Free regions as (start, size), in address order."""
        # exercise 01.2: begin
        if self._holes_cache is None:
            holes, cursor = [], 0
            for start, size in self._slabs:
                if start > cursor:
                    holes.append((cursor, start - cursor))
                cursor = start + size
            if cursor < self.num_slots:
                holes.append((cursor, self.num_slots - cursor))
            self._holes_cache = holes
        return self._holes_cache
        # exercise 01.2: end

    def _first_fit(self, slots: int) -> int | None:
        """Start of the lowest hole that holds ``slots`` slots, or None."""
        for start, size in self.holes():
            if size >= slots:
                return start
        return None

    def _largest_hole(self) -> int:
        return max((size for _, size in self.holes()), default=0)

    def _fits_now(self, slots: int) -> bool:
        return self._first_fit(slots) is not None

    def _place(self, seq_id, state: SequenceState, slots: int) -> Slab:
        start = self._first_fit(slots)
        insort(self._slabs, (start, slots))
        self._holes_cache = None
        return Slab(state.prompt_len, state.max_new_tokens, state.final_len, start=start, size=slots)

    def _release(self, slab: Slab) -> None:
        i = bisect_left(self._slabs, (slab.start, slab.size))
        del self._slabs[i]
        self._holes_cache = None

    def _occupied_slots(self, slab: Slab) -> int:
        return slab.size

    def num_free_slots(self) -> int:
        return self.num_slots - sum(size for _, size in self._slabs)

    # ---- tokens ------------------------------------------------------------------------------

    def can_append_slots(self, seq_id, n: int = 1) -> bool:
        slab = self._check_append(seq_id, n)
        return slab.num_tokens + n <= slab.size

    def append_slots(self, seq_id, n: int) -> list[int]:
        slab = self._check_append(seq_id, n)
        if slab.num_tokens + n > slab.size:
            raise ReservationExceeded(f"seq {seq_id!r} has {slab.num_tokens} tokens in a slab of "
                                      f"{slab.size}; {n} more do not fit")
        first = slab.start + slab.num_tokens
        slab.num_tokens += n
        return list(range(first, first + n))

    def block_table(self, seq_id) -> list[int]:
        slab = self._state(seq_id)
        return list(range(slab.start, slab.start + slab.num_tokens))

    def allocated_blocks(self, seq_id) -> range:
        slab = self._state(seq_id)
        return range(slab.start, slab.start + slab.size)  # blocks are slots here

    def check_invariants(self) -> None:
        self._holes_cache = None  # recompute from the slabs rather than trust the cache
        slabs = sorted((s.start, s.size) for s in self._seqs.values())
        assert slabs == self._slabs, f"slab index {self._slabs} disagrees with the sequences {slabs}"
        cursor = 0
        for seq_id, slab in self._seqs.items():
            assert 0 <= slab.num_tokens <= slab.size, (
                f"seq {seq_id!r} holds {slab.num_tokens} tokens in a slab of {slab.size}")
        for start, size in self._slabs:
            assert size >= 1, f"empty slab at {start}"
            assert start >= cursor, f"slab at {start} overlaps the slab ending at {cursor}"
            cursor = start + size
        assert cursor <= self.num_slots, f"a slab ends at {cursor}, past the arena end {self.num_slots}"
        used = sum(size for _, size in self._slabs)
        free = sum(size for _, size in self.holes())
        assert used + free == self.num_slots, f"owned {used} + free {free} != total {self.num_slots}"
