"""The v1/v2 rule, v3's sizes and split, the auto choice (v3 only once untested kernels are allowed) and
the reason each plan gives, and the kernels' compile-time sizes: plain Python, no numba needed."""

import pytest

from minipaged.attention.kernels.config import (
    ALLOW_UNTESTED_ENV,
    BLOCKS_PER_SM,
    GPU_TESTED,
    MIN_PARTITION_TOKENS,
    KernelConfig,
    choose_num_partitions,
    num_row_tiles,
    partition_tokens_for,
    plan_launch,
)
from minipaged.attention.kernels.v3_config import MIN_PARTITION_TOKENS as MIN_V3_TOKENS
from minipaged.attention.kernels.v3_config import V3Config, v3_partitions, v3_supported, v3_wins


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
    assert plan_launch(64, 3, 3, 1, 2048, cfg, kernel="v2").num_partitions == 6  # the v1/v2 rule, as before
    assert plan_launch(256, 8, 4, 1, 2048, cfg, kernel="v2").kernel == "v2"
    assert plan_launch(256, 8, 4, 1, 2048, cfg, kernel="v1").kernel == "v1"
    forced = plan_launch(2, 1, 3, 1, 100, cfg, kernel="v2", num_partitions=3)
    assert (forced.kernel, forced.num_partitions, forced.grid(2, 1)) == ("v2", 3, (2, 1, 3))
    assert plan_launch(2, 1, 3, 1, 100, cfg, kernel="v1").grid(2, 1) == (2, 1, 1)
    with pytest.raises(ValueError, match="kernel"):
        plan_launch(1, 1, 1, 1, 1, cfg, kernel="v9")
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


# v3: its sizes, its split, and where the model in v3_config makes it the auto choice

def test_v3_sizes_at_the_two_shapes():
    smol = V3Config.for_shape(64, "float16", group=3)
    assert (smol.lanes, smol.words_per_lane, smol.unroll, smol.rows, smol.lane_groups) == (8, 2, 2, 3, 16)
    llama = V3Config.for_shape(128, "float16", group=4)
    assert (llama.lanes, llama.words_per_lane, llama.unroll, llama.rows) == (32, 1, 4, 4)
    for cfg in (smol, llama, V3Config.for_shape(128, "float32", 4), V3Config.for_shape(16, "float32", 2)):
        assert cfg.lanes * cfg.words_per_lane * 8 == cfg.head_dim * (2 if cfg.dtype == "float16" else 4)
        assert cfg.words_per_lane * cfg.unroll <= 4 and cfg.rows * cfg.elems_per_lane <= 32


def test_v3_rows_stay_in_registers():
    assert V3Config.for_shape(64, "float16", group=8).rows == 4  # GQA 8: two row tiles of 4
    assert V3Config.for_shape(64, "float16", group=3, max_query_len=9).rows == 4
    assert V3Config.for_shape(64, "float32", group=1, max_query_len=1).rows == 1


def test_v3_partitions_fill_several_waves():
    # the target: 64 x 3 = 192 blocks without a split; 4 waves of 4 x 132 blocks want 11 partitions,
    # but 2,048 keys allow 8 of at least 256 keys
    parts, tokens = v3_partitions(192, 2048, step_keys=32, num_sms=132)
    assert (parts, tokens) == (2048 // MIN_V3_TOKENS, 256)
    # the Llama-3-8B layer: 512 blocks; 2,112 wanted -> 5 partitions of 410 keys, rounded up to 416
    parts, tokens = v3_partitions(512, 2048, step_keys=16, num_sms=132)
    assert parts == 5 and tokens % 16 == 0 and parts * tokens >= 2048
    assert v3_partitions(4096, 2048, 32, 132) == (1, 2048)  # enough blocks already: no split


def test_auto_leaves_out_v3_until_untested_kernels_are_allowed(monkeypatch):
    """v3 has never run on a GPU, so "auto" picks among v1 and v2 (the kernels the GPU record measured)
    unless asked: allow_untested=True, or MINIPAGED_ALLOW_UNTESTED_KERNELS=1 as scripts/gpu_check.sh sets."""
    assert "v3" not in GPU_TESTED and GPU_TESTED == {"v1", "v2"}
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    cfg = KernelConfig.for_head_dim(64)
    plain = plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16")
    assert (plain.kernel, plain.num_partitions, plain.partition_tokens) == ("v2", 6, 352)  # the v1/v2 rule
    assert plain.reason.startswith("v2: v1 would launch 192 blocks") and "allow_untested=True" in plain.reason
    assert plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16", allow_untested=False).kernel == "v2"
    assert plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16", allow_untested=True).kernel == "v3"
    assert plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16", kernel="v3").reason.startswith("asked for v3")
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    assert plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16").kernel == "v3"
    assert plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16", allow_untested=False).kernel == "v2"
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "0")
    assert plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16").kernel == "v2"


def test_every_plan_says_why():
    cfg = KernelConfig.for_head_dim(64)
    assert plan_launch(64, 3, 3, 1, 2048, cfg, kernel="v1").reason == "asked for v1"
    assert plan_launch(64, 3, 3, 1, 2048, cfg, kernel="v2").reason.startswith("asked for v2; v1 would launch 192")
    assert "shorter than two partitions of 256" in plan_launch(2, 1, 3, 1, 100, cfg, allow_untested=False).reason
    assert "already 2048 blocks" in plan_launch(256, 8, 1, 1, 2048, cfg, allow_untested=False).reason
    assert plan_launch(2, 1, 3, 1, 100, cfg, kernel="v2", num_partitions=3).reason == \
        "asked for v2; 3 partitions of 64 keys asked for"


def test_auto_with_untested_kernels_is_v3_at_both_shapes_and_the_old_rule_where_the_model_says_so():
    cfg = KernelConfig.for_head_dim(64)
    plan = plan_launch(64, 3, 3, 1, 2048, cfg, dtype="float16", allow_untested=True)
    assert (plan.kernel, plan.num_partitions, plan.v3.rows) == ("v3", 8, 3)
    assert plan.grid(64, 3) == (64, 3, 8) and "predicts v3 faster than v2" in plan.reason
    assert plan_launch(64, 8, 4, 1, 2048, KernelConfig.for_head_dim(128), dtype="float16",
                       allow_untested=True).kernel == "v3"
    # the model: v3 reads the cache once per row tile of 4 rows, v2 once per 16; 33 query tokens of
    # GQA 3 are 25 tiles against 7, and 25 / 0.40 = 62.5 < 7 / 0.083 = 84.3: still v3
    assert plan_launch(4, 3, 3, 33, 2048, cfg, dtype="float16", allow_untested=True).kernel == "v3"
    assert not v3_wins(25, 7, "v2", {"v2": 0.083, "v3": 0.2})  # at half the predicted bandwidth, v2 wins
    assert v3_wins(25, 7, "v2")


def test_v3_refuses_rows_that_are_not_whole_words():
    cfg = KernelConfig(head_dim=6, tile_tokens=8, num_threads=32, max_rows=16)  # 12-byte fp16 rows
    assert not v3_supported(6, "float16") and v3_supported(6, "float32")
    plan = plan_launch(2, 1, 3, 1, 100, cfg, dtype="float16", allow_untested=True)
    assert plan.kernel == "v1" and "whole 8-byte words" in plan.reason
    with pytest.raises(ValueError, match="8-byte words"):
        plan_launch(2, 1, 3, 1, 100, cfg, kernel="v3", dtype="float16")
    with pytest.raises(ValueError, match="dtype"):
        V3Config(head_dim=64, block_size=16, dtype="bfloat16", rows=1, lanes=8)


def test_v3_sizes_can_be_given():
    cfg = KernelConfig.for_head_dim(128)
    mine = V3Config(128, 16, "float16", rows=4, lanes=16, unroll=2)
    plan = plan_launch(64, 8, 4, 1, 2048, cfg, kernel="v3", dtype="float16", v3=mine)
    assert plan.v3 == mine and plan.num_partitions * plan.partition_tokens >= 2048
    with pytest.raises(ValueError, match="v3 config has head_dim=128"):
        plan_launch(64, 8, 4, 1, 2048, cfg, kernel="v3", dtype="float32", v3=mine)
