"""Chapter 03: attention read through block tables equals dense attention over the same tokens.

The dense oracle is written here from scratch (a loop over heads), independent of
minipaged.attention.reference, so the two cannot share a mistake.
"""

import random

import pytest
import torch

from minipaged.attention import paged_attention
from minipaged.kv import ContiguousArena, OnDemandPolicy

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 9, 3, 8  # grouped-query: 3 query heads share each KV head


def dense_attention_by_hand(q, k, v, causal_from=None):
    """q [num_q, H, D], k/v [L, KVH, D]. Query j sits at position causal_from + j (None: sees all)."""
    num_q, group = q.shape[0], NUM_HEADS // NUM_KV_HEADS
    out = torch.empty(q.shape, dtype=torch.float64)
    for j in range(num_q):
        visible = k.shape[0] if causal_from is None else causal_from + j + 1
        for h in range(NUM_HEADS):
            kv_head = h // group
            scores = (k[:visible, kv_head].double() @ q[j, h].double()) / HEAD_DIM ** 0.5  # [visible]
            out[j, h] = torch.softmax(scores, dim=0) @ v[:visible, kv_head].double()
    return out


def random_paged_batch(lengths, block_size, seed):
    """Sequences scattered over shuffled physical blocks; returns the cache, tables and dense K/V."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks_per_seq) + 3  # a few blocks nobody uses
    physical = list(range(num_blocks))
    random.Random(seed).shuffle(physical)
    k_cache = torch.randn(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    tables = torch.full((len(lengths), max(blocks_per_seq)), -1, dtype=torch.int32)
    dense_k, dense_v = [], []
    for i, (length, count) in enumerate(zip(lengths, blocks_per_seq)):
        table = [physical.pop() for _ in range(count)]
        tables[i, :count] = torch.tensor(table)
        rows = [(table[p // block_size], p % block_size) for p in range(length)]  # token p's slot
        dense_k.append(torch.stack([k_cache[b, o] for b, o in rows]))
        dense_v.append(torch.stack([v_cache[b, o] for b, o in rows]))
    return k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), dense_k, dense_v


@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_matches_dense_attention(block_size):
    lengths = [block_size - 1, block_size, block_size + 1, 3 * block_size + 2, 1]
    k_cache, v_cache, tables, context_lens, dense_k, dense_v = random_paged_batch(lengths, block_size, 0)
    q = torch.randn(len(lengths), NUM_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1))
    out = paged_attention(q, k_cache, v_cache, tables, context_lens)  # [num_seqs, H, D]
    for i in range(len(lengths)):
        expected = dense_attention_by_hand(q[i:i + 1], dense_k[i], dense_v[i])
        torch.testing.assert_close(out[i:i + 1].double(), expected, rtol=1e-5, atol=1e-5)


def test_prefill_with_query_lens_is_causal():
    block_size, lengths = 4, [3, 4, 5]
    k_cache, v_cache, tables, context_lens, dense_k, dense_v = random_paged_batch(lengths, block_size, 2)
    query_lens = torch.tensor([3, 2, 5], dtype=torch.int32)  # the last tokens of each context
    q = torch.randn(int(query_lens.sum()), NUM_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(3))
    out = paged_attention(q, k_cache, v_cache, tables, context_lens, query_lens=query_lens)
    start = 0
    for i, (length, nq) in enumerate(zip(lengths, query_lens.tolist())):
        expected = dense_attention_by_hand(q[start:start + nq], dense_k[i], dense_v[i], causal_from=length - nq)
        torch.testing.assert_close(out[start:start + nq].double(), expected, rtol=1e-5, atol=1e-5)
        start += nq


def write_through_policy(policy, seq_k, seq_v):
    """Store each sequence's K/V in a cache at the slots the policy hands out; return cache + tables."""
    bs = policy.block_size
    k_cache = torch.zeros(policy.num_blocks, bs, NUM_KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    for seq, (k, v) in enumerate(zip(seq_k, seq_v)):
        slots = torch.tensor(policy.append_slots(seq, k.shape[0] - 1) + policy.append_slots(seq, 1))
        k_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)[slots] = k  # prefill, then one decode token
        v_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)[slots] = v
    tables = [policy.block_table(seq) for seq in range(len(seq_k))]
    width = max(map(len, tables))
    table_tensor = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return k_cache, v_cache, table_tensor


def test_policies_give_the_same_attention_as_dense():
    """Tokens stored through the on-demand block tables (scattered blocks) or the contiguous arena
    give the attention a dense tensor gives: same tokens, different addresses."""
    gen = torch.Generator().manual_seed(4)
    lengths = [15, 16, 17, 40]
    seq_k = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) for n in lengths]
    seq_v = [torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) for n in lengths]
    q = torch.randn(len(lengths), NUM_HEADS, HEAD_DIM, generator=gen)

    paged = OnDemandPolicy(64 * 16, block_size=16, max_model_len=256, watermark=0)
    for filler in range(32):  # fill the pool, then free every other pair of blocks:
        paged.allocate(f"f{filler}", 32, 1)  # the free blocks are now 0, 1, 4, 5, 8, 9, ...
    for filler in range(0, 32, 2):
        paged.free(f"f{filler}")
    arena = ContiguousArena(1024, max_model_len=256, reservation="oracle")
    for policy in (paged, arena):
        for seq, n in enumerate(lengths):
            policy.allocate(seq, n - 1, 1)
    outputs = {}
    for policy in (paged, arena):
        k_cache, v_cache, tables = write_through_policy(policy, seq_k, seq_v)
        context_lens = torch.tensor(lengths, dtype=torch.int32)
        outputs[policy.name] = paged_attention(q, k_cache, v_cache, tables, context_lens)
    table = paged.block_table(3)  # the 40-token sequence: 3 blocks, not consecutive
    assert len(table) == 3 and table != list(range(table[0], table[0] + 3))
    for seq in range(len(lengths)):
        expected = dense_attention_by_hand(q[seq:seq + 1], seq_k[seq], seq_v[seq])
        for name, out in outputs.items():
            torch.testing.assert_close(out[seq:seq + 1].double(), expected, rtol=1e-5, atol=1e-5, msg=name)
