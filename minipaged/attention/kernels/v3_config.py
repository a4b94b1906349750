"""v3's compile-time shape, and the model that says where it should beat v1/v2 (pure Python, no numba).

v3 (v3_wide.py) reads the cache as 8-byte words. A key's row of ``head_dim`` values is
``words_per_row`` words; a *lane group* of ``lanes`` neighbouring threads owns one key at a time,
each lane ``words_per_lane`` words of it, and keeps its slice of every query row and of every output
row in registers. ``V3Config.for_shape`` picks the sizes (chosen with ptxas's register counts, see
chapter 10):

    fp16, head_dim 64:   16 words a row;  8 lanes x 2 words (16 B a lane); 2 keys a group per step
    fp16, head_dim 128:  32 words a row; 32 lanes x 1 word;                 4 keys a group per step
    fp32 likewise by bytes: 256-byte rows take 32 lanes x 1 word, 512-byte rows 32 lanes x 2 words

so that each lane has 4 words of K and 4 of V in flight per step. Rows (query heads of one GQA group,
times query tokens) are a compile-time count too, ``rows``: the group itself for decode; for
multi-token queries as many as keep the query slices, the accumulators (rows x elems_per_lane each)
and the scores (rows x unroll) in registers.

The split (``v3_partitions``) is sized by the SM count: enough blocks for ``WAVES`` waves of the
blocks an SM holds at once (``BLOCKS_PER_SM_CLAIMED``, the occupancy the design claims and the
resource test checks), never partitions shorter than ``MIN_PARTITION_TOKENS``.

Not handled yet: rows that are not a whole number of 8-byte words (fp16 head dims that are not
multiples of 4); rows wider than 32 lanes x 8 words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WORD_BYTES = 8              # every K, V and q load is one 8-byte word: 4 fp16 values or 2 fp32
THREADS = 128               # 4 warps per block on a GPU
WORDS_IN_FLIGHT = 4         # K words (and as many V words) each lane loads per step, before using any
ROW_VALUES = 32             # query values (rows x elems_per_lane) a thread keeps in registers
SCORES = 16                 # scores (rows x unroll) a thread keeps in registers
MIN_PARTITION_TOKENS = 256  # never split a context into pieces shorter than this
WAVES = 4                   # aim for this many waves of resident blocks: the last wave's tail is small
# What the design claims (chapter 10, "v3") for decode at the chapter's two shapes (SmolLM2: head_dim
# 64, GQA 3; Llama-3-8B: 128, GQA 4), fp16 and fp32, and test_v3_resources.py checks against ptxas:
# at most 128 registers a thread, so 4 blocks of 128 threads fit an SM's 65,536 registers: 16 warps
# of 64, occupancy 25%.
BLOCKS_PER_SM_CLAIMED = 4
OCCUPANCY_CLAIMED = BLOCKS_PER_SM_CLAIMED * THREADS / 2048
ITEMSIZE = {"float16": 2, "float32": 4}


@dataclass(frozen=True)
class V3Config:
    head_dim: int
    block_size: int
    dtype: str                 # "float16" or "float32": how many values a word holds
    rows: int                  # query rows per block (compile-time: unrolled loops over registers)
    lanes: int                 # threads sharing one key (a power of two dividing 32)
    num_threads: int = THREADS
    unroll: int = 2
    reduce: str = "shuffle"    # the dot product's sum across lanes: "shuffle" (GPU) or "shared" (simulator)

    def __post_init__(self):
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"dtype={self.dtype!r}; v3 takes {sorted(ITEMSIZE)}")
        if self.reduce not in ("shuffle", "shared"):
            raise ValueError(f"reduce={self.reduce!r}; choose 'shuffle' or 'shared'")
        if min(self.head_dim, self.block_size, self.rows, self.lanes, self.num_threads, self.unroll) <= 0:
            raise ValueError(f"V3Config needs positive sizes, got {self}")
        if (self.head_dim * ITEMSIZE[self.dtype]) % WORD_BYTES:
            raise ValueError(f"head_dim={self.head_dim} in {self.dtype} is not a whole number of "
                             f"{WORD_BYTES}-byte words")
        if 32 % self.lanes or self.num_threads % 32 or self.words_per_row % self.lanes:
            raise ValueError(f"lanes={self.lanes} must divide 32 and words_per_row={self.words_per_row}; "
                             f"num_threads={self.num_threads} a multiple of 32")

    @property
    def elems_per_word(self) -> int:
        return WORD_BYTES // ITEMSIZE[self.dtype]

    @property
    def words_per_row(self) -> int:
        return self.head_dim // self.elems_per_word

    @property
    def words_per_lane(self) -> int:
        return self.words_per_row // self.lanes

    @property
    def elems_per_lane(self) -> int:
        return self.words_per_lane * self.elems_per_word

    @property
    def lane_groups(self) -> int:
        """Keys a block works on side by side."""
        return self.num_threads // self.lanes

    @property
    def step_keys(self) -> int:
        """Keys a block reads in one step of its loop: every lane group's `unroll` keys."""
        return self.lane_groups * self.unroll

    @classmethod
    def for_shape(cls, head_dim: int, dtype: str, group: int, max_query_len: int = 1, block_size: int = 16,
                  simulator: bool = False) -> V3Config:
        """The sizes v3 uses for a batch; simulator=True: one warp and a shared-memory reduction."""
        itemsize = ITEMSIZE.get(dtype)
        if itemsize is None or (head_dim * itemsize) % WORD_BYTES:
            raise ValueError(f"v3 needs rows of whole {WORD_BYTES}-byte words: head_dim={head_dim}, "
                             f"dtype={dtype!r}")
        words = head_dim * itemsize // WORD_BYTES
        lanes = min(32, words) if words >= 32 else largest_power_of_two_dividing(max(1, words // 2), 32)
        while words % lanes:
            lanes //= 2
        words_per_lane = words // lanes
        unroll = max(1, WORDS_IN_FLIGHT // words_per_lane)
        rows = rows_per_block(group, max_query_len, words_per_lane * WORD_BYTES // itemsize, unroll)
        if simulator:
            return cls(head_dim, block_size, dtype, rows, lanes, num_threads=32, unroll=unroll, reduce="shared")
        return cls(head_dim, block_size, dtype, rows, lanes, unroll=unroll)


def largest_power_of_two_dividing(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= cap and n % (p * 2) == 0:
        p *= 2
    return p


def rows_per_block(group: int, max_query_len: int, elems_per_lane: int, unroll: int) -> int:
    """Decode: the GQA group (every query head of a KV head in one block), up to the cap. Several
    query tokens: up to the cap, which keeps rows x elems_per_lane within ROW_VALUES and rows x unroll
    within SCORES registers (at least one row)."""
    cap = max(1, min(ROW_VALUES // elems_per_lane, SCORES // unroll))
    return max(1, min(group * max_query_len, cap)) if max_query_len > 1 else max(1, min(group, cap))


def v3_supported(head_dim: int, dtype: str) -> bool:
    """Whether v3 can take these rows (whole 8-byte words, at most 32 lanes x 2 words)."""
    itemsize = ITEMSIZE.get(dtype)
    return itemsize is not None and (head_dim * itemsize) % WORD_BYTES == 0 and \
        head_dim * itemsize // WORD_BYTES <= 32 * 8


def v3_partitions(num_work_units: int, max_context_len: int, step_keys: int, num_sms: int,
                  blocks_per_sm: int = BLOCKS_PER_SM_CLAIMED) -> tuple[int, int]:
    """(num_partitions, partition_tokens) for v3: WAVES waves of resident blocks, pieces of at least
    MIN_PARTITION_TOKENS keys, each a whole number of steps (so a lane group's keys of a step share
    one KV block)."""
    target = WAVES * blocks_per_sm * num_sms
    most = max(1, max_context_len // MIN_PARTITION_TOKENS)
    parts = max(1, min(most, math.ceil(target / max(num_work_units, 1))))
    tokens = math.ceil(math.ceil(max_context_len / parts) / step_keys) * step_keys
    return parts, max(tokens, step_keys)


# The model behind kernel="auto" (config.plan_launch). Decode attention time ~ bytes read / bandwidth
# reached. Bandwidth reached, as a share of the datasheet: v1 2.9% and v2 8.3% were measured on the
# H200 at the target shape (chapter 10's record); v3's is the chapter's prediction. Bytes read:
# each block re-reads its sequence's K and V, so the cache is read once per row tile.
SHARE_OF_PEAK = {"v1": 0.029, "v2": 0.083, "v3": 0.40}


def predicted_cost(kernel: str, row_tiles: int, share: dict | None = None) -> float:
    """Time in units of (one read of the cache at full bandwidth): row_tiles / share of peak."""
    return row_tiles / (share or SHARE_OF_PEAK)[kernel]


def v3_wins(v3_row_tiles: int, old_row_tiles: int, old_kernel: str, share: dict | None = None) -> bool:
    """True when the model predicts v3 faster than the v1/v2 choice on the same batch."""
    return predicted_cost("v3", v3_row_tiles, share) < predicted_cost(old_kernel, old_row_tiles, share)
