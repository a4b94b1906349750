"""Chapter 00: the KV-cache arithmetic the chapter quotes."""

from minipaged.model.config import LLAMA_8B, SMOLLM2_135M, TINY
from minipaged.roofline import decode_step_cost, kv_bytes_per_token, tokens_that_fit, weight_bytes


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


def test_tiny_has_varied_shapes():
    assert TINY.num_heads % TINY.num_kv_heads == 0 and TINY.num_heads != TINY.num_kv_heads
