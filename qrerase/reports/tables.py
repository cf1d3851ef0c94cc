"""Paper-layout result tables (CSV + Markdown + LaTeX), shared by all tracks.

The tables of each track are built in :mod:`qrerase.tracks.tofu.tables`, :mod:`qrerase.tracks.task_level.tables`,
:mod:`qrerase.tracks.crosslingual.tables`, :mod:`qrerase.tracks.speech.tables` and :mod:`qrerase.reports.cost`;
this module renders and writes them.

A table is a pandas DataFrame with one row per model/method (a label column, by default
``method``) and numeric metric columns, plus a :class:`TableSpec` saying which columns to show and
how. :func:`write_table` writes three files, each atomically, byte-identical for the same input:

CSV (raw numbers)
    Columns, in this order: the label column (raw keys as given), ``display_label`` (the shown
    label), ``reference`` (1 for reference rows, 0 otherwise), then every spec column at full
    precision (shortest round-trip ``repr`` of the float; empty when missing), then one
    ``<column>_mark`` per ranked column holding ``best``, ``second``, ``degenerate`` (see below) or an
    empty string. Rows in the displayed order (reference rows first).
Markdown
    A GitHub table. Best per column is ``**x**``, second best ``<u>x</u>``; a ✓ follows a value
    that passes its ``check_threshold`` (not a degenerate cell's). With column groups, the header
    row holds the group names (in the first column of each span) and the column headers follow as
    the first, bold, row.
LaTeX
    A ``table`` (or ``table*``) float with a booktabs ``tabular`` (needs ``booktabs``; checkmarks
    need ``amssymb``). Best ``\\textbf{x}``, second ``\\underline{x}``, passing values get
    ``$^{\\checkmark}$``. Reference rows come first, followed by a ``\\midrule``. Column groups render
    as ``\\multicolumn{n}{c}{\\textbf{Group}}`` with ``\\cmidrule(lr){a-b}`` below.

Degenerate cells (``TableSpec.degenerate``: a model whose utility collapsed, :func:`degenerate_utility`)
are not ranked and get no ✓; Markdown and LaTeX print ``(degenerate)`` after the value, the CSV mark
is ``degenerate``.

Ranking: per column, among the non-reference, non-degenerate rows with a finite value, in the column's direction
(:attr:`Column.direction`: ``higher``, ``lower`` or ``target`` = closest to :attr:`Column.target`, as
:func:`qrerase.metrics.registry.distance_to_ideal`; ``None`` = not ranked). Values that print
identically (same formatted text; for a target column the same printed distance to the target) are
ties and are all marked; the second-best mark goes to the next distinct printed value. Headers of
ranked columns end in ↑ / ↓, or ``(→ t)`` for a target ``t``.

Modules: :mod:`qrerase.reports.table_spec` (:class:`Column`, :class:`TableSpec`, formatting,
ranking), :mod:`qrerase.reports.table_render` (Markdown, LaTeX); this one writes the files.

Value formats: a ``str.format`` pattern such as ``'{:.4f}'``, or ``'sci'`` (for p-values):
values with ``sci_threshold <= |x| < 1e4`` print with 3 significant digits (``0.257``,
``0.0291``), smaller ones as ``1.433e-22`` in Markdown and ``$1.433{\\times}10^{-22}$`` in LaTeX;
0 prints as ``0``. Missing values (NaN/None) print as ``---`` (LaTeX) / ``—`` (Markdown).
"""

from __future__ import annotations

import os

import pandas as pd

from ..io import atomic_path, write_text
from .table_render import render_latex, render_markdown
from .table_spec import (
    DEGENERATE_UTILITY_FRACTION,
    METHOD_LABELS,
    TEX_METHOD_LABELS,
    Column,
    TableSpec,
    degenerate_utility,
    format_value,
    ordered_rows,
    rank_marks,
    tex_escape,
)

__all__ = [
    "METHOD_LABELS",
    "TEX_METHOD_LABELS",
    "Column",
    "TableSpec",
    "tex_escape",
    "format_value",
    "rank_marks",
    "ordered_rows",
    "render_markdown",
    "render_latex",
    "table_csv_frame",
    "write_table",
    "DEGENERATE_UTILITY_FRACTION",
    "degenerate_utility",
]


def table_csv_frame(df: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """The CSV content: label column, ``display_label``, ``reference``, raw metrics, ``<col>_mark``."""
    rows = ordered_rows(df, spec)
    marks = rank_marks(rows, spec)
    out = pd.DataFrame({spec.label_column: rows[spec.label_column]})
    out["display_label"] = [spec.labels.get(x, x) for x in rows[spec.label_column]]
    out["reference"] = rows["reference"].astype("int64")
    for col in spec.columns:
        out[col.name] = rows[col.name]
    for col in spec.columns:
        if col.name in marks:
            out[f"{col.name}_mark"] = marks[col.name]
    return out


def write_table(
    df: pd.DataFrame,
    spec: TableSpec,
    out_csv: str | os.PathLike | None,
    out_md: str | os.PathLike | None,
    out_tex: str | os.PathLike | None,
    caption: str | None = None,
    label: str | None = None,
    environment: str = "table",
) -> None:
    """Write the table as CSV (raw numbers), Markdown and LaTeX; any output given as ``None`` is skipped.

    ``caption`` and ``label`` (raw LaTeX) go into the LaTeX float only; the Markdown file holds just
    the table. ``environment`` is ``"table"`` or ``"table*"``. All outputs are rendered before any is
    written, so bad input writes nothing. See the module docstring for the three formats.
    """
    csv_frame = table_csv_frame(df, spec)
    md = render_markdown(df, spec)
    tex = render_latex(df, spec, caption=caption, label=label, environment=environment)
    if out_csv is not None:
        with atomic_path(out_csv) as tmp:
            # float_format=None: pandas writes repr(float), the shortest round-trip text.
            csv_frame.to_csv(tmp, index=False, lineterminator="\n", na_rep="")
    if out_md is not None:
        write_text(out_md, md)
    if out_tex is not None:
        write_text(out_tex, tex)
