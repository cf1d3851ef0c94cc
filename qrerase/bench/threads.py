"""BLAS thread control of the benchmarks: the thread count is part of every timing."""

from __future__ import annotations

import ctypes
import os

__all__ = ["set_blas_threads", "blas_threads"]


def set_blas_threads(n: int | None) -> int:
    """Best-effort: set the thread count of every loaded OpenBLAS (numpy's and scipy's). Returns how many were set.

    Environment variables (``OPENBLAS_NUM_THREADS``…) only work before numpy is imported; this uses the
    libraries' ``*openblas_set_num_threads*`` entry points instead. No-op for ``n`` None or ≤ 0.
    """
    if not n or n <= 0:
        return 0
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):  # recorded by blas_threads() and inherited by children
        os.environ[var] = str(int(n))
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            libs = sorted({ln.split()[-1] for ln in fh if "openblas" in ln.lower() and ".so" in ln})
    except OSError:  # pragma: no cover - non-Linux
        return 0
    done = 0
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:  # pragma: no cover
            continue
        for sym in (
            "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_",
            "openblas_set_num_threads",
        ):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(ctypes.c_int(int(n)))
                done += 1
                break
    return done


def blas_threads() -> int:
    """The BLAS thread count the benchmarks run with: ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS``, else
    the CPU count."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return os.cpu_count() or 1
