"""Chapter 00's graded exercises: the KV cache itself, and the arithmetic of a decode step."""

from minipaged.lab.exercises.catalog import Exercise

CACHED = "tests/ch00_the_kv_cache/test_cached_decode.py"
ROOF = "tests/ch00_the_kv_cache/test_roofline.py"

EXERCISES = [
    Exercise(
        id="00.1",
        title="PerRequestKVCache.attend: keep K and V, attend over all of them",
        task="Write PerRequestKVCache.attend(layer, q, k, v), called once per layer of each forward pass with "
             "the T new tokens' q [T, H, Dh], k and v [T, KVH, Dh]. Keep the new K and V: the first call for a "
             "layer (the prompt) stores them in self.k[layer] and self.v[layer]; a later call (a decode step) "
             "appends its rows below the cached ones. Then return dense_attention(q, K, V, scale, causal_offset) "
             "over every kept row, with scale = 1/sqrt(Dh) and causal_offset = (rows kept) - T, so that new "
             "token t sees the cached rows and the new rows up to itself. Decoding with this cache must then "
             "give exactly the logits of recomputing the whole sequence every step.",
        hint="torch.cat([old, new]) joins along the first dimension (tokens). With T = 1 the offset is the "
             "number of cached rows; with the prompt (nothing cached) it is 0.",
        tests=(f"{CACHED}::test_cached_equals_recompute_tiny",
               f"{CACHED}::test_cached_logits_match_recompute_step_by_step",
               f"{CACHED}::test_cache_size_is_bytes_per_token_times_tokens",
               f"{CACHED}::test_batch_of_caches_equals_one_at_a_time"),
        minutes=20,
    ),
    Exercise(
        id="00.2",
        title="decode_step_cost: the FLOPs and bytes of one decode step",
        task="Return a StepCost for one decode step of `batch` sequences, each adding one token whose query "
             "attends over `context` keys. FLOPs: 2 per weight per sequence for the matmuls (cfg.num_params "
             "weights), plus 2 x 2 x heads x head_dim per key per layer per sequence for q.k and p.v. Bytes: "
             "every weight once for the whole batch (weight_bytes(cfg, bytes_per_param)), and each sequence's "
             "own K and V for every key (kv_bytes_per_token(cfg, bytes_per_value) per key). The FLOPs must "
             "agree with what torch's FLOP counter counts when the model really runs such a step.",
        hint="The weights are shared by the batch; the keys are not. cfg.num_layers, cfg.num_heads and "
             "cfg.head_dim give the attention's size.",
        tests=(f"{ROOF}::test_decode_is_memory_bound_at_small_batch_and_batching_helps",
               f"{ROOF}::test_decode_step_cost_counts_the_bytes_a_step_reads",
               f"{ROOF}::test_decode_step_flops_equal_torchs_count_of_a_real_step"),
        minutes=20,
    ),
]
