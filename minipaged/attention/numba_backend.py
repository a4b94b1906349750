"""The "numba" attention backend: checks the inputs, picks v1, v2 or v3, launches on torch tensors.

    paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale=..., query_lens=...,
                    backend="numba")

On a GPU the kernels read and write the torch CUDA tensors in place (``numba.cuda.as_cuda_array``
wraps their memory through ``__cuda_array_interface__``, no copy) and launch on torch's current stream,
so they order correctly with the surrounding torch ops. CPU tensors on a GPU machine are copied over
and back, for convenience. Under numba's CUDA simulator (no GPU) the kernels take numpy views of CPU
tensors, so the tests and the tiny model run anywhere, slowly.

``paged_attention_numba`` adds knobs the shared signature lacks: ``kernel`` ("auto", "v1", "v2", "v3"),
``allow_untested`` (let "auto" pick v3, which has not run on a GPU yet; the default, None, reads
MINIPAGED_ALLOW_UNTESTED_KERNELS=1 from the environment: see ``config.plan_launch``), ``num_partitions``
and ``max_context_len``/``max_query_len`` (pass them to skip a device-to-host sync, as a serving loop
that already knows its lengths would), ``config`` (v1/v2's sizes) and ``v3_config`` (v3's, e.g.
``V3Config(128, 16, "float16", rows=4, lanes=16, unroll=2)`` to try 16 lanes a key).

Not handled yet: head dims KernelConfig refuses (16, 64 and 128 are tested), ALiBi, sliding windows,
quantized (fp8) caches, bf16.
"""

from __future__ import annotations

import functools
import importlib.util
import sys

import numpy as np
import torch

from minipaged.attention import register_backend
from minipaged.attention.kernels import using_simulator
from minipaged.attention.kernels.config import DEFAULT_NUM_SMS, KernelConfig, LaunchPlan, plan_launch

SUPPORTED_DTYPES = (torch.float16, torch.float32)


def check_inputs(q, k_cache, v_cache, block_tables, context_lens, query_lens) -> None:
    """Shape and dtype checks (no device sync); ValueError naming the field."""
    if q.dim() != 3:
        raise ValueError(f"q must be [num_tokens, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError("k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if q.dtype not in SUPPORTED_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q, k_cache, v_cache must share one dtype among {SUPPORTED_DTYPES}, got "
                         f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache head_dim {k_cache.shape[3]} != q head_dim {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError("block_tables must be [num_seqs, max_blocks] int32, got "
                         f"{tuple(block_tables.shape)} {block_tables.dtype}")
    num_seqs = block_tables.shape[0]
    for name, t in (("context_lens", context_lens), ("query_lens", query_lens)):
        if t is not None and (t.shape != (num_seqs,) or t.dtype != torch.int32):
            raise ValueError(f"{name} must be [num_seqs={num_seqs}] int32, got {tuple(t.shape)} {t.dtype}")
    tensors = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables,
               "context_lens": context_lens, "query_lens": query_lens}
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all inputs must be on one device, got {devices}")
    expected_tokens = num_seqs if query_lens is None else None
    if expected_tokens is not None and q.shape[0] != expected_tokens:
        raise ValueError(f"q has {q.shape[0]} rows but there are {num_seqs} sequences and no query_lens")


def check_values(q, k_cache, block_tables, context_lens, query_lens) -> None:
    """Checks that need the values (a device sync on GPU); ValueError naming the field."""
    ctx = context_lens.cpu()
    qlens = torch.ones_like(ctx) if query_lens is None else query_lens.cpu()
    if bool((qlens < 0).any()) or bool((qlens > ctx).any()):
        raise ValueError(f"query_lens must lie in 0 .. context_lens, got {qlens.tolist()} vs {ctx.tolist()}")
    if bool(((ctx < 1) & (qlens > 0)).any()):
        raise ValueError(f"context_lens must be >= 1 for a sequence with queries, got {ctx.tolist()}")
    if int(qlens.sum()) != q.shape[0]:
        raise ValueError(f"sum(query_lens) = {int(qlens.sum())} must equal q.shape[0] = {q.shape[0]}")
    block_size = k_cache.shape[1]
    blocks_needed = int(((ctx + block_size - 1) // block_size).max()) if len(ctx) else 0
    if blocks_needed > block_tables.shape[1]:
        raise ValueError(f"block_tables has {block_tables.shape[1]} columns; context_lens needs "
                         f"{blocks_needed}")
    in_use = torch.arange(block_tables.shape[1])[None, :] < ((ctx + block_size - 1) // block_size)[:, None]
    used = block_tables.cpu()[in_use]
    if len(used) and (int(used.min()) < 0 or int(used.max()) >= k_cache.shape[0]):
        raise ValueError(f"block_tables entries in use must lie in 0 .. {k_cache.shape[0] - 1}")


@functools.lru_cache(maxsize=64)
def _decode_layout(num_seqs: int, device: torch.device):
    """query_lens = 1 and query_start = i for every sequence; kept, so a decode step launches no
    extra torch kernels to build them."""
    return (torch.ones(num_seqs, dtype=torch.int32, device=device),
            torch.arange(num_seqs, dtype=torch.int32, device=device))


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


class _Launcher:
    """Turns torch tensors into what numba kernels take, and launches them on the right stream.

    Used as a context manager around the launches of one call: on a GPU it makes numba work on the
    tensors' device; under the simulator it shortens Python's thread switch interval, because the
    simulator's block manager busy-waits on its threads (3-4x faster on small blocks).
    """

    SIM_SWITCH_INTERVAL_S = 2e-4

    def __init__(self, device: torch.device):
        from numba import cuda

        self.cuda = cuda
        self.device = device
        self.sim = using_simulator()
        self.stream = 0

    def __enter__(self):
        if self.sim:
            self._saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(self.SIM_SWITCH_INTERVAL_S)
        else:
            self._gpu = self.cuda.gpus[self.device.index or 0]
            self._gpu.__enter__()
            self.stream = self.cuda.external_stream(torch.cuda.current_stream(self.device).cuda_stream)
        return self

    def __exit__(self, *exc):
        if self.sim:
            sys.setswitchinterval(self._saved_interval)
        else:
            self._gpu.__exit__(*exc)
        return False

    def array(self, t: torch.Tensor):
        if self.sim:
            # a view when contiguous (outputs always are: the simulator writes straight into them);
            # the simulator refuses strided arrays, so strided inputs are copied
            return t.detach().contiguous().numpy()
        return self.cuda.as_cuda_array(t.detach(), sync=False)  # same stream as torch: no sync needed

    def launch(self, kernel, grid, threads, *tensors_then_scalars):
        args = [self.array(a) if isinstance(a, torch.Tensor) else a for a in tensors_then_scalars]
        kernel[grid, threads, self.stream](*args)


def paged_attention_numba(q, k_cache, v_cache, block_tables, context_lens, *, scale=None, query_lens=None,
                          kernel="auto", num_partitions=None, max_context_len=None, max_query_len=None,
                          validate=True, config: KernelConfig | None = None, v3_config=None, allow_untested=None):
    """q [num_tokens, num_heads, head_dim] -> out, like the reference; see the module docstring."""
    check_inputs(q, k_cache, v_cache, block_tables, context_lens, query_lens)
    if validate:
        check_values(q, k_cache, block_tables, context_lens, query_lens)
    if scale is None:
        scale = q.shape[-1] ** -0.5

    sim = using_simulator()
    if not sim and q.device.type != "cuda":  # a GPU machine but CPU tensors: copy over and back
        dev = torch.device("cuda")
        out = paged_attention_numba(
            q.to(dev), k_cache.to(dev), v_cache.to(dev), block_tables.to(dev), context_lens.to(dev),
            scale=scale, query_lens=None if query_lens is None else query_lens.to(dev), kernel=kernel,
            num_partitions=num_partitions, max_context_len=max_context_len, max_query_len=max_query_len,
            validate=False, config=config, v3_config=v3_config, allow_untested=allow_untested)
        return out.to(q.device)
    if sim and q.device.type != "cpu":
        raise ValueError("numba runs in its CUDA simulator here (no GPU), which needs CPU tensors")

    device = q.device
    num_seqs = block_tables.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_size = k_cache.shape[1]
    if config is None:
        make = KernelConfig.for_simulator if sim else KernelConfig.for_head_dim
        config = make(head_dim, block_size=block_size)
    cfg = config
    if (cfg.head_dim, cfg.block_size) != (head_dim, block_size):
        raise ValueError(f"config has head_dim={cfg.head_dim}, block_size={cfg.block_size}; the inputs have "
                         f"head_dim={head_dim}, block_size={block_size}")

    if query_lens is None:  # decode: one query per sequence, row i of q
        query_lens, query_start = _decode_layout(num_seqs, device)
        max_query_len = 1
    else:
        query_start = (torch.cumsum(query_lens, 0) - query_lens).to(torch.int32)
    if max_query_len is None:
        max_query_len = int(query_lens.max()) if num_seqs else 0
    if max_context_len is None:
        max_context_len = int(context_lens.max()) if num_seqs else 0
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    if num_seqs == 0 or q.shape[0] == 0:
        return out

    plan = plan_launch(num_seqs, num_kv_heads, group, max_query_len, max_context_len, cfg, _num_sms(device),
                       kernel, num_partitions, dtype=str(q.dtype).removeprefix("torch."), simulator=sim,
                       v3=v3_config, allow_untested=allow_untested)
    if plan.kernel == "v3":
        from minipaged.attention.v3_launch import run_v3

        with _Launcher(device) as launcher:
            run_v3(out, q, k_cache, v_cache, block_tables, context_lens, query_start, query_lens, scale, plan,
                   launcher)
    elif plan.kernel == "v1":
        run_v1(out, q, k_cache, v_cache, block_tables, context_lens, query_start, query_lens, scale, cfg, plan)
    else:
        run_v2(out, q, k_cache, v_cache, block_tables, context_lens, query_start, query_lens, scale, cfg, plan)
    return out


def run_v1(out, q, k_cache, v_cache, block_tables, context_lens, query_start, query_lens, scale, cfg,
           plan: LaunchPlan):
    from minipaged.attention.kernels.v1_group import make_v1_kernel

    grid = plan.grid(block_tables.shape[0], k_cache.shape[2])
    with _Launcher(q.device) as launcher:
        launcher.launch(make_v1_kernel(cfg), grid, cfg.num_threads, out, q, k_cache, v_cache, block_tables,
                        context_lens, query_start, query_lens, np.float32(scale))


def run_v2(out, q, k_cache, v_cache, block_tables, context_lens, query_start, query_lens, scale, cfg,
           plan: LaunchPlan):
    from minipaged.attention.kernels.v2_split import make_v2_kernels

    partition_kernel, merge_kernel = make_v2_kernels(cfg)
    num_tokens, num_heads, head_dim = q.shape
    num_partitions = plan.num_partitions
    f32 = dict(dtype=torch.float32, device=q.device)
    part_out = torch.empty(num_tokens, num_heads, num_partitions, head_dim, **f32)
    part_max = torch.empty(num_tokens, num_heads, num_partitions, **f32)
    part_sum = torch.empty(num_tokens, num_heads, num_partitions, **f32)
    grid = plan.grid(block_tables.shape[0], k_cache.shape[2])
    with _Launcher(q.device) as launcher:
        launcher.launch(partition_kernel, grid, cfg.num_threads, part_out, part_max, part_sum, q, k_cache,
                        v_cache, block_tables, context_lens, query_start, query_lens, np.float32(scale),
                        np.int32(num_partitions), np.int32(plan.partition_tokens))
        launcher.launch(merge_kernel, (num_tokens, num_heads), min(head_dim, 1024), out, part_out, part_max,
                        part_sum)


def paged_attention_numba_backend(q, k_cache, v_cache, block_tables, context_lens, *, scale=None,
                                  query_lens=None):
    """The shared signature, registered as backend "numba"."""
    return paged_attention_numba(q, k_cache, v_cache, block_tables, context_lens, scale=scale,
                                 query_lens=query_lens)


if importlib.util.find_spec("numba") is not None:  # the "test" extra installs it
    register_backend("numba", paged_attention_numba_backend)

__all__ = ["paged_attention_numba", "paged_attention_numba_backend", "check_inputs", "check_values"]
