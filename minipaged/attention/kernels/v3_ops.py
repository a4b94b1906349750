"""The device functions v3 is built from, each chosen when the kernel is built: GPU or simulator.

    unpack_word(dst, base, w)   one 8-byte word of the cache -> 4 fp16 or 2 fp32 values, as fp32,
                                into dst[base], dst[base + 1], ...; element 0 sits in the low bits
    group_sum(vals, red_s)      every lane of a lane group (``lanes`` neighbouring threads) ends with
                                the sum over the group of each vals[j]
    exp2(x)                     2**x in fp32
    load_l2(a, i)               a global load that skips the SM's L1 (another block wrote a[i])

Why a choice at build time: numba's CUDA simulator runs kernels as Python and has neither warp
shuffles nor libdevice (its libdevice functions return None), while the real compiler cannot compile
NumPy calls. So the GPU build converts bits with libdevice (``half2float`` is one ``cvt`` instruction)
and sums with ``shfl_xor_sync`` (no barrier, no shared memory); the simulator build converts bits
through a NumPy view and sums through shared memory between two barriers. The shared-memory sum also
compiles for the GPU (``V3Config(reduce="shared")``), so both sums pass the real compiler, and the
simulator checks the shared one against the reference. A test also runs the shuffle sum in the
simulator, with ``shfl_xor_sync`` lent to it (an exchange through a barrier).

Not handled yet: 16-byte loads (numba has no 16-byte integer type to load), bf16.
"""

from __future__ import annotations

import math
from collections import namedtuple
from functools import cache

import numpy as np
from numba import cuda, float32, int16, int32

from minipaged.attention.kernels import using_simulator
from minipaged.attention.kernels.v3_config import V3Config

V3Ops = namedtuple("V3Ops", "unpack_word group_sum exp2 load_l2")
FULL_WARP = 0xFFFFFFFF


def _bit_casts(simulator: bool):
    """(half_from_bits, float_from_bits): 16 or 32 raw bits -> their fp16 or fp32 value, as fp32."""
    if simulator:
        @cuda.jit(device=True)
        def half_from_bits(h):
            return float32(np.array([h], np.uint16).view(np.float16)[0])

        @cuda.jit(device=True)
        def float_from_bits(b):
            return float32(np.array([b], np.uint32).view(np.float32)[0])
    else:
        from numba.cuda import libdevice

        @cuda.jit(device=True)
        def half_from_bits(h):
            return libdevice.half2float(int16(h))

        @cuda.jit(device=True)
        def float_from_bits(b):
            return libdevice.int_as_float(int32(b))
    return half_from_bits, float_from_bits


def _simulator_has_shuffles() -> bool:
    """numba's simulator has none; a test may lend it one (test_backend.py) to run the shuffle sum."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    return hasattr(FakeCUDAModule, "shfl_xor_sync")


@cache
def make_unpack_word(dtype: str, simulator: bool):
    half_from_bits, float_from_bits = _bit_casts(simulator)
    HALVES = dtype == "float16"

    @cuda.jit(device=True)
    def unpack_word(dst, base, w):
        # w: an int64 holding 4 fp16 values (HALVES) or 2 fp32 values; value i is bits 16i..16i+15
        # (or 32i..32i+31): x86 and NVIDIA GPUs are little-endian, so the first value is the low bits
        # exercise 10.3: begin
        if HALVES:
            for i in range(4):
                dst[base + i] = half_from_bits((w >> (16 * i)) & 0xFFFF)
        else:
            dst[base] = float_from_bits(w & 0xFFFFFFFF)
            dst[base + 1] = float_from_bits((w >> 32) & 0xFFFFFFFF)
        # exercise 10.3: end

    return unpack_word


@cache
def make_v3_ops(cfg: V3Config, simulator: bool | None = None) -> V3Ops:
    """The device functions for cfg; simulator=None asks numba which CUDA it runs."""
    sim = using_simulator() if simulator is None else simulator
    if sim and cfg.reduce == "shuffle" and not _simulator_has_shuffles():
        raise ValueError("the simulator has no warp shuffles: build v3 with V3Config(reduce='shared') there")
    L, N = cfg.lanes, cfg.rows * cfg.unroll  # lanes per group; values summed per call

    if cfg.reduce == "shuffle":
        offsets = []
        o = L // 2
        while o:
            offsets.append(o)
            o //= 2
        STEPS = tuple(offsets)  # L/2, L/4, ..., 1: a butterfly inside the group's aligned lanes

        @cuda.jit(device=True)
        def group_sum(vals, red_s):
            for j in range(N):
                x = vals[j]
                for off in STEPS:
                    x += cuda.shfl_xor_sync(FULL_WARP, x, off)
                vals[j] = x
    else:
        @cuda.jit(device=True)
        def group_sum(vals, red_s):
            # red_s [num_threads, N] fp32. Every thread of the block must call this (two barriers).
            tid = cuda.threadIdx.x
            for j in range(N):
                red_s[tid, j] = vals[j]
            cuda.syncthreads()
            first = tid - tid % L
            for j in range(N):
                vals[j] = float32(0.0)
            for i in range(L):  # the outer loop may stay a loop; the inner one unrolls (vals in registers)
                for j in range(N):
                    vals[j] += red_s[first + i, j]
            cuda.syncthreads()  # red_s is written again by the next call

    if sim:
        @cuda.jit(device=True)
        def exp2(x):
            return float32(math.exp2(float(x)))  # exp2(-inf) = 0

        @cuda.jit(device=True)
        def load_l2(a, i):
            return a[i]
    else:
        @cuda.jit(device=True)
        def exp2(x):
            return math.exp2(x)

        @cuda.jit(device=True)
        def load_l2(a, i):
            return cuda.ldcg(a, i)

    return V3Ops(make_unpack_word(cfg.dtype, sim), group_sum, exp2, load_l2)
