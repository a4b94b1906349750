"""Chapter 10's graded exercises: the kernels' online-softmax step, v2's merge of partitions and v3's
unpacking of a cache word. Their tests run the kernels in numba's CUDA simulator when there is no GPU
(tests/ch10_*/conftest.py)."""

from minipaged.lab.exercises.catalog import Exercise

# Each exercise's tests run the kernel it belongs to by name: "auto" picks v3, which needs 10.3's code,
# and 10.1 and 10.2 come first.
GRADED = "tests/ch10_paged_attention_kernel/test_graded_exercises.py"
VS_REF = "tests/ch10_paged_attention_kernel/test_kernels_vs_reference.py"
BACKEND = "tests/ch10_paged_attention_kernel/test_backend.py"

EXERCISES = [
    Exercise(
        id="10.1",
        title="softmax_step: one online-softmax update per query row",
        task="Thread r = cuda.threadIdx.x updates row r if r < rows (other threads do nothing). Take the new "
             "running max m_new = max(m_s[r], the tile's scores p_s[r, 0..TILE-1]); replace each score by "
             "exp(score - m_new) in place; with alpha = exp(m_s[r] - m_new) set l_s[r] = l_s[r] * alpha + the "
             "tile's sum of probabilities, then m_s[r] = m_new and alpha_s[r] = alpha (accumulate_tile shrinks "
             "the output so far by alpha). Masked keys hold -inf and become 0. While a row has seen no visible key "
             "(m_new still -inf) its probabilities are 0 and alpha is 1: exp(-inf - -inf) is NaN, and a NaN "
             "poisons the row's output.",
        hint="Test m_new == NEG_INF before any exp. Subtract the running max before exp (scores near 90 overflow "
             "fp32 otherwise); use math.exp and float32(0.0) to start the sum.",
        tests=(f"{GRADED}::test_softmax_step_keeps_the_running_max_sum_and_rescale",
               f"{GRADED}::test_softmax_steps_rescaled_give_the_softmax_of_the_whole_row",
               f"{VS_REF}::test_every_sequence_shares_blocks[v1]",
               f"{VS_REF}::test_multi_token_queries[v1-None]",
               f"{BACKEND}::test_gpu_sizes_in_the_simulator[v1-None-16]"),
        minutes=30,
    ),
    Exercise(
        id="10.2",
        title="merge_partitions: combine v2's partial results",
        task="Block (cuda.blockIdx.x, cuda.blockIdx.y) merges one (token, head). Partition p reports m_p "
             "(part_max), l_p (part_sum, the sum of exp(score - m_p)) and o_p (part_out, already divided by "
             "l_p). Compute M = the max of m_p, weights w_p = l_p * exp(m_p - M) and "
             "out[token, head, d] = sum_p w_p * o_p[d] / sum_p w_p, each thread writing the dims d = threadIdx.x, "
             "threadIdx.x + blockDim.x, ... Leave out of M and of every sum each partition with l_p = 0: it saw no "
             "key, its max is -inf and its part_out was never written (it may hold NaN).",
        hint="One pass over the partitions for M, one for the total weight, then one per dim. Start M at "
             "float32(NEG_INF), not a bare -inf (a Python float is float64 on a GPU).",
        tests=(f"{GRADED}::test_merge_partitions_weighs_each_partition_by_its_share_of_the_softmax",
               f"{GRADED}::test_merge_partitions_with_fewer_threads_than_dims",
               f"{VS_REF}::test_v2_partition_counts[2]",
               f"{VS_REF}::test_v2_partition_counts[5]"),
        minutes=30,
    ),
    Exercise(
        id="10.3",
        title="unpack_word: one 8-byte cache word into its fp16 or fp32 values",
        task="v3 reads K, V and q as int64 words. Write unpack_word(dst, base, w): for fp16 (HALVES) the word "
             "holds 4 values, value i in bits 16i .. 16i+15 (the first value in memory is the low bits: the "
             "GPU is little-endian); store value i, converted to fp32, in dst[base + i]. For fp32 the word "
             "holds 2 values, bits 0..31 and 32..63, into dst[base] and dst[base + 1]. Turn raw bits into a "
             "value only with half_from_bits (16 bits) and float_from_bits (32 bits): on a GPU they are one "
             "instruction each, in the simulator a NumPy view. w is a signed int64: a word whose top bit is "
             "set is negative, and shifting it right drags the sign along.",
        hint="Shift right, then mask: (w >> (16 * i)) & 0xFFFF. Without the mask the high bits of a negative "
             "word (or the values above) reach the conversion. A loop over range(4) with a constant trip "
             "count unrolls: dst stays in registers.",
        tests=(f"{GRADED}::test_unpack_word_splits_fp16_words_in_memory_order",
               f"{GRADED}::test_unpack_word_splits_fp32_words",
               f"{VS_REF}::test_v3_decode",
               f"{VS_REF}::test_every_sequence_shares_blocks[v3]"),
        minutes=20,
    ),
]
