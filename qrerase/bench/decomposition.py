"""Decomposition-runtime benchmark (paper §6.1, Table "runtime").

Library side of ``workflow_scripts/studies/bench_decomposition.py``. :func:`bench_decomposition` reproduces the
paper's setting (float64, Fortran-ordered standard-normal n×n matrix with a fixed seed;
``scipy.linalg.svd(lapack_driver="gesdd")`` vs ``scipy.linalg.qr(pivoting=True)`` (xGEQP3); warm-up,
then the median of timed runs with ``time.perf_counter``) and adds the LoRA-structured case T = B @ A
(B n×r, A r×n) that QR-Erase actually decomposes: dense xGEQP3 on T vs the exact factored CPQR / SVD of
:func:`qrerase.method.decompose.decompose` (O(n r²)). The paper-layout table and the plot are
:mod:`qrerase.reports.runtime`.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np
import scipy.linalg as sla

from ..io import write_csv
from ..method.decompose import decompose
from ..method.diagnostics import max_sin_theta
from ..reports.runtime import plot_decomposition, runtime_table, write_runtime_tables
from .threads import blas_threads

__all__ = ["DECOMP_COLUMNS", "bench_decomposition", "run_decomposition_benchmark"]

DECOMP_COLUMNS = [
    "n",
    "lora_rank",
    "repeats",
    "threads",
    "svd_dense_s",
    "cpqr_dense_s",
    "svd_reduction_pct",
    "svd_over_cpqr",
    "lora_cpqr_dense_s",
    "lora_cpqr_factored_s",
    "lora_svd_factored_s",
    "factored_speedup",
    "pivots_identical_first_r",
    "pivots_identical_all",
    "pivots_common_prefix",
    "max_sin_theta",
    "rel_diff_tk",
]


def _median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _dense_svd(M: np.ndarray):
    return sla.svd(M, lapack_driver="gesdd", check_finite=False)


def _dense_cpqr(M: np.ndarray):
    return sla.qr(M, pivoting=True, mode="economic", check_finite=False)


def bench_decomposition(
    sizes: Iterable[int],
    lora_rank: int = 16,
    repeats: int = 3,
    seed: int = 0,
    *,
    max_dense_svd: int | None = None,
    fast_repeats: int = 7,
    warmup_size: int = 256,
    progress: Callable[[str], None] | None = None,
):
    """Runtime of dense SVD / CPQR and of factored CPQR / SVD of LoRA-structured task matrices.

    Parameters
    ----------
    sizes : iterable of int
        Square sizes n.
    lora_rank : int
        r of the LoRA-structured matrices T = B @ A (B n×r, A r×n, standard normal, float64, Fortran order).
    repeats : int
        Timed runs of each dense decomposition; the median is reported.
    seed : int
        Matrices for size n come from ``numpy.random.default_rng([seed, n])``.
    max_dense_svd : int, optional
        Skip the dense SVD (report NaN) for n > max_dense_svd — it dominates the run time at 8192.
    fast_repeats : int
        Timed runs of the factored paths (milliseconds each): ``max(repeats, fast_repeats)``.
    warmup_size : int
        Before timing each size, every routine is run once on a min(n, warmup_size)-sized instance
        (initialises LAPACK workspaces and the BLAS thread pool without a full-size extra run).

    Returns
    -------
    pandas.DataFrame
        One row per n with the columns of ``DECOMP_COLUMNS``: ``*_s`` median seconds;
        ``svd_reduction_pct`` = 100·(1 − cpqr/svd) and ``svd_over_cpqr`` on the Gaussian matrix;
        ``factored_speedup`` = dense CPQR / factored CPQR on the LoRA matrix (both produce Q, R and the
        pivots; the factored CPQR is timed without its optional singular values); pivot agreement of the
        factored vs dense CPQR (first r pivots; all n pivots — beyond rank r the dense pivots are
        decided by rounding noise; length of the common prefix); ``max_sin_theta`` between the two rank-r
        subspaces (eq. 11) and ``rel_diff_tk`` = ‖T_r,dense − T_r,factored‖_F / ‖T‖_F.
    """
    import pandas as pd

    r = int(lora_rank)
    if r <= 0 or repeats <= 0:
        raise ValueError(f"lora_rank and repeats must be positive, got {lora_rank}, {repeats}")
    rows = []
    for n in sizes:
        n = int(n)
        if n < r:
            raise ValueError(f"size n={n} is smaller than lora_rank={r}")
        say = progress or (lambda msg: None)
        rng = np.random.default_rng([seed, n])
        G = np.asfortranarray(rng.standard_normal((n, n)))
        B = np.asfortranarray(rng.standard_normal((n, r)))
        A = np.asfortranarray(rng.standard_normal((r, n)))
        T = np.asfortranarray(B @ A)
        do_svd = max_dense_svd is None or n <= max_dense_svd

        w = min(n, warmup_size)
        if do_svd:
            _dense_svd(G[:w, :w].copy(order="F"))
        _dense_cpqr(G[:w, :w].copy(order="F"))
        decompose(B[:w], A[:, :w], min(r, w), "cpqr")
        decompose(B[:w], A[:, :w], min(r, w), "svd")

        say(f"n={n}: dense SVD" if do_svd else f"n={n}: dense SVD skipped")
        svd_s = _median_time(partial(_dense_svd, G), repeats)[0] if do_svd else math.nan
        say(f"n={n}: dense CPQR")
        cpqr_s = _median_time(partial(_dense_cpqr, G), repeats)[0]
        say(f"n={n}: LoRA dense CPQR")
        lcd_s, (Qd, Rd, pd_) = _median_time(partial(_dense_cpqr, T), repeats)
        say(f"n={n}: LoRA factored CPQR / SVD")
        fr = max(repeats, fast_repeats)
        lcf_s, dec = _median_time(partial(decompose, B, A, r, "cpqr", singular_values=False), fr)
        lsf_s = _median_time(partial(decompose, B, A, r, "svd"), fr)[0]

        same = dec.piv == pd_
        prefix = int(np.argmin(same)) if not same.all() else n
        Td_r = Qd[:, :r] @ Rd[:r]
        Tf_r = (dec.Q @ dec.R)[:, pd_]  # both in the dense pivoted column order
        rows.append(
            {
                "n": n,
                "lora_rank": r,
                "repeats": repeats,
                "threads": blas_threads(),
                "svd_dense_s": svd_s,
                "cpqr_dense_s": cpqr_s,
                "svd_reduction_pct": 100.0 * (1.0 - cpqr_s / svd_s) if do_svd else math.nan,
                "svd_over_cpqr": svd_s / cpqr_s if do_svd else math.nan,
                "lora_cpqr_dense_s": lcd_s,
                "lora_cpqr_factored_s": lcf_s,
                "lora_svd_factored_s": lsf_s,
                "factored_speedup": lcd_s / lcf_s,
                "pivots_identical_first_r": bool(same[:r].all()),
                "pivots_identical_all": bool(same.all()),
                "pivots_common_prefix": prefix,
                "max_sin_theta": max_sin_theta(Qd[:, :r], dec.Q),
                "rel_diff_tk": float(np.linalg.norm(Td_r - Tf_r) / np.linalg.norm(T)),
            }
        )
        del G, T, Qd, Rd
    return pd.DataFrame(rows, columns=DECOMP_COLUMNS)


def run_decomposition_benchmark(
    sizes: Iterable[int],
    out_csv: str | os.PathLike,
    out_plot: str | os.PathLike,
    table_csv: str | os.PathLike,
    table_md: str | os.PathLike,
    table_tex: str | os.PathLike,
    *,
    lora_rank: int = 16,
    repeats: int = 3,
    seed: int = 0,
    max_dense_svd: int | None = None,
    progress: Callable[[str], None] | None = None,
):
    """Run :func:`bench_decomposition` and write its CSV, plot and the paper-layout runtime table."""
    df = bench_decomposition(
        list(sizes),
        lora_rank=lora_rank,
        repeats=repeats,
        seed=seed,
        max_dense_svd=max_dense_svd or None,
        progress=progress,
    )
    write_csv(out_csv, df)
    plot_decomposition(df, out_plot)
    write_runtime_tables(runtime_table(df), table_csv, table_md, table_tex)
    return df
