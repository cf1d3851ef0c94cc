"""Decomposition-runtime and whole-model erase benchmarks (paper §6.1, Table "runtime"; appendix).

Library side of ``workflow_scripts/bench_decomposition.py`` and ``workflow_scripts/bench_erase.py``.

:func:`bench_decomposition` reproduces the paper's setting (float64, Fortran-ordered standard-normal n×n
matrix with a fixed seed; ``scipy.linalg.svd(lapack_driver="gesdd")`` vs ``scipy.linalg.qr(pivoting=True)``
(xGEQP3); warm-up, then the median of timed runs with ``time.perf_counter``) and adds the LoRA-structured
case T = B @ A (B n×r, A r×n) that QR-Erase actually decomposes: dense xGEQP3 on T vs the exact factored
CPQR / SVD of :func:`qrerase.method.linalg.decompose` (O(n r²)).

:func:`bench_whole_model_erase` times the complete streaming pipeline (energy → selection → decompose
forget & retain → forget_update → erase-adapter write) on random adapters with Llama-3-8B / 70B shapes,
in a fresh child interpreter whose own peak RSS (``ru_maxrss`` of RUSAGE_SELF, read by the child
itself at the end) is reported — unlike RUSAGE_CHILDREN this cannot be inflated by other children of
the calling process, and unlike tracemalloc it counts BLAS/LAPACK allocations.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import scipy.linalg as sla

from ..io import atomic_path, write_csv, write_text
from ..method.linalg import decompose, max_sin_theta

__all__ = [
    "ModelShape",
    "MODEL_SHAPES",
    "set_blas_threads",
    "bench_decomposition",
    "runtime_table",
    "runtime_table_markdown",
    "runtime_table_latex",
    "write_runtime_tables",
    "plot_decomposition",
    "bench_whole_model_erase",
    "run_decomposition_benchmark",
    "run_erase_benchmark",
    "DECOMP_COLUMNS",
    "TABLE_COLUMNS",
    "ERASE_COLUMNS",
    "COST_COLUMNS",
    "read_snakemake_benchmark",
    "method_costs",
    "grouped_method_costs",
]

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


# --------------------------------------------------------------------------------------------------
# BLAS threads
# --------------------------------------------------------------------------------------------------


def set_blas_threads(n: int | None) -> int:
    """Best-effort: set the thread count of every loaded OpenBLAS (numpy's and scipy's). Returns how many were set.

    Environment variables (``OPENBLAS_NUM_THREADS``…) only work before numpy is imported; this uses the
    libraries' ``*openblas_set_num_threads*`` entry points instead. No-op for ``n`` None or ≤ 0.
    """
    if not n or n <= 0:
        return 0
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):  # recorded by _threads() and inherited by children
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
        for sym in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_", "openblas_set_num_threads"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn(ctypes.c_int(int(n)))
                done += 1
                break
    return done


def _threads() -> int:
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------------
# Decomposition benchmark
# --------------------------------------------------------------------------------------------------


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
        svd_s = _median_time(lambda: _dense_svd(G), repeats)[0] if do_svd else math.nan
        say(f"n={n}: dense CPQR")
        cpqr_s = _median_time(lambda: _dense_cpqr(G), repeats)[0]
        say(f"n={n}: LoRA dense CPQR")
        lcd_s, (Qd, Rd, pd_) = _median_time(lambda: _dense_cpqr(T), repeats)
        say(f"n={n}: LoRA factored CPQR / SVD")
        fr = max(repeats, fast_repeats)
        lcf_s, dec = _median_time(lambda: decompose(B, A, r, "cpqr", singular_values=False), fr)
        lsf_s = _median_time(lambda: decompose(B, A, r, "svd"), fr)[0]

        same = dec.piv == pd_
        prefix = int(np.argmin(same)) if not same.all() else n
        Td_r = Qd[:, :r] @ Rd[:r]
        Tf_r = (dec.Q @ dec.R)[:, pd_]  # both in the dense pivoted column order
        rows.append(
            {
                "n": n,
                "lora_rank": r,
                "repeats": repeats,
                "threads": _threads(),
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


# --------------------------------------------------------------------------------------------------
# Runtime table (paper layout) and plot
# --------------------------------------------------------------------------------------------------

TABLE_COLUMNS = [
    "Matrix size",
    "SVD (s)",
    "Pivoted QR (s)",
    "Reduction",
    "LoRA dense CPQR (s)",
    "LoRA factored CPQR (s)",
    "LoRA factored SVD (s)",
    "Factored speed-up",
    "Pivots identical",
    "max sin Θ",
]


def runtime_table(df):
    """The paper's runtime table (Matrix size, SVD (s), Pivoted QR (s), Reduction [%]) plus factored columns.

    Numeric values (seconds; Reduction in percent; speed-up as a ratio; pivots as "all"/"first r"/"no");
    the markdown/LaTeX writers format them.
    """
    import pandas as pd

    rows = []
    for _, row in df.sort_values("n").iterrows():
        n = int(row["n"])
        piv = "all" if row["pivots_identical_all"] else ("first r" if row["pivots_identical_first_r"] else "no")
        rows.append(
            {
                "Matrix size": f"{n} × {n}",
                "SVD (s)": row["svd_dense_s"],
                "Pivoted QR (s)": row["cpqr_dense_s"],
                "Reduction": row["svd_reduction_pct"],
                "LoRA dense CPQR (s)": row["lora_cpqr_dense_s"],
                "LoRA factored CPQR (s)": row["lora_cpqr_factored_s"],
                "LoRA factored SVD (s)": row["lora_svd_factored_s"],
                "Factored speed-up": row["factored_speedup"],
                "Pivots identical": piv,
                "max sin Θ": row["max_sin_theta"],
            }
        )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _fmt_seconds(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def _formatted(table) -> list[list[str]]:
    out = []
    for _, row in table.iterrows():
        red = row["Reduction"]
        out.append(
            [
                row["Matrix size"],
                _fmt_seconds(row["SVD (s)"]),
                _fmt_seconds(row["Pivoted QR (s)"]),
                f"{red:.1f}%" if math.isfinite(red) else "n/a",
                _fmt_seconds(row["LoRA dense CPQR (s)"]),
                _fmt_seconds(row["LoRA factored CPQR (s)"]),
                _fmt_seconds(row["LoRA factored SVD (s)"]),
                f"{row['Factored speed-up']:.0f}×",
                row["Pivots identical"],
                f"{row['max sin Θ']:.1e}",
            ]
        )
    return out


def runtime_table_markdown(table) -> str:
    """GitHub-flavoured markdown for :func:`runtime_table`."""
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in _formatted(table)]
    return "\n".join(lines) + "\n"


def runtime_table_latex(table) -> str:
    """A booktabs LaTeX table (paper layout + factored columns) for :func:`runtime_table`."""

    def tex(cell: str, j: int) -> str:
        if j == 0:
            a, _, b = cell.partition(" × ")
            return f"${a} \\times {b}$"
        cell = cell.replace("%", "\\%")
        if cell.endswith("×"):
            return f"${cell[:-1]}\\times$"
        if j == 9 and "e" in cell:
            mant, _, ex = cell.partition("e")
            return f"${mant} \\times 10^{{{int(ex)}}}$"
        return cell

    head = [
        "Matrix Size",
        "SVD (s)",
        "Pivoted QR (s)",
        "Reduction",
        "LoRA dense QR (s)",
        "LoRA factored QR (s)",
        "LoRA factored SVD (s)",
        "Speed-up",
        "Pivots",
        "$\\max\\sin\\Theta$",
    ]
    lines = [
        "\\begin{tabular}{l" + "c" * (len(head) - 1) + "}",
        "\\toprule",
        " & ".join(head) + " \\\\",
        "\\midrule",
    ]
    lines += [" & ".join(tex(c, j) for j, c in enumerate(cells)) + " \\\\" for cells in _formatted(table)]
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_runtime_tables(table, csv_path: str | os.PathLike, md_path: str | os.PathLike, tex_path: str | os.PathLike) -> None:
    """Write :func:`runtime_table` as CSV (numeric), markdown and LaTeX, each atomically."""
    write_csv(csv_path, table)
    write_text(md_path, runtime_table_markdown(table))
    write_text(tex_path, runtime_table_latex(table))


def plot_decomposition(df, path: str | os.PathLike) -> None:
    """Log-log runtime vs matrix size of every timed path (matplotlib Agg), written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = df.sort_values("n")
    fig, ax = plt.subplots(figsize=(6, 4.2))
    series = [
        ("svd_dense_s", "dense SVD (gesdd), Gaussian", "o-"),
        ("cpqr_dense_s", "dense CPQR (xGEQP3), Gaussian", "s-"),
        ("lora_cpqr_dense_s", f"dense CPQR, LoRA T=BA (r={int(d['lora_rank'].iloc[0])})", "s--"),
        ("lora_cpqr_factored_s", "factored CPQR, LoRA", "^-"),
        ("lora_svd_factored_s", "factored SVD, LoRA", "v-"),
    ]
    for col, label, style in series:
        y = d[col].to_numpy(dtype=float)
        ok = np.isfinite(y)
        if ok.any():
            ax.plot(d["n"].to_numpy()[ok], y[ok], style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("matrix size n (n × n)")
    ax.set_ylabel("median runtime (s)")
    ax.set_title("Decomposition runtime (float64, CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=150)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# Whole-model erase benchmark
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Linear-layer shapes of a Llama-style decoder (q, k, v, o, gate, up, down per block)."""

    name: str
    n_blocks: int
    hidden: int
    intermediate: int
    kv_dim: int

    def modules(self) -> list[tuple[str, int, int]]:
        """(module name, d_out, d_in) for every adapted linear layer, in block / name order."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        per_block = [
            ("mlp.down_proj", h, i),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("self_attn.k_proj", kv, h),
            ("self_attn.o_proj", h, h),
            ("self_attn.q_proj", h, h),
            ("self_attn.v_proj", kv, h),
        ]
        return [(f"model.layers.{b}.{m}", d_out, d_in) for b in range(self.n_blocks) for m, d_out, d_in in per_block]


MODEL_SHAPES: dict[str, ModelShape] = {
    "llama3-8b": ModelShape("llama3-8b", n_blocks=32, hidden=4096, intermediate=14336, kv_dim=1024),
    "llama3-70b": ModelShape("llama3-70b", n_blocks=80, hidden=8192, intermediate=28672, kv_dim=1024),
}

ERASE_COLUMNS = [
    "shape",
    "n_blocks",
    "n_modules",
    "n_layers_selected",
    "n_modules_written",
    "localized",
    "lora_rank",
    "rank",
    "method",
    "threads",
    "wall_s",
    "energy_s",
    "generate_s",
    "adapter_mb",
    "baseline_rss_mb",
    "peak_rss_mb",
]


def _factors(seed: int, which: int, index: int, d_out: int, d_in: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic random float32 LoRA factors for module ``index`` of set ``which`` (0 forget, 1 retain)."""
    rng = np.random.default_rng([seed, which, index])
    B = rng.standard_normal((d_out, r), dtype=np.float32)
    A = rng.standard_normal((r, d_in), dtype=np.float32)
    A *= np.float32(1.0 / math.sqrt(d_in))
    return B, A


def _vm_rss_mb() -> float:
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover
        pass
    return math.nan


def _run_erase_pipeline(
    shape: ModelShape,
    lora_rank: int,
    rank: int,
    seed: int,
    method: str,
    retain_rank: int | None,
    localized: bool,
    granularity: str,
    out_dir: str,
) -> dict:
    """The streaming pipeline, in-process. Two passes over the modules; at most one module's factors live at a time."""
    from ..method.energy import energy_from_norms, modules_for_layers, select_layers
    from ..method.erase import EraseAdapterWriter
    from ..method.linalg import LowRank, forget_update

    mods = shape.modules()
    t0 = time.perf_counter()
    gen_s = 0.0
    # pass 1: forget energy (eq. 14) and layer selection (eq. 15)
    norms = {}
    for idx, (name, d_out, d_in) in enumerate(mods):
        g = time.perf_counter()
        B, A = _factors(seed, 0, idx, d_out, d_in, lora_rank)
        gen_s += time.perf_counter() - g
        norms[name] = LowRank(B, A).fro_norm()
    energy = energy_from_norms(norms, granularity)
    selected_layers = select_layers(energy)
    chosen = set(modules_for_layers(selected_layers, norms, granularity)) if localized else set(norms)
    t_energy = time.perf_counter() - t0
    # pass 2: decompose forget & retain, discriminate, reconstruct, stream to the adapter
    k_eff = {name: min(rank, lora_rank, d_out, d_in) for name, d_out, d_in in mods}
    shapes = {name: (d_out, d_in, k_eff[name]) for name, d_out, d_in in mods if name in chosen}
    with EraseAdapterWriter(out_dir, shapes, f"random-{shape.name}") as w:
        for idx, (name, d_out, d_in) in enumerate(mods):
            if name not in chosen:
                continue
            g = time.perf_counter()
            f = _factors(seed, 0, idx, d_out, d_in, lora_rank)
            r_ = _factors(seed, 1, idx, d_out, d_in, lora_rank)
            gen_s += time.perf_counter() - g
            U, V = forget_update(f, r_, k_eff[name], method, retain_rank, 1.0, name=name)
            w.write(name, U, V)
    wall = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in Path(out_dir).iterdir())
    return {
        "shape": shape.name,
        "n_blocks": shape.n_blocks,
        "n_modules": len(mods),
        "n_layers_selected": len(selected_layers),
        "n_modules_written": len(shapes),
        "localized": localized,
        "lora_rank": lora_rank,
        "rank": rank,
        "method": method,
        "wall_s": wall,
        "energy_s": t_energy,
        "generate_s": gen_s,
        "adapter_mb": size / 2**20,
    }


def _child_main(argv: list[str]) -> None:  # pragma: no cover - exercised through a subprocess
    import resource

    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    base_rss = _vm_rss_mb()
    spec["shape"] = ModelShape(**spec["shape"])
    res = _run_erase_pipeline(**spec)
    res["baseline_rss_mb"] = base_rss
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    Path(argv[1]).write_text(json.dumps(res), encoding="utf-8")


def bench_whole_model_erase(
    shape: str | ModelShape = "llama3-8b",
    lora_rank: int = 16,
    rank: int = 16,
    seed: int = 0,
    *,
    method: str = "cpqr",
    retain_rank: int | None = None,
    localized: bool = False,
    granularity: str = "block",
    threads: int | None = None,
    isolate: bool = True,
) -> dict:
    """Wall time and peak RSS of the full QR-Erase pipeline on random adapters with a model's shapes.

    Parameters
    ----------
    shape : "llama3-8b" | "llama3-70b" | ModelShape
        Llama-3-8B: 32 blocks, hidden 4096, intermediate 14336, k/v 1024; 70B: 80, 8192, 28672, 1024.
    lora_rank, rank : int
        LoRA r of the random forget/retain adapters and the decomposition rank k (capped at r).
    seed : int
        Factors of module i of set s come from ``default_rng([seed, s, i])`` (float32; B ~ N(0, 1),
        A ~ N(0, 1/d_in)).
    localized : bool
        Write only the modules of the layers selected by eq. 15 (default: all modules, the worst case;
        energy and selection are computed either way).
    isolate : bool
        Run in a fresh child interpreter (``python -c``) and report ITS peak RSS
        (``getrusage(RUSAGE_SELF).ru_maxrss`` read by the child at the end: the high-water mark of the
        whole process, interpreter and numpy/scipy included; ``baseline_rss_mb`` is its RSS before the
        pipeline started). ``isolate=False`` runs in-process and reports NaN for memory.

    Returns
    -------
    dict
        shape, n_blocks, n_modules, n_layers_selected, n_modules_written, localized, lora_rank, rank,
        method, wall_s (pipeline only: both passes incl. factor generation and the adapter write),
        energy_s (pass 1), generate_s (time spent generating random factors), adapter_mb,
        baseline_rss_mb, peak_rss_mb, threads.
    """
    if isinstance(shape, str):
        if shape not in MODEL_SHAPES:
            raise ValueError(f"unknown model shape {shape!r}; choose from {sorted(MODEL_SHAPES)}")
        shape = MODEL_SHAPES[shape]
    spec = {
        "shape": dataclasses.asdict(shape),
        "lora_rank": int(lora_rank),
        "rank": int(rank),
        "seed": int(seed),
        "method": method,
        "retain_rank": retain_rank,
        "localized": bool(localized),
        "granularity": granularity,
    }
    with tempfile.TemporaryDirectory(prefix="qrerase-bench-") as tmp:
        spec["out_dir"] = str(Path(tmp) / "erase_adapter")
        if not isolate:
            s = dict(spec, shape=shape)
            res = _run_erase_pipeline(**s)
            res.update(baseline_rss_mb=math.nan, peak_rss_mb=math.nan)
        else:
            spec_path, res_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            env = dict(os.environ)
            if threads:
                for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                    env[var] = str(int(threads))
            code = "import sys; from qrerase.bench.runtime import _child_main; _child_main(sys.argv[1:])"
            proc = subprocess.run([sys.executable, "-c", code, str(spec_path), str(res_path)], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"whole-model erase benchmark ({shape.name}) failed:\n{proc.stderr[-4000:]}")
            res = json.loads(res_path.read_text(encoding="utf-8"))
    res["threads"] = int(threads) if threads else _threads()
    return res


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
        list(sizes), lora_rank=lora_rank, repeats=repeats, seed=seed,
        max_dense_svd=max_dense_svd or None, progress=progress,
    )
    write_csv(out_csv, df)
    plot_decomposition(df, out_plot)
    write_runtime_tables(runtime_table(df), table_csv, table_md, table_tex)
    return df


def run_erase_benchmark(
    model_shapes: Iterable[str],
    out_csv: str | os.PathLike,
    *,
    lora_rank: int = 16,
    seed: int = 0,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
):
    """Run :func:`bench_whole_model_erase` for each shape (k = r) and write one CSV row per shape."""
    import pandas as pd

    rows = []
    for shape in model_shapes:
        if progress:
            progress(f"whole-model erase: {shape}")
        rows.append(bench_whole_model_erase(shape, lora_rank=lora_rank, rank=lora_rank, seed=seed, threads=threads))
    frame = pd.DataFrame(rows, columns=ERASE_COLUMNS)
    write_csv(out_csv, frame)
    return frame


# --------------------------------------------------------------------------------------------------
# Per-method cost from Snakemake benchmark files (the TOFU table's companion)
# --------------------------------------------------------------------------------------------------

#: Cost components (seconds of wall time) of :func:`method_costs`, then the derived columns.
COST_COLUMNS = ("lora_s", "task_matrices_s", "erase_s", "baseline_s", "unlearn_s", "total_s")


def read_snakemake_benchmark(path: str | os.PathLike) -> float:
    """Wall-clock seconds of one job from its Snakemake ``benchmark:`` TSV (column ``s``; the mean
    when the job was benchmarked repeatedly). It covers the whole job: interpreter start-up, imports,
    loading inputs, the work and writing outputs. A clear ``ValueError`` on a missing or bad file."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: benchmark file not found")
    try:
        frame = pd.read_csv(p, sep="\t")
    except Exception as exc:  # pandas raises several parser errors
        raise ValueError(f"{path}: not a Snakemake benchmark file ({exc})") from exc
    if "s" not in frame.columns or frame.empty:
        raise ValueError(f"{path}: not a Snakemake benchmark file (expected a tab-separated 's' column)")
    value = float(pd.to_numeric(frame["s"], errors="coerce").mean())
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{path}: invalid wall time {frame['s'].tolist()}")
    return value


def method_costs(components: dict[str, dict[str, list]]):
    """Per-method wall time from benchmark files: one row per method, columns :data:`COST_COLUMNS`.

    ``components`` maps method -> component -> list of benchmark files, components among
    ``lora_s`` (LoRA task-adapter training), ``task_matrices_s`` (T = s·B·A extraction),
    ``erase_s`` (the closed-form subspace steps: factors, energy, forget update, erase) and
    ``baseline_s`` (a baseline's training job). A component is the sum of its files' seconds; absent
    or empty components are NaN. Derived: ``unlearn_s`` = the unlearning step given the fine-tuned
    model (``erase_s`` for subspace methods, ``baseline_s`` for baselines); ``total_s`` = the sum of
    all components (a job shared by several methods counts fully for each).
    """
    import pandas as pd

    known = set(COST_COLUMNS[:4])
    rows = []
    for method, parts in components.items():
        unknown = sorted(set(parts) - known)
        if unknown:
            raise ValueError(f"method_costs: {method}: unknown component(s) {unknown}; expected {sorted(known)}")
        row = {"method": method}
        for col in COST_COLUMNS[:4]:
            files = parts.get(col) or []
            row[col] = sum(read_snakemake_benchmark(f) for f in files) if files else float("nan")
        unlearn = row["baseline_s"] if "baseline_s" in parts else row["erase_s"]
        row["unlearn_s"] = unlearn
        present = [row[c] for c in COST_COLUMNS[:4] if math.isfinite(row[c])]
        row["total_s"] = sum(present) if present else float("nan")
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", *COST_COLUMNS])


def grouped_method_costs(groups: dict[str, dict[str, dict[str, list]]], group_column: str):
    """:func:`method_costs` of several experiments of one track, stacked: ``groups`` maps a group
    (the cross-lingual unlearning language, the speech setting) to that experiment's ``components``;
    the frame gets a ``group_column`` after ``method``, rows grouped in the order of ``groups``."""
    import pandas as pd

    if not groups:
        raise ValueError("grouped_method_costs: no groups")
    frames = []
    for group, components in groups.items():
        frame = method_costs(components)
        frame.insert(1, group_column, str(group))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
