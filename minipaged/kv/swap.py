"""Chapter 06: swap space, a second pool of KV blocks in CPU memory for preempted sequences.

When the device pool runs dry mid-decode, a scheduler can preempt a request by *swapping* it: every
block its sequences hold is copied to a free block of this CPU pool, the device blocks are freed,
and later, when the device has room again, the blocks are copied back (into whatever device blocks
are free then) and the request carries on exactly where it stopped. Nothing is recomputed; the price
is the copying, twice, over the bus between the two memories.

This module keeps only the books, like every policy: which CPU block holds which sequence's logical
block. It returns the block copies to make, and the runner moves the K/V (runner.py). It
never touches the device pool: the scheduler takes the tables out of the KV policy and puts them
back, and hands them over here:

    can_swap_out(policy, seq_ids) -> bool       room here for every block the sequences hold?
    swap_out(tables) -> [(dev, cpu)]            tables the policy let go of (policy.detach) live here
    blocks_to_resume(appends)                   device blocks a swap-in and the next step's tokens take
    tables_of(seq_ids) -> {seq_id: table}       what to hand back to the policy (policy.attach_swapped)
    swap_in(seq_ids, to_device) -> [(cpu, dev)] forget them once the policy has them back

A request's sequences move together. Blocks that several of them share (parallel samples share the
prompt, chapter 05) are copied **once** and stay shared on both sides: this pool counts references
like the device pool does, so a block held by three sequences is one CPU block with count 3, and one
device block with count 3 again after the swap-in. Sharing saves swap traffic as well as memory.

The copies must happen in the engine in this order, before the forward pass writes anything:
swap-outs (device -> CPU), swap-ins (CPU -> device), then copies on write. A device block freed by a
swap-out can be handed to someone else in the same step; its old contents leave first.

Works with the block-table policies (block_table, on_demand, shared, prefix_caching): they declare
``can_swap``, let go of a sequence's blocks (``detach``) and take a swapped table back into fresh
blocks (``attach_swapped``). The scheduler calls this module; it changes the device pool only
through those two calls. It counts nothing: the scheduler counts the swaps (scheduler/continuous.py).
Not handled: partial swapping (a request moves
whole), swapping to disk; with a prefix cache (chapter 07), a block that other requests still hold
is copied out and back in anyway, into a block of its own, so that sharing is lost after a swap.
"""

from __future__ import annotations

from minipaged.kv.base import blocks_for
from minipaged.kv.block_table import relocate
from minipaged.kv.shared import RefCountedBlockPool


def swap_blocks_for(args, policy) -> int:
    """CPU blocks of the swap space a configuration asks for (0: none), for the scheduler's books and
    the runner's tensors alike."""
    return args.swap_tokens // policy.block_size if policy.can_swap else 0


class SwapSpace:
    def __init__(self, num_blocks: int, block_size: int):
        self.pool = RefCountedBlockPool(num_blocks)
        self.num_blocks, self.block_size = num_blocks, block_size
        self._tables: dict = {}  # seq_id -> BlockTable whose blocks are CPU block numbers

    def holds(self, seq_id) -> bool:
        return seq_id in self._tables

    def seq_ids(self) -> list:
        return list(self._tables)

    def num_tokens(self, seq_id) -> int:
        """Tokens whose K/V the swapped-out sequence has here."""
        return self._tables[seq_id].num_tokens

    def blocks_to_swap_out(self, policy, seq_ids) -> int:
        """Distinct device blocks the sequences hold (a shared one counts once)."""
        return len({b for s in seq_ids for b in policy.allocated_blocks(s)})

    def can_swap_out(self, policy, seq_ids) -> bool:
        return self.blocks_to_swap_out(policy, seq_ids) <= self.pool.num_free

    def swap_out(self, tables: dict) -> list[tuple[int, int]]:
        """Keep these tables ({seq_id: table}, as ``policy.detach`` returned them) here. Returns the
        (device block, CPU block) copies to make, one per distinct device block. Raises ValueError
        (nothing changed) if this pool is too small (``can_swap_out`` asks first)."""
        if any(self.holds(s) for s in tables):
            raise ValueError(f"some of seq_ids={list(tables)!r} are swapped out already")
        needed = len({b for t in tables.values() for b in t.blocks})
        if needed > self.pool.num_free:
            raise ValueError(f"swap space has {self.pool.num_free} free blocks; these sequences hold {needed}")
        new_tables, to_cpu = relocate(tables, self.pool)
        self._tables.update(new_tables)  # whatever else a table records, kept
        return list(to_cpu.items())

    def blocks_to_swap_in(self, seq_ids) -> int:
        return len({b for s in seq_ids for b in self._tables[s].blocks})

    def blocks_to_resume(self, appends) -> int:
        """Device blocks that swapping these sequences in *and* appending ``n`` tokens to each
        ``(seq_id, n)`` would take: the distinct blocks, the new blocks the tokens grow into, and a
        copy on write for each shared block a token is written into (as ``SharedPolicy.blocks_needed``
        counts them; the reference counts here are those the device blocks will have)."""
        blocks, growth, writers = set(), 0, {}
        for seq_id, n in appends:
            table = self._tables[seq_id]
            blocks.update(table.blocks)
            growth += max(0, blocks_for(table.num_tokens + n, self.block_size) - len(table.blocks))
            if n:
                first = table.num_tokens // self.block_size
                last = min((table.num_tokens + n - 1) // self.block_size, len(table.blocks) - 1)
                for b in table.blocks[first:last + 1]:
                    writers[b] = writers.get(b, 0) + 1
        copies = sum(min(w, self.pool.ref_count(b) - 1) for b, w in writers.items())
        return len(blocks) + growth + copies

    def can_swap_in(self, policy, seq_ids) -> bool:
        return self.blocks_to_swap_in(seq_ids) <= policy.num_free_blocks

    def tables_of(self, seq_ids) -> dict:
        """The swapped tables of these sequences ({seq_id: table whose blocks are CPU blocks})."""
        return {seq_id: self._tables[seq_id] for seq_id in seq_ids}

    def swap_in(self, seq_ids, to_device: dict[int, int]) -> list[tuple[int, int]]:
        """The policy has taken these sequences back (``policy.attach_swapped`` returned
        ``to_device``, {CPU block: device block}): forget them here. Returns the (CPU block, device
        block) copies to make."""
        for seq_id in seq_ids:
            self.pool.release(self._tables.pop(seq_id).blocks)
        return list(to_device.items())

    def drop(self, seq_id) -> None:
        """Forget a swapped-out sequence and give its CPU blocks back (an aborted request)."""
        self.pool.release(self._tables.pop(seq_id).blocks)

    def check_invariants(self) -> None:
        """A CPU block's count equals the tables here that hold it; nothing else is held."""
        self.pool.check_invariants()
        holders: dict[int, int] = {}
        for table in self._tables.values():
            for block in table.blocks:
                holders[block] = holders.get(block, 0) + 1
        wrong = [(b, n, self.pool.ref_count(b)) for b, n in holders.items() if self.pool.ref_count(b) != n]
        assert not wrong, f"swap space: (block, tables holding it, reference count) disagree: {wrong[:8]}"
        assert len(holders) + self.pool.num_free == self.num_blocks, "swap space: a CPU block leaked"
