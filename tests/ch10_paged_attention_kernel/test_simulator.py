"""The CUDA simulator itself: a block's threads must share one copy of each shared array."""

import sys
import threading

import numpy as np
import pytest


def _arrays_made_by_threads_arriving_together(shared, num_threads=32):
    go = threading.Barrier(num_threads)
    got = [None] * num_threads

    def thread(i):
        go.wait()  # all threads ask at once, as a block's threads do at the top of a kernel
        got[i] = shared.array((3, 64), np.float32)

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(num_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_threads_arriving_together_share_one_array(numba_cuda):
    """Without the lock minipaged adds (kernels._one_shared_array_per_line), about one trial in ten
    hands the block two arrays here; 100 trials with a short thread switch interval."""
    from minipaged.attention.kernels import using_simulator

    if not using_simulator():
        pytest.skip("the simulator's shared arrays; a GPU has real ones")
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        copies = [len({id(a) for a in _arrays_made_by_threads_arriving_together(FakeCUDAShared(0))})
                  for _ in range(100)]
    finally:
        sys.setswitchinterval(saved)
    assert max(copies) == 1, f"a block got {max(copies)} copies of one shared array"


def test_two_lines_two_arrays(numba_cuda):
    from minipaged.attention.kernels import using_simulator

    if not using_simulator():
        pytest.skip("the simulator's shared arrays; a GPU has real ones")
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    shared = FakeCUDAShared(0)
    a = shared.array((4,), np.float32)
    b = shared.array((2, 2), np.int32)
    assert a is not b and a.shape == (4,) and b.dtype == np.int32
