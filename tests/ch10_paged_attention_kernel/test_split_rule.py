"""The v1/v2 rule and the kernels' compile-time sizes: plain Python, no numba needed."""

import pytest

from minipaged.attention.kernels.config import (
    BLOCKS_PER_SM,
    MIN_PARTITION_TOKENS,
    KernelConfig,
    choose_num_partitions,
    num_row_tiles,
    partition_tokens_for,
    plan_launch,
)


def test_v1_when_the_gpu_is_already_full():
    # batch 256, 3 KV heads: 768 blocks >= 8 per SM on 96 SMs
    assert choose_num_partitions(256 * 3, 8192, num_sms=96) == (1, 8192)


def test_v1_when_the_context_is_too_short_to_split():
    assert choose_num_partitions(3, 2 * MIN_PARTITION_TOKENS - 1, num_sms=132)[0] == 1


def test_v2_splits_just_enough_to_fill_the_gpu():
    # batch 64 x 3 KV heads = 192 blocks for v1; the target is 8 x 132 = 1056 -> 6 partitions
    parts, tokens = choose_num_partitions(192, 2048, num_sms=132, tile_tokens=32)
    assert parts == -(-BLOCKS_PER_SM * 132 // 192) == 6
    assert tokens % 32 == 0 and parts * tokens >= 2048 and tokens >= MIN_PARTITION_TOKENS


def test_v2_never_cuts_pieces_shorter_than_the_minimum():
    parts, tokens = choose_num_partitions(1, 8192, num_sms=132)
    assert parts == 8192 // MIN_PARTITION_TOKENS and tokens == MIN_PARTITION_TOKENS


@pytest.mark.parametrize("ctx,parts,tile", [(1, 1, 8), (200, 3, 8), (8192, 7, 32), (17, 30, 8)])
def test_partitions_cover_the_context(ctx, parts, tile):
    tokens = partition_tokens_for(ctx, parts, tile)
    assert tokens % tile == 0 and tokens * parts >= ctx


def test_row_tiles():
    assert num_row_tiles(1, 3) == 1 and num_row_tiles(1, 16, max_rows=16) == 1
    assert num_row_tiles(17, 4, max_rows=16) == 5  # 68 rows


def test_plan_launch():
    cfg = KernelConfig.for_head_dim(64)
    assert plan_launch(64, 3, 3, 1, 2048, cfg).kernel == "v2"
    assert plan_launch(256, 8, 4, 1, 2048, cfg).kernel == "v1"
    forced = plan_launch(2, 1, 3, 1, 100, cfg, kernel="v2", num_partitions=3)
    assert (forced.kernel, forced.num_partitions, forced.grid(2, 1)) == ("v2", 3, (2, 1, 3))
    assert plan_launch(2, 1, 3, 1, 100, cfg, kernel="v1").grid(2, 1) == (2, 1, 1)
    with pytest.raises(ValueError, match="kernel"):
        plan_launch(1, 1, 1, 1, 1, cfg, kernel="v3")
    with pytest.raises(ValueError, match="num_partitions"):
        plan_launch(1, 1, 1, 1, 1, cfg, kernel="v2", num_partitions=0)


def test_gpu_sizes_fit_static_shared_memory():
    for head_dim in (64, 128):
        cfg = KernelConfig.for_head_dim(head_dim)
        assert cfg.tile_tokens * head_dim == 2048 and cfg.acc_slots * cfg.num_threads == cfg.max_rows * head_dim
        assert cfg.shared_bytes <= 48 * 1024  # numba's shared arrays are static: 48 KiB at most


@pytest.mark.parametrize("block_size", [1, 2, 8, 12, 16, 24, 32, 64])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_copy_steps_stay_inside_one_kv_block(head_dim, block_size):
    for cfg in (KernelConfig.for_head_dim(head_dim, block_size), KernelConfig.for_simulator(head_dim, block_size)):
        chunk = cfg.chunk_tokens
        assert cfg.tile_tokens % chunk == 0 and block_size % chunk == 0
        assert chunk * head_dim <= 8 * cfg.num_threads or chunk == 1  # short enough to unroll


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="max_rows"):
        KernelConfig(head_dim=64, tile_tokens=8, num_threads=8, max_rows=16)
    with pytest.raises(ValueError, match="multiple"):
        KernelConfig(head_dim=20, tile_tokens=8, num_threads=32, max_rows=3)
