"""Used only by scripts/gpu_check.sh, which puts this folder first on PYTHONPATH.

The GPU machine's image pairs numba-cuda 0.30.4 with numpy 2.5, which no longer has ``numpy.row_stack``;
numba-cuda registers an overload for it, so ``import numba.cuda`` fails there. When numpy lacks it,
give it back as what it always was: ``numpy.vstack``. Never fails the interpreter's start: if numpy
cannot be imported here, nothing is done.
"""

try:
    import numpy as _np

    if not hasattr(_np, "row_stack"):
        def row_stack(tup, *, dtype=None, casting="same_kind"):
            return _np.vstack(tup, dtype=dtype, casting=casting)

        _np.row_stack = row_stack
except Exception as _e:  # noqa: BLE001  (a broken numpy is reported by whoever imports it next)
    import sys

    print(f"gpu_shim/sitecustomize: numpy.row_stack not patched ({type(_e).__name__}: {_e})", file=sys.stderr)
