"""Chapter 04: blocks allocated only as tokens arrive.

Same block table as chapter 03, but nothing is reserved ahead. Admission takes the blocks the prompt
needs; after that a sequence takes one more block from the free list each time its last block fills
up. At any moment a sequence holds ``ceil(num_tokens / block_size)`` blocks, so the only unused
slots are the tail of its last block: less than one block per sequence, whatever the request asks for.

The price is that memory is no longer promised: a running sequence may find no free block for its
next token. ``append_slots`` then raises ``NoFreeMemory`` (changing nothing), and the caller must
make room, usually by preempting a sequence (``free`` it and re-admit it later). The simulator does
that; chapter 06's scheduler does it properly.

To make that rarer, admission keeps a small watermark of blocks free (a fraction of the pool, 1% by
default) for the sequences already running, unless the pool is empty.

Not handled: choosing whom to preempt (the caller's job), sharing blocks (chapter 05).
"""

from __future__ import annotations

from minipaged.kv.base import NoFreeMemory, blocks_for
from minipaged.kv.block_table import BlockPool, BlockTable, BlockTablePolicy


class OnDemandPolicy(BlockTablePolicy):
    name = "on_demand"

    def __init__(self, num_slots: int, block_size: int = 16, max_model_len: int = 2048,
                 watermark: float = 0.01, pool: BlockPool | None = None):
        super().__init__(num_slots, block_size=block_size, max_model_len=max_model_len,
                         reservation=None, pool=pool)
        if isinstance(watermark, bool) or not isinstance(watermark, (int, float)) or not 0 <= watermark < 1:
            raise ValueError(f"watermark must be a fraction of the pool in [0, 1), got {watermark!r}")
        self.watermark = watermark
        self.watermark_blocks = int(watermark * self.num_blocks)

    def _slots_needed(self, prompt_len, max_new_tokens, final_len) -> int:
        return blocks_for(prompt_len, self.block_size) * self.block_size  # the prompt only

    def _longest_slots(self, prompt_len, max_new_tokens, final_len) -> int:
        longest = final_len if final_len is not None else prompt_len + max_new_tokens
        return blocks_for(longest, self.block_size) * self.block_size

    def _fits_now(self, slots: int) -> bool:
        # exercise 04.1: begin
        needed = slots // self.block_size
        if not self._seqs:  # nobody to keep a reserve for
            return needed <= self.pool.num_free
        return self.pool.num_free - needed >= self.watermark_blocks
        # exercise 04.1: end

    def _can_grow(self, num_blocks: int) -> bool:
        return num_blocks <= self.pool.num_free

    def _grow(self, seq_id, table: BlockTable, num_blocks: int) -> None:
        # exercise 04.2: begin
        if num_blocks > self.pool.num_free:  # refuse before changing anything
            raise NoFreeMemory(f"seq {seq_id!r} needs {num_blocks} more block(s) for its next tokens; "
                               f"{self.pool.num_free} free")
        table.blocks.extend(self.pool.take(num_blocks))
        # exercise 04.2: end

    def _shrink(self, seq_id, table: BlockTable) -> None:
        """After ``truncate``: keep the blocks the tokens (and the prompt) need, give back the rest,
        last block first (chapter 09's rejected draft tokens)."""
        keep = max(blocks_for(table.num_tokens, self.block_size), blocks_for(table.prompt_len, self.block_size))
        extra = table.blocks[keep:]
        if extra:
            del table.blocks[keep:]
            self.pool.release(extra[::-1])
