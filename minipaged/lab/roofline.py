"""KV-cache and roofline arithmetic: how big the cache is, and why decoding is memory-bound.

Everything here is computed from a ModelConfig, so the chapters quote numbers that come from code:

    kv_bytes_per_token(SMOLLM2_135M, 4)      2 x 30 layers x 3 KV heads x 64 dims x 4 B = 46,080 B
    tokens_that_fit(80e9, LLAMA_8B)          how many tokens' K/V fit beside 8B fp16 weights
    decode_step_cost(cfg, batch, context)    FLOPs done and bytes read by one decode step

A decode step reads every weight once (shared by the whole batch) and every cached K/V byte of every
sequence, but does only ~2 FLOPs per weight per sequence. Arithmetic intensity (FLOPs per byte) is
therefore tiny at small batch, far under what any CPU or GPU needs to be compute-bound.

Not handled: activation memory, quantized weights' dequantization cost, attention kernels' extra reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged.model.config import ModelConfig


def kv_bytes_per_token(cfg: ModelConfig, bytes_per_value: int = 4) -> int:
    return cfg.kv_bytes_per_token(bytes_per_value)


def weight_bytes(cfg: ModelConfig, bytes_per_param: float = 2) -> float:
    return cfg.num_params * bytes_per_param


def tokens_that_fit(gpu_bytes: float, cfg: ModelConfig, bytes_per_value: int = 2,
                    bytes_per_param: float = 2, reserved_fraction: float = 0.0) -> int:
    """Tokens whose K and V fit in what is left of `gpu_bytes` after the weights (and a reserve)."""
    free = gpu_bytes * (1 - reserved_fraction) - weight_bytes(cfg, bytes_per_param)
    return max(0, int(free // kv_bytes_per_token(cfg, bytes_per_value)))


@dataclass
class StepCost:
    flops: float  # floating-point operations of the step
    weight_bytes: float  # bytes of weights read (once per step, shared by the batch)
    kv_bytes: float  # bytes of cached K and V read

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: compare with a device's peak FLOP/s ÷ peak bytes/s (its ridge point)."""
        return self.flops / self.bytes


def decode_step_cost(cfg: ModelConfig, batch: int, context: int, bytes_per_param: float = 4,
                     bytes_per_value: int = 4) -> StepCost:
    """Cost of one decode step: `batch` sequences each add one token whose query attends over
    `context` keys.

    Matmuls: 2 FLOPs per weight per token. Attention: q·k and p·v are 2 x 2 x heads x head_dim FLOPs
    per key per layer. Bytes: every weight once for the whole batch, every key's K and V once per
    sequence.
    """
    # exercise 00.2: begin
    matmul_flops = 2 * cfg.num_params * batch
    attn_flops = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context * batch
    return StepCost(
        flops=matmul_flops + attn_flops,
        weight_bytes=weight_bytes(cfg, bytes_per_param),
        kv_bytes=kv_bytes_per_token(cfg, bytes_per_value) * context * batch,
    )
    # exercise 00.2: end


def prefill_cost(cfg: ModelConfig, prompt_len: int, bytes_per_param: float = 4) -> StepCost:
    """Cost of one prefill pass over `prompt_len` tokens (weights read once, reused by every token)."""
    matmul_flops = 2 * cfg.num_params * prompt_len
    attn_flops = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * prompt_len * prompt_len  # causal half
    return StepCost(matmul_flops + attn_flops, weight_bytes(cfg, bytes_per_param), 0.0)
