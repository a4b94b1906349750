"""Every kernel against the naive PyTorch reference, in numba's CUDA simulator (or on a GPU if present).

Shapes are small because the simulator runs each CUDA thread as a Python thread. The kernels use the
simulator's sizes (one warp, 8-key tiles: KernelConfig.for_simulator; for v3 one warp and its
shared-memory sum: V3Config.for_shape(simulator=True)), so short contexts still cross several tiles
or steps; test_backend.py also runs the GPU sizes. Every batch mixes the edge lengths around a block
boundary (block_size 16) with one long context, and uses shuffled, non-contiguous block tables.
"""

import pytest
import torch

from minipaged.lab.kernels.check import random_paged_batch

BLOCK = 16
EDGES = [1, BLOCK - 1, BLOCK, BLOCK + 1]  # a lone token, and one token either side of a block boundary
LONG = 200

# (num_heads, num_kv_heads): GQA ratios 1, 3, 4 and 8
GQA = {1: (2, 2), 3: (3, 1), 4: (4, 1), 8: (8, 1)}


def decode_batch(gqa, head_dim, dtype=torch.float32, contexts=(*EDGES, LONG), seed=0, **kw):
    heads, kv_heads = GQA[gqa]
    return random_paged_batch(list(contexts), num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                              block_size=BLOCK, dtype=dtype, seed=seed, **kw)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 3, 4])
def test_v1_decode(compare, gqa, head_dim):
    compare(decode_batch(gqa, head_dim, share_first_block=True), kernel="v1")


@pytest.mark.parametrize("gqa,head_dim,dtype", [(1, 64, torch.float32), (3, 64, torch.float16),
                                                (4, 128, torch.float16), (8, 64, torch.float16),
                                                (3, 128, torch.float32)])
def test_v3_decode(compare, gqa, head_dim, dtype):
    """GQA 8 at head_dim 64 in fp16 takes two row tiles (4 rows each, the most v3 keeps in registers)."""
    compare(decode_batch(gqa, head_dim, dtype=dtype, share_first_block=True), kernel="v3")


@pytest.mark.parametrize("gqa,head_dim", [(1, 64), (3, 64), (4, 128)])
def test_v2_decode(compare, gqa, head_dim):
    compare(decode_batch(gqa, head_dim, share_first_block=True), kernel="v2", num_partitions=3)


@pytest.mark.parametrize("num_partitions", [1, 2, 5, 30])
def test_v2_partition_counts(compare, num_partitions):
    # 1: v2's merge of a single partition; 30: most partitions are past most contexts and must be skipped
    compare(decode_batch(3, 64, contexts=(1, 17, 90)), kernel="v2", num_partitions=num_partitions)


@pytest.mark.parametrize("num_partitions", [2, 7])
def test_v3_partition_counts(compare, num_partitions):
    """v3's last block merges: with 7 partitions of 16 keys most are past most contexts. Run twice:
    the merging block must leave its counter at zero for the next launch."""
    b = decode_batch(3, 64, dtype=torch.float16, contexts=(1, 17, 90))
    compare(b, kernel="v3", num_partitions=num_partitions)
    compare(b, kernel="v3", num_partitions=num_partitions)


@pytest.mark.parametrize("kernel,parts", [("v1", None), ("v2", 4), ("v3", None)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp16(compare, kernel, parts, head_dim):
    compare(decode_batch(4, head_dim, dtype=torch.float16, contexts=(1, 16, 17, 120)), kernel=kernel,
            num_partitions=parts)


# Multi-token queries: sequence i owns query_lens[i] rows of q, its last tokens, under a causal mask.
# Prefill over the cache (query_len == context), a chunk of a chunked prefill, a speculative
# verification of 4 tokens, a plain decode token, and a sequence with no query in this step.
MULTI_CONTEXTS = [17, 40, 23, 9, 30]
MULTI_QUERIES = [17, 12, 4, 1, 0]


@pytest.mark.parametrize("kernel,parts", [("v1", None), ("v2", 3), ("v3", 2)])  # 2 for v2: the fp16 test below
def test_multi_token_queries(compare, kernel, parts):
    b = random_paged_batch(MULTI_CONTEXTS, MULTI_QUERIES, num_heads=3, num_kv_heads=1, head_dim=64,
                           block_size=BLOCK, seed=1)
    compare(b, kernel=kernel, num_partitions=parts)


@pytest.mark.parametrize("kernel", ["v2", "v3"])
def test_multi_token_queries_fp16_gqa4(compare, kernel):
    b = random_paged_batch([21, 33], [10, 5], num_heads=8, num_kv_heads=2, head_dim=64, block_size=BLOCK,
                           dtype=torch.float16, seed=2)
    compare(b, kernel=kernel, num_partitions=2 if kernel == "v2" else None)


@pytest.mark.parametrize("kernel", ["v1", "v3"])
def test_every_sequence_shares_blocks(compare, kernel):
    """Forked sequences: each one's first block is sequence 0's; the kernels just follow the tables."""
    b = decode_batch(3, 64, contexts=(20, 20, 33), share_first_block=True)
    assert len(set(b["block_tables"][:, 0].tolist())) == 1
    compare(b, kernel=kernel)


@pytest.mark.slow
def test_long_contexts_v1_and_v2(compare):
    """A few hundred keys in several sequences, Llama's head_dim: many tiles, many partitions."""
    b = decode_batch(4, 128, contexts=(300, 257, 129), seed=3)
    compare(b, kernel="v1")
    compare(b, kernel="v2", num_partitions=4)


@pytest.mark.parametrize("kernel", ["v2", "v3"])
@pytest.mark.parametrize("block_size", [1, 8, 12, 32])
def test_other_block_sizes(compare, block_size, kernel):
    """One token per block (the contiguous arena), tiles spanning blocks (8), a block size that is not
    a power of two (12), several tiles in one block (32). v3 runs them in fp16, its main case (and the
    faster one in the simulator); with block size 1 its 2 keys per lane group and step lie in two
    KV blocks, so each key reads its own table entry."""
    dtype = torch.float16 if kernel == "v3" else torch.float32
    b = random_paged_batch([1, max(1, block_size - 1), block_size + 1, 70], [1, 1, 1, 9], num_heads=3, num_kv_heads=1,
                           head_dim=64, block_size=block_size, dtype=dtype, seed=11)
    compare(b, kernel=kernel, num_partitions=2)
