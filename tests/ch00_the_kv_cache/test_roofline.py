"""Chapter 00: the KV-cache arithmetic the chapter quotes, and torch's own FLOP count as its oracle."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from minipaged.kv.per_request import BatchOfCaches, PerRequestKVCache
from minipaged.lab.roofline import decode_step_cost, kv_bytes_per_token, tokens_that_fit, weight_bytes
from minipaged.model import load_model
from minipaged.model.config import LLAMA_8B, SMOLLM2_135M, TINY


def test_bytes_per_token():
    assert kv_bytes_per_token(SMOLLM2_135M, 4) == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(LLAMA_8B, 2) == 2 * 32 * 8 * 128 * 2 == 131_072


def test_parameter_counts():
    assert SMOLLM2_135M.num_params == 134_515_008  # the real model's count, tied embeddings
    assert 8.0e9 < LLAMA_8B.num_params < 8.1e9


def test_tokens_that_fit_beside_8b_weights():
    n = tokens_that_fit(80e9, LLAMA_8B, bytes_per_value=2, bytes_per_param=2)
    assert n == int((80e9 - weight_bytes(LLAMA_8B, 2)) // 131_072)
    assert 480_000 < n < 500_000
    assert tokens_that_fit(10e9, LLAMA_8B) == 0  # the weights alone do not fit


def test_decode_is_memory_bound_at_small_batch_and_batching_helps():
    one = decode_step_cost(SMOLLM2_135M, batch=1, context=256)
    many = decode_step_cost(SMOLLM2_135M, batch=64, context=256)
    assert one.intensity < 1  # about half a FLOP per byte read
    assert many.intensity > 10 * one.intensity


def test_decode_step_cost_counts_the_bytes_a_step_reads():
    c = decode_step_cost(SMOLLM2_135M, batch=4, context=100, bytes_per_param=2, bytes_per_value=2)
    assert c.weight_bytes == SMOLLM2_135M.num_params * 2  # every weight once, for the whole batch
    assert c.kv_bytes == 4 * 100 * kv_bytes_per_token(SMOLLM2_135M, 2)  # every key's K and V, per sequence
    assert c.bytes == c.weight_bytes + c.kv_bytes


def test_decode_step_flops_equal_torchs_count_of_a_real_step():
    """SmolLM2's shapes (random weights): torch's FLOP counter, run over one batched decode step,
    counts what decode_step_cost predicts, but for the RMSNorms' multiplications, which it does not
    count (35,136 weights of 134.5 million)."""
    loaded = load_model("smollm2-135m-random")
    model, cfg = loaded.model, loaded.config
    batch, cached = 2, 9
    caches = [PerRequestKVCache(cfg.num_layers) for _ in range(batch)]
    with torch.inference_mode():
        for cache in caches:
            model(torch.arange(cached), torch.arange(cached), cache)
        with FlopCounterMode(display=False) as counter:
            model(torch.full((batch,), 5), torch.full((batch,), cached), BatchOfCaches(caches, [1] * batch))
    # the new token's query attends over the cached keys and its own
    predicted = decode_step_cost(cfg, batch, context=cached + 1).flops
    assert abs(counter.get_total_flops() - predicted) / predicted < 5e-4


def test_tiny_has_varied_shapes():
    assert TINY.num_heads % TINY.num_kv_heads == 0 and TINY.num_heads != TINY.num_kv_heads
