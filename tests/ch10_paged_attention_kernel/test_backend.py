"""The "numba" backend behind the shared signature: dispatch, the v1/v2 choice, odd inputs, bad inputs."""

import pytest
import torch

from minipaged.attention import available_backends, paged_attention
from minipaged.attention.kernels.config import KernelConfig, partition_tokens_for
from minipaged.lab.kernels.check import random_paged_batch


def args_of(b):
    return b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"]


def test_registered_and_matches_reference(numba_cuda):
    assert "numba" in available_backends()
    b = random_paged_batch([5, 33], [5, 2], num_heads=4, num_kv_heads=2, head_dim=64, seed=4)
    out = paged_attention(*args_of(b), query_lens=b["query_lens"], backend="numba")
    ref = paged_attention(*args_of(b), query_lens=b["query_lens"], backend="torch")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def record_kernels(monkeypatch):
    """Wrap the backend's three launch functions; returns the list of names they append when run."""
    from minipaged.attention import numba_backend, v3_launch

    chosen = []
    for module, name in ((numba_backend, "run_v1"), (numba_backend, "run_v2"), (v3_launch, "run_v3")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name: (chosen.append(_name), _real(*a))[1])
    return chosen


def test_auto_runs_only_gpu_tested_kernels_unless_untested_ones_are_allowed(compare, monkeypatch):
    """v3 has not run on a GPU: "auto" runs the v1/v2 rule, and v3 once allow_untested=True or
    MINIPAGED_ALLOW_UNTESTED_KERNELS=1 (which scripts/gpu_check.sh sets) says it may."""
    from minipaged.attention.kernels.config import ALLOW_UNTESTED_ENV

    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    chosen = record_kernels(monkeypatch)
    long = random_paged_batch([520, 3], num_heads=3, num_kv_heads=1, head_dim=64, seed=5)
    compare(long)
    compare(long, allow_untested=True)
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    compare(random_paged_batch([9, 4], [3, 1], num_heads=2, num_kv_heads=1, head_dim=16, seed=5))
    assert chosen == ["run_v2", "run_v3", "run_v3"]  # 2 blocks for a 520-key context: v2 splits it


def test_auto_keeps_the_v1_v2_rule_where_the_model_says_v3_loses(compare, monkeypatch):
    from minipaged.attention.kernels import v3_config

    monkeypatch.setitem(v3_config.SHARE_OF_PEAK, "v3", 0.001)  # as if v3 were slower than both
    chosen = record_kernels(monkeypatch)
    compare(random_paged_batch([520, 3], num_heads=3, num_kv_heads=1, head_dim=64, seed=5), allow_untested=True)
    compare(random_paged_batch([40, 3], num_heads=3, num_kv_heads=1, head_dim=64, seed=5), allow_untested=True)
    assert chosen == ["run_v2", "run_v1"]  # 2 blocks for a 520-key context: split; 40 keys: not worth it


def test_tiny_model_head_dim_16_and_custom_scale(numba_cuda):
    b = random_paged_batch([3, 18], num_heads=4, num_kv_heads=2, head_dim=16, seed=6)
    out = paged_attention(*args_of(b), scale=0.3, backend="numba")
    ref = paged_attention(*args_of(b), scale=0.3, backend="torch")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["v1", "v3"])
def test_non_contiguous_q(compare, kernel):
    b = random_paged_batch([9, 20], num_heads=3, num_kv_heads=1, head_dim=64, seed=7)
    wide = torch.randn(2, 3, 128)
    wide[:, :, :64] = b["q"]
    b["q"] = wide[:, :, :64]  # a view with strides, as a slice of a fused qkv projection would be
    assert not b["q"].is_contiguous()
    compare(b, kernel=kernel)  # v3 reads this q as int64 words through the same strides


@pytest.mark.parametrize("kernel,parts,block_size", [("v1", None, 16), ("v2", 2, 16), ("v2", 3, 1)])
def test_gpu_sizes_in_the_simulator(compare, kernel, parts, block_size):
    """The sizes a GPU runs (128 threads, 32-key tiles, 16 rows), not the simulator's small ones. With
    one token per block a copy step (64 elements) does not split evenly over 128 threads."""
    b = random_paged_batch([1, 17, 70], num_heads=3, num_kv_heads=1, head_dim=64, block_size=block_size, seed=8)
    compare(b, kernel=kernel, num_partitions=parts, config=KernelConfig.for_head_dim(64, block_size))


def run_v3_plan(b, cfg, parts, part_tokens):
    """v3 alone on batch b with the given sizes (no planning), checked against the reference."""
    from minipaged.attention.kernels.config import LaunchPlan
    from minipaged.attention.numba_backend import _Launcher
    from minipaged.attention.reference import paged_attention_reference
    from minipaged.attention.v3_launch import run_v3

    n = b["block_tables"].shape[0]
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    out = torch.empty_like(b["q"])
    ones, starts = torch.ones(n, dtype=torch.int32), torch.arange(n, dtype=torch.int32)
    with _Launcher(out.device) as launcher:
        run_v3(out, *args, starts, ones, b["q"].shape[-1] ** -0.5, LaunchPlan("v3", 1, parts, part_tokens, cfg),
               launcher)
    torch.testing.assert_close(out.float(), paged_attention_reference(*args).float(), atol=2e-3, rtol=2e-3)


def _exchange_through_a_barrier(self, mask, value, lane_mask):
    """shfl_xor_sync for the simulator: every thread posts its value, then reads its partner's. Right
    only when the whole block calls it together, as v3 does."""
    import threading

    me = threading.current_thread()
    posted = me._manager.__dict__.setdefault("_posted", {})
    posted[me.thread_id] = value
    me.syncthreads()
    got = posted[me.thread_id ^ lane_mask]
    me.syncthreads()
    return got


@pytest.mark.parametrize("head_dim", [64, 128])
def test_v3_shuffle_sum_in_the_simulator(numba_cuda, monkeypatch, head_dim):
    """The GPU's butterfly (8 lanes a key at head_dim 64, 32 at 128, fp16), run in the simulator with
    a shuffle lent to it: the offsets and the lane groups are right, not only compilable."""
    import dataclasses

    from minipaged.attention.kernels import using_simulator
    from minipaged.attention.kernels.v3_config import V3Config

    if not using_simulator():
        pytest.skip("the simulator's stand-in for shfl_xor_sync; on a GPU test_gpu.py runs the real one")
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    monkeypatch.setattr(FakeCUDAModule, "shfl_xor_sync", _exchange_through_a_barrier, raising=False)
    cfg = dataclasses.replace(V3Config.for_shape(head_dim, "float16", 3, simulator=True), reduce="shuffle")
    b = random_paged_batch([1, 17, 40], num_heads=3, num_kv_heads=1, head_dim=head_dim, dtype=torch.float16,
                           seed=12)
    run_v3_plan(b, cfg, 2, partition_tokens_for(40, 2, cfg.step_keys))


@pytest.mark.slow
def test_v3_gpu_sizes_in_the_simulator(numba_cuda):
    """v3 at the sizes a GPU runs (128 threads, 16 lane groups of 8), with the shared-memory sum the
    simulator needs in place of the shuffles, in fp16 with 2 partitions."""
    import dataclasses

    from minipaged.attention.kernels.v3_config import V3Config

    b = random_paged_batch([1, 17, 70], num_heads=3, num_kv_heads=1, head_dim=64, dtype=torch.float16, seed=8)
    cfg = dataclasses.replace(V3Config.for_shape(64, "float16", 3), reduce="shared")
    assert cfg.num_threads == 128 and cfg.lanes == 8
    run_v3_plan(b, cfg, 2, 64)


@pytest.mark.parametrize("mutate,match", [
    (lambda b: b.update(q=b["q"].double(), k_cache=b["k_cache"].double(), v_cache=b["v_cache"].double()),
     "dtype"),
    (lambda b: b.update(q=b["q"].half()), "dtype"),
    (lambda b: b.update(block_tables=b["block_tables"].long()), "block_tables"),
    (lambda b: b.update(block_tables=b["block_tables"][:, :1]), "block_tables has 1 columns"),
    (lambda b: b.update(context_lens=b["context_lens"].long()), "context_lens"),
    (lambda b: b.update(q=b["q"][:1]), "q has 1 rows"),
    (lambda b: b.update(query_lens=torch.tensor([2, 1], dtype=torch.int32)), "sum\\(query_lens\\)"),
    (lambda b: b.update(query_lens=torch.tensor([1, 40], dtype=torch.int32),
                        q=torch.randn(41, 3, 64)), "query_lens must lie"),
    (lambda b: b.update(k_cache=b["k_cache"][..., :32]), "k_cache"),
    (lambda b: b.update(k_cache=torch.randn(9, 16, 2, 64), v_cache=torch.randn(9, 16, 2, 64)),
     "multiple of num_kv_heads"),
])
def test_bad_input_is_a_clear_value_error(numba_cuda, mutate, match):
    b = random_paged_batch([5, 20], num_heads=3, num_kv_heads=1, head_dim=64, seed=9)
    mutate(b)
    with pytest.raises(ValueError, match=match):
        paged_attention(*args_of(b), query_lens=b["query_lens"], backend="numba")


def test_bad_options(numba_cuda):
    from minipaged.attention.numba_backend import paged_attention_numba

    b = random_paged_batch([5], num_heads=3, num_kv_heads=1, head_dim=64)
    with pytest.raises(ValueError, match="kernel"):
        paged_attention_numba(*args_of(b), kernel="v9")

    with pytest.raises(ValueError, match="head_dim=128"):
        paged_attention_numba(*args_of(b), config=KernelConfig.for_head_dim(128))


def test_out_of_range_block_is_refused(numba_cuda):
    b = random_paged_batch([5, 20], num_heads=3, num_kv_heads=1, head_dim=64)
    b["block_tables"][1, 1] = b["k_cache"].shape[0]
    with pytest.raises(ValueError, match="block_tables entries"):
        paged_attention(*args_of(b), backend="numba")
