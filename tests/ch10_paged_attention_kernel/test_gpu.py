"""The same comparisons on a real GPU, on torch CUDA tensors, with the GPU sizes and longer contexts.

Skipped (with the reason shown by -ra) where torch sees no GPU. scripts/gpu_check.sh runs them.
"""

import pytest
import torch

from minipaged.attention.bench_kernels import random_paged_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch.cuda.is_available() is False); run scripts/gpu_check.sh "
                              "on a GPU machine"),
]

CONTEXTS = [1, 15, 16, 17, 1000, 4099]
GQA = {1: (8, 8), 3: (9, 3), 4: (32, 8)}


def gpu_batch(gqa, head_dim, dtype, contexts=CONTEXTS, query_lens=None, seed=0):
    heads, kv_heads = GQA[gqa]
    return random_paged_batch(contexts, query_lens, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                              dtype=dtype, device="cuda", seed=seed, share_first_block=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 3, 4])
@pytest.mark.parametrize("kernel,parts", [("auto", None), ("v1", None), ("v2", 2), ("v2", 7)])
def test_decode_on_gpu(compare, kernel, parts, gqa, head_dim, dtype):
    compare(gpu_batch(gqa, head_dim, dtype), kernel=kernel, num_partitions=parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kernel,parts", [("v1", None), ("v2", 3)])
def test_multi_token_queries_on_gpu(compare, kernel, parts, dtype):
    b = gpu_batch(4, 128, dtype, contexts=[300, 517, 64, 9, 2000], query_lens=[300, 100, 5, 1, 0])
    compare(b, kernel=kernel, num_partitions=parts)


def test_no_copies_and_torch_stream(numba_cuda):
    """numba sees the tensor's own memory, and the kernels run on torch's current stream."""
    from minipaged.attention import paged_attention

    b = gpu_batch(3, 64, torch.float16, contexts=[700, 33])
    assert numba_cuda.as_cuda_array(b["k_cache"]).__cuda_array_interface__["data"][0] == b["k_cache"].data_ptr()
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    ref = paged_attention(*args, backend="torch")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = paged_attention(*args, backend="numba")
        out2 = out * 1  # queued behind the kernel on the same stream: sees its result
    side.synchronize()
    assert out.device.type == "cuda"
    torch.testing.assert_close(out2.float(), ref.float(), atol=2e-3, rtol=2e-3)
