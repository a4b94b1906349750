"""Model shapes, and the KV-cache arithmetic that follows from them.

A `ModelConfig` is all the engine needs to know about a Llama-architecture model: how many layers,
heads and dimensions it has. From it alone we can say how many bytes of K and V every token keeps
alive, which is the number the whole course is about.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int  # the residual stream width ("d_model")
    intermediate_size: int  # SwiGLU hidden width
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention: num_heads % num_kv_heads == 0)
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_model_len: int = 2048  # longest prompt + output the model supports (its context window)
    bos_token_id: int = 1
    eos_token_id: int = 2
    tie_word_embeddings: bool = True  # the output matrix is the embedding matrix

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @property
    def num_params(self) -> int:
        """Parameter count, counting the tied embedding / output matrix once."""
        d, f = self.hidden_size, self.intermediate_size
        attn = d * self.num_heads * self.head_dim * 2 + d * self.num_kv_heads * self.head_dim * 2
        per_layer = attn + 3 * d * f + 2 * d
        embeddings = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return embeddings + self.num_layers * per_layer + d

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """Bytes of K and V that one token keeps in the cache, over all layers.

        2 (K and V) x layers x kv heads x head_dim x bytes per value.
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value


SMOLLM2_135M = ModelConfig(name="smollm2-135m", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                           num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                           rms_norm_eps=1e-5, max_model_len=8192, bos_token_id=1, eos_token_id=2)

# A few layers of random weights: fast enough that a test can run dozens of generations.
# Its vocabulary is the byte tokenizer's (256 bytes + 3 special tokens). Its output matrix is not
# tied to the embedding, so that random weights still give varied greedy outputs.
TINY = ModelConfig(name="tiny", vocab_size=259, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, rope_theta=10000.0, max_model_len=512, bos_token_id=256,
                   eos_token_id=257, tie_word_embeddings=False)

# Llama-3-8B's shapes, used only for arithmetic (bytes per token, tokens that fit on a GPU).
LLAMA_8B = ModelConfig(name="llama-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                       num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0, max_model_len=8192,
                       tie_word_embeddings=False)


def with_overrides(config: ModelConfig, **changes) -> ModelConfig:
    return replace(config, **changes)
