"""Chapter 07: prefix caching. Full blocks are found again by their content, across requests.

Many requests start alike (a system prompt, few-shot examples, a conversation's earlier turns), so
their first blocks hold the same K/V. As an operating system's page cache keeps a file's pages after
the reader exits, this keeps full blocks after their sequence ends, named by what they hold:

    key(block i) = (hash(key(block i - 1)), the block_size token ids of block i)       key(-1) = None

The parent's key is part of the name because the same tokens after another prefix have other K/V.
The map is keyed by the pair itself, so a lookup compares the token ids exactly.

    allocate(seq_id, ..., token_ids=ids)   the blocks the cache knows, from the start, join the table
                                           (reference + 1) and count as computed; at least one prompt
                                           token is left to compute, for the first output's logits
    append_slots / commit_tokens           a prompt's full blocks enter the cache once they have slots;
                                           blocks filled by generated tokens once their K/V is written
    free(seq_id)                           a cached block nobody holds waits on an LRU list, findable,
                                           and counts as free memory
    reset_cache()                          forget everything cached

A prompt's blocks are findable as soon as their slots are planned ("promised"), so prompts admitted
in the same step share a system prompt computed once: the forward pass writes every new token's K/V
before any attention reads it. A sequence freed before its prompt was written takes its promises back.
Free blocks are handed out plain ones first, then cached ones, least recently used first
(``evictions`` counts them); a sequence frees its blocks last first, so a prompt's end is evicted
before the beginning others share. A cached block is full and never written (chapter 05's
copy-on-write guards the rest), so a hit gives the same K/V bits as computing it again.

Not handled: salts in the key (LoRA, multi-modal), caching across processes. With chunked prefill
(chapter 08) a prompt's promises come a chunk per step.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from minipaged.kv.base import NoFreeMemory, blocks_for
from minipaged.kv.block_table import BlockTable
from minipaged.kv.shared import RefCountedBlockPool, SharedPolicy

BlockKey = tuple  # (hash of the parent's key or None, token ids of the block)


def next_key(parent: BlockKey | None, block_tokens) -> BlockKey:
    """The key of a full block holding ``block_tokens``, after the block whose key is ``parent``."""
    return (hash(parent) if parent is not None else None, tuple(block_tokens))


def block_keys(token_ids, block_size: int, parent: BlockKey | None = None, start: int = 0) -> list[BlockKey]:
    """Keys of the full blocks of ``token_ids`` from block ``start`` on (``parent``: block start-1's key)."""
    # exercise 07.1: begin
    keys = []
    for i in range(start, len(token_ids) // block_size):
        parent = next_key(parent, token_ids[i * block_size:(i + 1) * block_size])
        keys.append(parent)
    return keys
    # exercise 07.1: end


class PrefixBlockPool(RefCountedBlockPool):
    """A reference-counted pool that remembers what its full blocks hold.

    Free memory is two lists: blocks that hold nothing anyone can find (taken first) and cached
    blocks nobody holds (in LRU order, evicted when the first list is empty). ``num_free`` counts both.
    """

    caches_blocks = True

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self._block_of: dict[BlockKey, int] = {}  # the cache: key -> block
        self._key_of: dict[int, BlockKey] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, count 0; oldest first
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return super().num_free + len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._block_of)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def lookup(self, key: BlockKey) -> int | None:
        return self._block_of.get(key)

    def key_of(self, block: int) -> BlockKey | None:
        return self._key_of.get(block)

    def register(self, block: int, key: BlockKey) -> bool:
        """Make a held, full block findable by key. False if another block already holds that content
        (two sequences computed it side by side); then this one stays private."""
        if self._refs[block] == 0:
            raise RuntimeError(f"block {block} is free; only a held block can enter the cache")
        if key in self._block_of or block in self._key_of:
            return False
        self._block_of[key], self._key_of[block] = block, key
        return True

    def unregister(self, block: int) -> None:
        """Forget what a held block holds (its K/V was promised but will never be written)."""
        if self._refs[block] == 0:
            raise RuntimeError(f"block {block} is free; only a held block can leave the cache this way")
        del self._block_of[self._key_of.pop(block)]

    def reuse(self, block: int) -> None:
        """One more holder for a cached block, which may be sitting on the LRU list."""
        if self._refs[block] == 0:
            del self._evictable[block]
        self._refs[block] += 1

    def forget_all(self) -> int:
        """Empty the cache: no block can be found any more; the unheld ones become plain free blocks.
        Returns how many blocks were forgotten."""
        forgotten = len(self._block_of)
        for block in self._evictable:
            self._refs[block] = 1  # so that the parent's release puts it on the plain free list
            super().release([block])
        self._evictable.clear()
        self._block_of.clear()
        self._key_of.clear()
        return forgotten

    def take(self, n: int) -> list[int]:
        if n > self.num_free:
            raise NoFreeMemory(f"{n} blocks wanted, {self.num_free} free")
        # exercise 07.2: begin
        plain = min(n, super().num_free)
        blocks = super().take(plain)
        for _ in range(n - plain):  # the least recently used cached blocks give up their content
            block, _ = self._evictable.popitem(last=False)
            del self._block_of[self._key_of.pop(block)]
            self._refs[block] = 1
            self.evictions += 1
            blocks.append(block)
        return blocks
        # exercise 07.2: end

    def release(self, blocks: list[int]) -> None:
        # exercise 07.2: begin
        for block in blocks:
            if self._refs[block] == 0:
                raise RuntimeError(f"block {block} is released twice")
            if self._refs[block] == 1 and block in self._key_of:
                self._refs[block] = 0
                self._evictable[block] = None  # most recently used: evicted last
            else:
                super().release([block])
        # exercise 07.2: end

    def is_free(self, block: int) -> bool:
        return super().is_free(block) or block in self._evictable

@dataclass
class PrefixTable(BlockTable):
    token_ids: list[int] = field(default_factory=list)  # the tokens whose K/V is written, in order
    keys: list[BlockKey] = field(default_factory=list)  # key of each full block, in order
    registered: int = 0  # full blocks offered to the cache so far


class PrefixCachingPolicy(SharedPolicy):
    name = "prefix_caching"
    pool_class = PrefixBlockPool
    caches_prefixes = True
    promise = "planned"  # a prompt's full block is findable once its slots are: or "admitted", or "written"
    evict_last_block_first = True  # a freed table's blocks join the LRU list last block first

    def __init__(self, num_slots: int, block_size: int = 16, max_model_len: int = 2048,
                 watermark: float = 0.01, pool: PrefixBlockPool | None = None):
        super().__init__(num_slots, block_size=block_size, max_model_len=max_model_len, watermark=watermark, pool=pool)
        self.stats.update({"queries": 0, "query_tokens": 0, "hit_tokens": 0, "hit_blocks": 0,
                           "blocks_registered": 0})

    @property
    def evictions(self) -> int:
        return self.pool.evictions

    def hit_rate(self) -> float:
        """Prompt tokens found in the cache / prompt tokens looked up, since the policy was made."""
        return self.stats["hit_tokens"] / self.stats["query_tokens"] if self.stats["query_tokens"] else 0.0

    # ---- lookup -------------------------------------------------------------------------------

    def _hits(self, token_ids) -> tuple[list[int], list[BlockKey]]:
        """The cached blocks that begin token_ids, in order, and their keys (the last prompt token
        is never served from the cache: its logits are needed)."""
        # exercise 07.3: begin
        blocks, keys, parent, bs = [], [], None, self.block_size
        for i in range((len(token_ids) - 1) // bs):
            key = next_key(parent, token_ids[i * bs:(i + 1) * bs])
            block = self.pool.lookup(key)
            if block is None:
                break
            blocks.append(block)
            keys.append(key)
            parent = key
        return blocks, keys
        # exercise 07.3: end

    def cached_prefix_tokens(self, token_ids) -> int:
        """How many leading tokens of token_ids ``allocate`` would take from the cache now."""
        return len(self._hits(token_ids)[0]) * self.block_size

    # ---- admission ----------------------------------------------------------------------------

    def can_allocate(self, prompt_len: int, max_new_tokens: int, final_len: int | None = None,
                     token_ids=None) -> bool:
        slots = self._check_never_fits(prompt_len, max_new_tokens, final_len)
        if token_ids is None:
            return self._fits_now(slots)
        hits, _ = self._hits(token_ids)
        return self._fits_now(slots - self._hit_slots_held(hits))

    def _hit_slots_held(self, hits: list[int]) -> int:
        """Slots of the hits that cost no free memory: those someone holds already (an evictable
        hit is taken off the free lists, so it counts against free memory like a fresh block)."""
        return sum(self.pool.ref_count(b) > 0 for b in hits) * self.block_size

    def allocate(self, seq_id, prompt_len: int, max_new_tokens: int, final_len: int | None = None,
                 token_ids=None) -> None:
        """Admit a sequence. With its token_ids, the longest cached prefix of whole blocks is taken
        from the cache and counted as computed (``num_tokens(seq_id)`` says how many tokens)."""
        if token_ids is None:
            super().allocate(seq_id, prompt_len, max_new_tokens, final_len)
            self._seqs[seq_id] = PrefixTable(**vars(self._seqs[seq_id]))
            return
        token_ids = list(token_ids)
        if len(token_ids) != prompt_len:
            raise ValueError(f"token_ids has {len(token_ids)} ids but prompt_len={prompt_len}")
        slots = self._check_never_fits(prompt_len, max_new_tokens, final_len)
        if seq_id in self._seqs:
            raise ValueError(f"seq_id={seq_id!r} is already allocated; free it first")
        hits, keys = self._hits(token_ids)
        if not self._fits_now(slots - self._hit_slots_held(hits)):
            raise NoFreeMemory(f"{self.label}: seq {seq_id!r} needs {slots // self.block_size - len(hits)} new "
                               f"block(s) beside {len(hits)} cached; {self.pool.num_free} free")
        for block in hits:  # first, so that taking the fresh blocks cannot evict them
            self.pool.reuse(block)
        fresh = self.pool.take(blocks_for(prompt_len, self.block_size) - len(hits))
        cached = len(hits) * self.block_size
        final = final_len if final_len is not None else prompt_len + max_new_tokens
        keys += block_keys(token_ids, self.block_size, keys[-1] if keys else None, start=len(hits))
        self._seqs[seq_id] = PrefixTable(prompt_len, max_new_tokens, final, num_tokens=cached, blocks=hits + fresh,
                                         token_ids=token_ids[:cached], keys=keys, registered=len(hits))
        self.stats["queries"] += 1
        self.stats["query_tokens"] += prompt_len
        self.stats["hit_tokens"] += cached
        self.stats["hit_blocks"] += len(hits)
        if self.promise == "admitted":
            self._register(self._seqs[seq_id], len(keys))

    # ---- filling the cache ------------------------------------------------------------------

    def append_slots(self, seq_id, n: int) -> list[int]:
        slots = super().append_slots(seq_id, n)
        if self.promise == "planned":
            table = self._seqs[seq_id]
            self._register(table, min(len(table.keys), table.num_tokens // self.block_size))
        return slots

    def _register(self, table: PrefixTable, upto: int) -> None:
        """Offer the table's full blocks registered .. upto-1 to the cache (their keys are known)."""
        for i in range(table.registered, upto):
            self.stats["blocks_registered"] += self.pool.register(table.blocks[i], table.keys[i])
        table.registered = max(table.registered, upto)

    def commit_tokens(self, seq_id, token_ids) -> None:
        """The engine has written the K/V of these tokens (the next ones of the sequence): every block
        that is now full enters the cache."""
        table = self._state(seq_id)
        if len(table.token_ids) + len(token_ids) > table.num_tokens:
            raise ValueError(f"seq {seq_id!r}: {len(table.token_ids) + len(token_ids)} tokens committed but only "
                             f"{table.num_tokens} have slots")
        table.token_ids.extend(token_ids)
        full = len(table.token_ids) // self.block_size
        if len(table.keys) < full:
            parent = table.keys[-1] if table.keys else None
            table.keys += block_keys(table.token_ids, self.block_size, parent, start=len(table.keys))
        self._register(table, full)

    # ---- the rest of the life of a table ----------------------------------------------------

    def fork(self, parent_id, child_id, **kwargs) -> None:
        super().fork(parent_id, child_id, **kwargs)
        parent, child = self._state(parent_id), self._seqs[child_id]
        self._seqs[child_id] = PrefixTable(**vars(child), token_ids=list(parent.token_ids), keys=list(parent.keys),
                                           registered=parent.registered)

    def attach(self, seq_id, table: BlockTable) -> None:
        """Back from swap space in fresh blocks: they hold the same content, so they may enter the
        cache again (unless the original blocks are still cached) at the next commit."""
        if not isinstance(table, PrefixTable):
            raise ValueError(f"{self.name!r} can only take back a PrefixTable, got {type(table).__name__}")
        table.registered = 0
        super().attach(seq_id, table)

    def truncate(self, seq_id, num_tokens: int) -> None:
        """Only tokens not yet written may be forgotten (chapter 09's rejected drafts): a written or
        promised block may already be someone else's cache hit."""
        table = self._state(seq_id)
        least = max(len(table.token_ids), table.registered * self.block_size)
        if isinstance(num_tokens, int) and num_tokens < least:
            raise ValueError(f"seq {seq_id!r}: num_tokens={num_tokens} would forget written or promised tokens; "
                             f"it must be in [{least}, {table.num_tokens}] ({len(table.token_ids)} written, "
                             f"{table.registered} blocks in the cache)")
        super().truncate(seq_id, num_tokens)

    def detach(self, seq_id) -> BlockTable:
        table = self._state(seq_id)
        if len(table.token_ids) < table.num_tokens:  # its promised blocks would leave, still unwritten
            raise RuntimeError(f"seq {seq_id!r} has {table.num_tokens - len(table.token_ids)} token(s) planned but "
                               "not written; swap a sequence out before its step is planned, not after")
        return super().detach(seq_id)

    def free(self, seq_id) -> None:
        """Give back everything the sequence holds (the default policy's ``free``, in one place): a
        block it promised but never wrote leaves the cache first; then each block loses a holder, last
        block first, and a cached one nobody holds waits on the LRU list, findable (PrefixBlockPool)."""
        table, bs = self._state(seq_id), self.block_size
        promised = [table.blocks[i] for i in range(len(table.token_ids) // bs, table.registered)
                    if self.pool.key_of(table.blocks[i]) == table.keys[i]]
        if any(self.pool.ref_count(block) > 1 for block in promised):
            raise RuntimeError(f"seq {seq_id!r} promised blocks it never wrote, and another sequence counts "
                               "them as computed; free that sequence first")
        for block in promised:
            self.pool.unregister(block)
        del self._seqs[seq_id]
        self.pool.release(table.blocks[::-1] if self.evict_last_block_first else table.blocks)
        self._drop_dead_copies()  # chapter 05's pending copies into blocks now free

    def reset_cache(self) -> int:
        """Forget every cached block (a cold start, for benchmarks; vLLM's ``reset_prefix_cache``).
        Running sequences keep their blocks; those they fill from now on are cached as usual.
        Returns how many blocks were forgotten."""
        return self.pool.forget_all()

    def num_cached_blocks(self) -> int:
        return self.pool.num_cached
