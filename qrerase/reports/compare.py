"""How far the numbers of one results table move between two runs (another machine, seed or commit).

:func:`compare_csv` matches the rows of two CSV tables by their first column (the method or model
label) and reports, per numeric column, the largest absolute difference and where it occurs, with
both values as written. :func:`render_comparison` renders that as a Markdown table for the results
pages (:mod:`qrerase.reports.pages`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pandas as pd

__all__ = ["Difference", "compare_csv", "render_comparison"]


@dataclass(frozen=True)
class Difference:
    """The largest |this − other| of one numeric column over the matched rows.

    ``row`` is the first-column value where it occurs (the first such row), ``this`` / ``other`` the two
    values there as written in the files, ``rows`` the number of rows with a number in both.
    """

    column: str
    max_abs: float
    row: str
    this: str
    other: str
    rows: int


def _read(path: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    text = pd.read_csv(path, dtype=str, keep_default_na=False)
    return text, text.apply(pd.to_numeric, errors="coerce")


def compare_csv(this: str | os.PathLike, other: str | os.PathLike) -> list[Difference]:
    """Per numeric column of ``this``, the largest absolute difference to ``other``.

    Rows are matched on the first column; rows present in one file only and columns missing from
    ``other`` are skipped. Raises ValueError naming the file when the first column repeats a value
    (rows cannot be matched) or a file has no rows.
    """
    (a_text, a_num), (b_text, b_num) = _read(this), _read(other)
    for path, frame in ((this, a_text), (other, b_text)):
        if frame.empty:
            raise ValueError(f"{path}: no rows to compare")
        key = frame.columns[0]
        if frame[key].duplicated().any():
            raise ValueError(f"{path}: first column {key!r} repeats a value; rows cannot be matched")
    key = a_text.columns[0]
    if b_text.columns[0] != key:
        raise ValueError(f"{other}: first column {b_text.columns[0]!r}, expected {key!r} as in {this}")
    b_index = {label: i for i, label in enumerate(b_text[key])}
    out = []
    for column in a_text.columns[1:]:
        if column not in b_text.columns:
            continue
        best, n = None, 0
        for i, label in enumerate(a_text[key]):
            j = b_index.get(label)
            if j is None:
                continue
            x, y = a_num[column].iloc[i], b_num[column].iloc[j]
            if math.isnan(x) or math.isnan(y):
                continue
            n += 1
            diff = abs(float(x) - float(y))
            if best is None or diff > best[0]:
                best = (diff, label, a_text[column].iloc[i], b_text[column].iloc[j])
        if best is not None:
            out.append(Difference(column, best[0], best[1], best[2], best[3], n))
    return out


def render_comparison(differences: list[Difference]) -> str:
    """A Markdown table: column, max |Δ|, the row where it occurs, the value in each run, rows compared."""
    lines = ["| column | max \\|Δ\\| | at | this run | other run | rows |", "|---|---:|---|---:|---:|---:|"]
    for d in differences:
        lines.append(f"| {d.column} | {d.max_abs:.3g} | {d.row} | {d.this} | {d.other} | {d.rows} |")
    return "\n".join(lines)
