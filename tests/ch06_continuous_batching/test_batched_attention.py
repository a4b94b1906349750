"""The two fast attention paths against the reference, their oracle: the batched PyTorch attention
(torch_batched) and the compiled CPU kernel (cpu, the default engine's), on decodes, prompts over a
cache, chunks and drafts."""

import random

import pytest
import torch

from minipaged import LLM, SamplingParams
from minipaged.attention import paged_attention


def random_case(seed, num_heads, num_kv_heads, block_size, lengths, query_lens):
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks) + 2
    physical = list(range(num_blocks))
    random.Random(seed).shuffle(physical)
    tables = torch.full((len(lengths), max(blocks) + 1), -1, dtype=torch.int32)  # padding never read
    for i, count in enumerate(blocks):
        tables[i, :count] = torch.tensor([physical.pop() for _ in range(count)])
    k = torch.randn(num_blocks, block_size, num_kv_heads, 16, generator=gen)
    v = torch.randn(num_blocks, block_size, num_kv_heads, 16, generator=gen)
    q = torch.randn(sum(query_lens), num_heads, 16, generator=gen)
    return q, k, v, tables, torch.tensor(lengths, dtype=torch.int32), torch.tensor(query_lens, dtype=torch.int32)


FAST = ["torch_batched", "cpu"]


@pytest.mark.parametrize("backend", FAST)
@pytest.mark.parametrize("heads", [(4, 4), (9, 3), (8, 2)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("seed", range(3))
def test_fast_backends_equal_the_reference(backend, heads, block_size, seed):
    rng = random.Random(seed)
    lengths = [rng.choice([1, block_size - 1 or 1, block_size, block_size + 1, rng.randint(1, 70)]) for _ in range(6)]
    decode = random_case(seed, *heads, block_size, lengths, [1] * 6)
    query_lens = [rng.randint(1, n) for n in lengths]  # prefill over the cache, chunks, verification
    mixed = random_case(seed, *heads, block_size, lengths, query_lens)
    for q, k, v, tables, ctx, qlen in (decode, mixed):
        want = paged_attention(q, k, v, tables, ctx, query_lens=qlen, backend="torch")
        got = paged_attention(q, k, v, tables, ctx, query_lens=qlen, backend=backend)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    q, k, v, tables, ctx, _ = decode
    torch.testing.assert_close(paged_attention(q, k, v, tables, ctx, backend=backend),
                               paged_attention(q, k, v, tables, ctx), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", FAST)
def test_fp16_inputs_keep_their_dtype(backend):
    q, k, v, tables, ctx, qlen = random_case(0, 9, 3, 16, [5, 40], [5, 1])
    got = paged_attention(q.half(), k.half(), v.half(), tables, ctx, query_lens=qlen, backend=backend)
    want = paged_attention(q.half(), k.half(), v.half(), tables, ctx, query_lens=qlen)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_engine_tokens_equal_the_reference_backend(mode):
    prompts = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [42] * 20, list(range(30, 70))]
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    outs = {}
    for backend in ("torch", *FAST):
        llm = LLM("tiny", kv_policy="on_demand", kv_capacity_tokens=96, block_size=4, max_model_len=96,
                  preemption_mode=mode, attention_backend=backend, progress=False)
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        assert llm.engine.stats["preemptions"] > 0
    assert outs["torch_batched"] == outs["torch"] and outs["cpu"] == outs["torch"]


def test_cpu_kernel_takes_the_short_queries_and_sdpa_the_prompts():
    """Decodes and drafts (up to SHORT_QUERY tokens) go to the compiled kernel, each longer prompt to
    SDPA; bf16 queries, for which the kernel is not compiled, take SDPA too and still agree."""
    from minipaged.attention.batched import SHORT_QUERY, KernelAttention, _Group, _KernelGroup

    q, k, v, tables, ctx, qlen = random_case(1, 9, 3, 4, [30, 20, 60, 5], [1, SHORT_QUERY, 40, 5])
    plan = KernelAttention(tables, ctx, qlen, 4)
    assert [type(g) for g in plan.groups] == [_KernelGroup, _Group]
    want = paged_attention(q, k, v, tables, ctx, query_lens=qlen)
    torch.testing.assert_close(plan(q, k, v), want, rtol=1e-5, atol=1e-5)
    got = plan(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)


def test_a_backend_that_needs_numba_says_how_to_get_it(monkeypatch):
    import minipaged.attention as attention

    backends = {k: v for k, v in attention._BACKENDS.items() if k not in attention.NEEDS_NUMBA}
    monkeypatch.setattr(attention, "_BACKENDS", backends)
    monkeypatch.setattr(attention, "_load_optional_backends", lambda: None)  # as if numba were missing
    q, k, v, tables, ctx, _ = random_case(0, 9, 3, 4, [5], [1])
    with pytest.raises(ValueError, match=r"backend='numba' needs numba.*pip install -e \"\.\[test\]\""):
        paged_attention(q, k, v, tables, ctx, backend="numba")
