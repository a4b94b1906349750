"""Building the compiled CPU kernels (minipaged/csrc/cpu_ops.cpp) once per machine, and loading them.

The first ``load()`` on a machine compiles the C++ file with the machine's C++ compiler (about 20 s)
into a folder under MINIPAGED_CACHE (default ~/.cache/minipaged) named by a hash of the source, the
flags, the Python and torch versions and the CPU's feature flags; every later process loads that
library. A lock file keeps two processes from building at once (one older than STALE_LOCK_SECONDS
belongs to a build that died). Without a compiler, or if the build fails, it warns once and returns
None: every operation then takes the PyTorch path, with the same results, more slowly.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "cpu_ops.cpp"
# -march=native: the vector instructions of the machine that builds it (AVX2 and FMA here), which is the
# machine that runs it. -fopenmp: at::parallel_for then runs on PyTorch's OpenMP threads (the library
# loads the OpenMP runtime torch has already loaded, not a second one).
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp"]

STALE_LOCK_SECONDS = 600  # a build takes about 20 s; a lock this old belongs to a build that died
def build_dir() -> Path:
    from minipaged.model.fetch import cache_dir

    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode() + sys.version.encode()
                         + torch.__version__.encode() + platform.machine().encode() + _cpu_flags()).hexdigest()[:16]
    return cache_dir() / "cpu_ops" / key


def load():
    """torch.ops.minipaged with the kernels registered, built here first if need be; None when they
    cannot be built (a warning says why)."""
    if _registered():  # loaded earlier in this process (a library registers its names once per process)
        return torch.ops.minipaged
    try:
        where = build_dir()
        library, lock = where / "minipaged_cpu_ops.so", where / "lock"
        if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            lock.unlink(missing_ok=True)  # left by a build that was killed: nobody would ever release it
        if library.exists() and not lock.exists():  # built before, and no build under way
            try:
                torch.ops.load_library(str(library))
                return torch.ops.minipaged
            except OSError:  # a damaged file (a build cut short): build it again
                library.unlink(missing_ok=True)
        from torch.utils import cpp_extension

        where.mkdir(parents=True, exist_ok=True)
        source = where / SOURCE.name  # builds name this copy, so every checkout of the same source shares them
        if not source.exists() or source.read_bytes() != SOURCE.read_bytes():
            partial = source.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(SOURCE.read_bytes())
            partial.replace(source)
        if not library.exists():
            print(f"minipaged: compiling the CPU kernels ({SOURCE.name}), once per machine, about 20 s ...",
                  file=sys.stderr, flush=True)
        cpp_extension.load(name="minipaged_cpu_ops", sources=[str(source)], build_directory=str(where),
                           extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        return torch.ops.minipaged
    except Exception as err:  # no compiler, no ninja, a failed build: the PyTorch path still works
        lines = str(err).strip().splitlines() or [""]
        why = next((line for line in lines if "error" in line), lines[-1])  # the compiler's first error
        warnings.warn(f"minipaged: the compiled CPU kernels are not available ({type(err).__name__}: "
                      f"{why.strip()}); the model runs its "
                      "PyTorch code instead, with the same results, more slowly. They need a C++ compiler "
                      "(apt-get install g++) and ninja (pip install ninja).", RuntimeWarning, stacklevel=3)
        return None


def _registered() -> bool:
    return hasattr(torch.ops.minipaged, "paged_attention")


def _cpu_flags() -> bytes:
    """The CPU's feature flags: -march=native code built on one CPU may not run on another that shares
    the cache folder."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            return next((line for line in f if line.startswith(b"flags")), b"")
    except OSError:
        return platform.processor().encode()
