"""Compile-time shapes of the numba kernels, and the rules that pick v1, v2 or v3 (pure Python, no numba).

A CUDA kernel sizes its shared memory at compile time, so the numbers below are baked into each
compiled kernel, much as C++ kernels take them as template parameters. ``KernelConfig.for_head_dim``
gives the sizes used on a GPU, ``KernelConfig.for_simulator`` smaller ones for numba's CUDA simulator
(same code, fewer Python threads); tests may build others.

The split rule (``choose_num_partitions``) lives here so it can be read and tested without a GPU:

    v1 (one block per sequence x KV head x row tile) when it already launches enough blocks to fill
    the GPU, or when the context is too short to be worth splitting; otherwise
    v2 (the same blocks, each split into partitions along the context), with just enough
    partitions to reach the target block count, never shorter than MIN_PARTITION_TOKENS each;
    v3 (v3_config.py: its own sizes, its own split) when asked for by name, or by "auto" where its
    model predicts it faster, but only once untested kernels are allowed: "auto" picks only among
    the kernels that have run on a GPU (GPU_TESTED) unless the caller passes allow_untested=True or
    sets MINIPAGED_ALLOW_UNTESTED_KERNELS=1 (scripts/gpu_check.sh does, so a GPU run measures v3).

Every LaunchPlan says in ``reason`` which kernel it chose and why.

Not handled yet: head dims for which max_rows * head_dim is not a multiple of the thread count (powers
of two from 8 up are fine); tiles beyond 48 KiB of static shared memory (dynamic shared memory).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from minipaged.attention.kernels.v3_config import V3Config, v3_partitions, v3_supported, v3_wins

THREADS_PER_BLOCK = 128      # 4 warps: enough to issue many loads at once, small enough to fit several per SM
TILE_ELEMENTS = 2048         # K (and V) elements staged in shared memory per step: tile_tokens * head_dim
MAX_ROWS = 16                # query rows (query tokens x heads of one group) one block serves at once
ACC_SLOTS = 8                # output elements per thread (max_rows * head_dim / threads): kept in registers
MIN_PARTITION_TOKENS = 256   # v2 never splits a context into pieces shorter than this
BLOCKS_PER_SM = 8            # v2 aims for about this many blocks per streaming multiprocessor
LOADS_PER_STEP = 8           # K loads (and as many V loads) per thread in one unrolled run
MAX_STATIC_SHARED_BYTES = 48 * 1024  # what a kernel may declare statically (more needs dynamic shared)
DEFAULT_NUM_SMS = 132        # an H100/H200 has 132; used when the device cannot be asked (the simulator)
# The kernels that have run on a GPU: v1 and v2, on an H200 at commit 771ba89 (chapter 10's gpu_check
# record). kernel="auto" picks among these only, unless untested kernels are allowed (untested_allowed).
GPU_TESTED = frozenset({"v1", "v2"})
ALLOW_UNTESTED_ENV = "MINIPAGED_ALLOW_UNTESTED_KERNELS"  # =1: "auto" may pick v3 too (scripts/gpu_check.sh sets it)


def untested_allowed(allow_untested: bool | None = None) -> bool:
    """Whether kernel="auto" may pick a kernel outside GPU_TESTED: the argument when it is given, else
    whether the environment sets MINIPAGED_ALLOW_UNTESTED_KERNELS=1."""
    if allow_untested is None:
        return os.environ.get(ALLOW_UNTESTED_ENV) == "1"
    return allow_untested


@dataclass(frozen=True)
class KernelConfig:
    head_dim: int
    tile_tokens: int          # keys (and values) loaded into shared memory per step
    num_threads: int = THREADS_PER_BLOCK
    max_rows: int = MAX_ROWS  # query rows per block; more rows -> more blocks along grid z
    block_size: int = 16      # tokens per KV block: a constant, so position -> (block, slot) is a shift

    def __post_init__(self):
        if min(self.head_dim, self.tile_tokens, self.max_rows, self.block_size, self.num_threads) <= 0:
            raise ValueError(f"KernelConfig needs positive sizes, got {self}")
        if self.max_rows > self.num_threads:
            raise ValueError(f"max_rows ({self.max_rows}) must not exceed num_threads ({self.num_threads}): "
                             "the softmax step gives each row one thread")
        if (self.max_rows * self.head_dim) % self.num_threads:
            raise ValueError(f"max_rows * head_dim ({self.max_rows} * {self.head_dim}) must be a multiple "
                             f"of num_threads ({self.num_threads}): each thread owns equal output slots")

        if self.shared_bytes > MAX_STATIC_SHARED_BYTES:
            raise ValueError(f"{self} needs {self.shared_bytes} B of shared memory; static shared arrays "
                             f"stop at {MAX_STATIC_SHARED_BYTES} B: use smaller tiles or max_rows")

    @property
    def chunk_tokens(self) -> int:
        """Tokens loaded per step of a tile's copy loop. A step stays inside one KV block (one
        block-table read), so it divides both the tile and the block; and it is short enough that each
        thread's loads of a step (LOADS_PER_STEP of K and as many of V) unroll into one straight run."""
        cap = max(1, LOADS_PER_STEP * self.num_threads // self.head_dim)
        common = math.gcd(self.tile_tokens, self.block_size)
        return max(c for c in range(1, min(cap, common) + 1) if common % c == 0)

    @property
    def acc_slots(self) -> int:
        """Output elements (row, dim) each thread accumulates in registers."""
        return self.max_rows * self.head_dim // self.num_threads

    @property
    def shared_bytes(self) -> int:
        """Static shared memory of one block, all fp32 (the +1 pads rows against bank conflicts)."""
        padded = self.head_dim + 1
        floats = (self.max_rows * padded          # query rows
                  + 2 * self.tile_tokens * padded  # K and V tiles
                  + self.max_rows * self.tile_tokens  # scores, then probabilities
                  + 4 * self.max_rows)             # running max, running sum, rescale factor, key limit
        return 4 * floats

    @classmethod
    def for_head_dim(cls, head_dim: int, block_size: int = 16) -> KernelConfig:
        """The sizes used on a GPU: about TILE_ELEMENTS per tile, in whole KV blocks when they are
        smaller than that; fewer rows per block for big heads, so the accumulator stays in registers
        and shared memory fits."""
        tile = max(1, TILE_ELEMENTS // head_dim)
        if block_size <= tile:
            tile -= tile % block_size  # whole blocks: one block-table read per block
        # at most ACC_SLOTS output elements per thread, so the accumulator stays in registers
        rows = max(1, min(MAX_ROWS, ACC_SLOTS * THREADS_PER_BLOCK // head_dim))
        while rows > 1 and 4 * (rows + 2 * tile) * (head_dim + 1) > MAX_STATIC_SHARED_BYTES * 0.9:
            rows //= 2
        return cls(head_dim=head_dim, tile_tokens=tile, max_rows=rows, block_size=block_size)

    @classmethod
    def for_simulator(cls, head_dim: int, block_size: int = 16) -> KernelConfig:
        """Smaller sizes for numba's CUDA simulator, which runs one Python thread per CUDA thread.

        The kernel code is the same; one warp and short tiles just make it finish sooner (and cross
        more tile boundaries on short test contexts).
        """
        return cls(head_dim=head_dim, tile_tokens=8, num_threads=32, max_rows=8, block_size=block_size)


def num_row_tiles(max_query_len: int, group: int, max_rows: int = MAX_ROWS) -> int:
    """Blocks along grid z: a sequence's query rows (query tokens x heads of a group), max_rows at a time."""
    return math.ceil(max_query_len * group / max_rows)


def choose_num_partitions(num_work_units: int, max_context_len: int, num_sms: int = DEFAULT_NUM_SMS,
                          tile_tokens: int = 1) -> tuple[int, int]:
    """The v1/v2 rule. Returns (num_partitions, partition_tokens); one partition means v1.

    num_work_units = num_seqs * num_kv_heads * row tiles, the blocks v1 would launch.
    """
    target_blocks = BLOCKS_PER_SM * num_sms
    most_partitions = max_context_len // MIN_PARTITION_TOKENS  # each piece >= MIN_PARTITION_TOKENS
    if num_work_units >= target_blocks or most_partitions <= 1:
        return 1, max_context_len
    wanted = math.ceil(target_blocks / max(num_work_units, 1))
    num_partitions = min(wanted, most_partitions)
    return num_partitions, partition_tokens_for(max_context_len, num_partitions, tile_tokens)


def partition_tokens_for(max_context_len: int, num_partitions: int, tile_tokens: int = 1) -> int:
    """Tokens per partition so that num_partitions cover max_context_len; a whole number of tiles."""
    per_part = math.ceil(max_context_len / num_partitions)
    return math.ceil(per_part / tile_tokens) * tile_tokens


@dataclass(frozen=True)
class LaunchPlan:
    kernel: str             # "v1", "v2" or "v3"
    row_tiles: int          # blocks along grid z per (sequence, KV head) for the query rows
    num_partitions: int     # v2 and v3 (1 for v1)
    partition_tokens: int   # keys per partition (v2, v3); the longest context for v1
    v3: V3Config | None = None  # v3's compile-time sizes
    reason: str = ""        # which kernel was chosen and why, in words

    def grid(self, num_seqs: int, num_kv_heads: int) -> tuple[int, int, int]:
        return (num_seqs, num_kv_heads, self.row_tiles * self.num_partitions)


def plan_launch(num_seqs: int, num_kv_heads: int, group: int, max_query_len: int, max_context_len: int,
                cfg: KernelConfig, num_sms: int = DEFAULT_NUM_SMS, kernel: str = "auto",
                num_partitions: int | None = None, dtype: str = "float32", simulator: bool = False,
                v3: V3Config | None = None, allow_untested: bool | None = None) -> LaunchPlan:
    """Which kernel runs and how its grid is cut; the plan's ``reason`` says why, in words.

    kernel="v1", "v2" or "v3": that kernel. kernel="auto": the v1/v2 rule (choose_num_partitions),
    since v1 and v2 are the kernels that have run on a GPU (GPU_TESTED). Only when untested kernels
    are allowed (allow_untested=True, or None and MINIPAGED_ALLOW_UNTESTED_KERNELS=1 in the
    environment) may "auto" pick v3: where it can run (rows of whole 8-byte words) and the model in
    v3_config predicts it faster than what the rule would launch. The model: a kernel's time is
    (times it reads the cache: its row tiles) / (the share of peak bandwidth it reaches: measured for
    v1 and v2, predicted for v3). v3 holds fewer rows per block than v1/v2 (its rows live in
    registers), so with many query tokens it reads the cache more often; it still wins while that
    factor stays below its predicted bandwidth advantage (about 5x).
    v3: sizes to use instead of V3Config.for_shape's (to try others on a GPU).
    """
    if kernel not in ("auto", "v1", "v2", "v3"):
        raise ValueError(f"kernel={kernel!r}; choose 'auto', 'v1', 'v2' or 'v3'")
    if num_partitions is not None and num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if kernel == "v3" and not v3_supported(cfg.head_dim, dtype):
        raise ValueError(f"kernel='v3' reads rows of whole 8-byte words: head_dim={cfg.head_dim} in {dtype} "
                         "is not; use 'v1', 'v2' or 'auto'")
    row_tiles = num_row_tiles(max_query_len, group, cfg.max_rows)
    old = _plan_v1_v2(num_seqs, num_kv_heads, row_tiles, max_context_len, cfg, num_sms,
                      "auto" if kernel in ("auto", "v3") else kernel, num_partitions)
    if kernel in ("v1", "v2"):
        return old
    if kernel == "auto" and "v3" not in GPU_TESTED and not untested_allowed(allow_untested):
        return replace(old, reason=f"{old.reason} (auto leaves out v3, which has not run on a GPU yet: "
                                   f"pass allow_untested=True or set {ALLOW_UNTESTED_ENV}=1)")
    if not v3_supported(cfg.head_dim, dtype):
        return replace(old, reason=f"{old.reason} (v3 cannot read head_dim {cfg.head_dim} in {dtype} "
                                   "as whole 8-byte words)")
    if v3 is None:
        v3 = V3Config.for_shape(cfg.head_dim, dtype, group, max_query_len, cfg.block_size, simulator)
    elif (v3.head_dim, v3.block_size, v3.dtype) != (cfg.head_dim, cfg.block_size, dtype):
        raise ValueError(f"v3 config has head_dim={v3.head_dim}, block_size={v3.block_size}, dtype={v3.dtype}; "
                         f"the inputs have {cfg.head_dim}, {cfg.block_size}, {dtype}")
    v3_tiles = num_row_tiles(max_query_len, group, v3.rows)
    if kernel == "auto" and not v3_wins(v3_tiles, row_tiles, old.kernel):
        return replace(old, reason=f"{old.reason} (the model in v3_config predicts {old.kernel} faster than v3 here)")
    if num_partitions is None:
        parts, tokens = v3_partitions(num_seqs * num_kv_heads * v3_tiles, max_context_len, v3.step_keys, num_sms)
    else:
        parts = num_partitions
        tokens = partition_tokens_for(max_context_len, parts, v3.step_keys)
    why = "asked for v3" if kernel == "v3" else f"the model in v3_config predicts v3 faster than {old.kernel}" + (
        "" if "v3" in GPU_TESTED else ", and untested kernels are allowed")
    return LaunchPlan("v3", v3_tiles, parts, tokens, v3, reason=f"{why}: {_partitions(parts, tokens)}")


def _plan_v1_v2(num_seqs, num_kv_heads, row_tiles, max_context_len, cfg, num_sms, kernel, num_partitions):
    if kernel == "v1":
        return LaunchPlan("v1", row_tiles, 1, max_context_len, reason="asked for v1")
    blocks = num_seqs * num_kv_heads * row_tiles  # what v1 would launch
    if num_partitions is None:
        num_partitions, part_tokens = choose_num_partitions(blocks, max_context_len, num_sms, cfg.tile_tokens)
        why = _rule_reason(blocks, max_context_len, num_sms, num_partitions, part_tokens)
    else:
        part_tokens = partition_tokens_for(max_context_len, num_partitions, cfg.tile_tokens)
        why = f"{_partitions(num_partitions, part_tokens) if num_partitions > 1 else '1 partition'} asked for"
    if kernel == "auto" and num_partitions == 1:
        return LaunchPlan("v1", row_tiles, 1, max_context_len, reason=f"v1: {why}")
    return LaunchPlan("v2", row_tiles, num_partitions, part_tokens,
                      reason=f"v2: {why}" if kernel == "auto" else f"asked for v2; {why}")


def _rule_reason(blocks: int, max_context_len: int, num_sms: int, num_partitions: int, part_tokens: int) -> str:
    """choose_num_partitions's answer, in words."""
    target = BLOCKS_PER_SM * num_sms
    if blocks >= target:
        return (f"one block per (sequence, KV head, row tile) is already {blocks} blocks, enough to fill the GPU "
                f"({BLOCKS_PER_SM} per SM x {num_sms} SMs = {target})")
    if num_partitions == 1:
        return (f"the longest context ({max_context_len} keys) is shorter than two partitions of "
                f"{MIN_PARTITION_TOKENS}")
    return (f"v1 would launch {blocks} blocks, fewer than {BLOCKS_PER_SM} per SM x {num_sms} SMs = {target}: "
            f"{_partitions(num_partitions, part_tokens)}")


def _partitions(n: int, tokens: int) -> str:
    return f"{n} partition{'s' if n > 1 else ''} of {tokens} keys"
