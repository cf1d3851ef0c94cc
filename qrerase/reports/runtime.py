"""The paper's runtime table (Table "runtime", plus the factored-CPQR columns) and the decomposition plot.

Inputs are the frames of :func:`qrerase.bench.decomposition.bench_decomposition`.
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..io import atomic_path, write_csv, write_text

__all__ = [
    "TABLE_COLUMNS",
    "runtime_table",
    "runtime_table_markdown",
    "runtime_table_latex",
    "write_runtime_tables",
    "plot_decomposition",
]


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


def write_runtime_tables(
    table, csv_path: str | os.PathLike, md_path: str | os.PathLike, tex_path: str | os.PathLike
) -> None:
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
