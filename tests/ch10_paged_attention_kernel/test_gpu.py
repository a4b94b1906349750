"""The same comparisons on a real GPU, on torch CUDA tensors, with the GPU sizes and longer contexts.

Skipped (with the reason shown by -ra) where torch sees no GPU. scripts/gpu_check.sh runs them.
"""

import pytest
import torch

from minipaged.lab.kernels.check import device_check_cases, random_paged_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch.cuda.is_available() is False); run scripts/gpu_check.sh "
                              "on a GPU machine"),
]

CASES = list(device_check_cases())


@pytest.mark.parametrize("name,batch_args,options", CASES, ids=[c[0] for c in CASES])
def test_on_gpu(compare, name, batch_args, options):
    compare(random_paged_batch(**batch_args, device="cuda"), **options)


def test_no_copies_and_torch_stream(numba_cuda):
    """numba sees the tensor's own memory, and the kernels run on torch's current stream."""
    from minipaged.attention import paged_attention

    b = random_paged_batch([700, 33], num_heads=9, num_kv_heads=3, head_dim=64, dtype=torch.float16,
                           device="cuda")
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


def test_v3_makes_its_device_views_once(numba_cuda):
    """The host side of v3: a second call with the same tensors finds every device view made."""
    from minipaged.attention.numba_backend import paged_attention_numba
    from minipaged.attention.v3_launch import DEVICE_VIEWS

    b = random_paged_batch([700, 33], num_heads=9, num_kv_heads=3, head_dim=64, dtype=torch.float16,
                           device="cuda")
    args = (b["q"], b["k_cache"], b["v_cache"], b["block_tables"], b["context_lens"])
    out = paged_attention_numba(*args, kernel="v3", max_context_len=700, max_query_len=1, validate=False)
    made = DEVICE_VIEWS.made
    again = paged_attention_numba(*args, kernel="v3", max_context_len=700, max_query_len=1, validate=False)
    torch.cuda.synchronize()
    assert DEVICE_VIEWS.made - made <= 1  # at most the new output, if the allocator moved it
    torch.testing.assert_close(again, out)
