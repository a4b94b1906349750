"""numba.cuda PagedAttention kernels, from plain to clever, each checked against the PyTorch reference.

    config.py    compile-time sizes and the v1/v2 rule (pure Python)
    tile_ops.py  the device functions every kernel is built from: stage a K/V tile in shared memory,
                 score it, take one online-softmax step, accumulate V
    v1_group.py  v1: one block per (sequence, KV head, row tile); K and V are read once per head group
    v2_split.py  v2: v1's work split along the context into partitions, then a merge kernel
    v3_config.py v3's sizes, its split and the model behind kernel="auto" (pure Python)
    v3_ops.py    v3's device functions, chosen at build time: GPU (shuffles, libdevice) or simulator
    v3_wide.py   v3: 8-byte loads, lane groups summing with shuffles, registers instead of shared
                 memory, partitions merged by the last block in the same launch
    ptx.py       every kernel compiled to PTX for a chosen GPU, with no GPU

Host code (choosing a kernel, launching on torch tensors) is in ``minipaged.attention.numba_backend``
and, for v3, ``minipaged.attention.v3_launch``.

Which CUDA numba uses is fixed when numba is first imported: a real GPU, or the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``), which runs kernels in Python threads on the CPU. Importing this package
picks the simulator when torch sees no GPU and the variable is unset, so the kernels run anywhere;
set ``NUMBA_ENABLE_CUDASIM=0`` beforehand to get the real ``numba.cuda`` (e.g. for ``compile_ptx``
on a machine without a GPU). Nothing here imports numba until a kernel module is imported.
"""

from __future__ import annotations

import os
import sys


def _pick_cuda_target() -> None:
    if "numba" in sys.modules or "NUMBA_ENABLE_CUDASIM" in os.environ:
        return  # already decided (numba reads the variable once, at import)
    import torch

    if not torch.cuda.is_available():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


_pick_cuda_target()


def using_simulator() -> bool:
    """True when numba runs kernels in its CUDA simulator (imports numba); then also makes sure the
    simulator's shared arrays are safe to create from many threads at once (see below)."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        return False
    _one_shared_array_per_line()
    return True


def _one_shared_array_per_line() -> None:
    """The simulator runs a block's threads as Python threads, and each thread's ``cuda.shared.array``
    call looks the block's array up by the caller's file and line, creating it if it is missing. In
    numba-cuda 0.30 that look-up and the creation are two steps with no lock between them: two threads
    that arrive together can each create an array, and the block then holds two copies of what should
    be one. A thread writes its part into one copy, another reads the other copy: uninitialized values
    in the output, rarely, and more often on a busy machine. This replaces the method with one that
    looks up and creates under a lock (tests/ch10_paged_attention_kernel/test_simulator.py starts 32
    threads together and checks that they all get the same array)."""
    import threading

    import numpy as np
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    if getattr(FakeCUDAShared, "minipaged_locked", False):
        return
    unlocked = FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return unlocked(self, shape, dtype, alignment)  # dynamic shared memory: one buffer already
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            found = self._allocations.get(key)
            if found is None:
                found = self._allocations[key] = np.empty(shape, _numpy_dtype(dtype))
        return found

    FakeCUDAShared.array = array
    FakeCUDAShared.minipaged_locked = True


def _numpy_dtype(dtype):
    from numba.cuda import types
    from numba.cuda.np import numpy_support

    return numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
