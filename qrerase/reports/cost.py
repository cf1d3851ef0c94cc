"""The cost table: wall time per method from Snakemake benchmark files (every track's companion table)."""

from __future__ import annotations

import pandas as pd

from .tables import Column, TableSpec

__all__ = ["cost_table"]

#: (component, header) of the cost table, in column order (:data:`qrerase.bench.cost.COST_COLUMNS`).
_COST_HEADERS = (
    ("lora_s", "LoRA adapters (s)"),
    ("task_matrices_s", "Task matrices (s)"),
    ("erase_s", "Closed-form erase (s)"),
    ("baseline_s", "Baseline training (s)"),
    ("unlearn_s", "Unlearning step (s)"),
    ("total_s", "Total (s)"),
)


def cost_table(
    costs: pd.DataFrame, group_column: str | None = None, group_header: str | None = None
) -> tuple[pd.DataFrame, TableSpec]:
    """A track table's companion: wall time per method (:func:`qrerase.bench.cost.method_costs` frame).

    Columns: LoRA training, task matrices, closed-form erase, baseline training, the unlearning step
    (erase or baseline training) and the total, in seconds; not ranked (timings vary between runs).
    With ``group_column`` (the cross-lingual unlearning language, the speech setting), the frame
    holds one row per (method, group); the table keeps one row per method and repeats the six
    columns per group (``<group>_<component>``, spanning header ``"<group_header> <group>"``), groups
    in order of first appearance. Returns ``(df, spec)`` for :func:`qrerase.reports.tables.write_table`.
    """
    need = ["method", *(name for name, _ in _COST_HEADERS)] + ([group_column] if group_column else [])
    missing = [c for c in need if c not in costs.columns]
    if missing:
        raise ValueError(f"cost_table: missing column(s) {missing} (got {list(costs.columns)})")
    if group_column is None:
        columns = tuple(Column(name, header, None, "{:.1f}") for name, header in _COST_HEADERS)
        return costs[["method", *(c.name for c in columns)]].copy(), TableSpec(columns=columns)
    groups = list(dict.fromkeys(costs[group_column].astype(str)))
    dup = costs[["method", group_column]].astype(str).duplicated()
    if dup.any():
        raise ValueError(f"cost_table: duplicate (method, {group_column}) rows {costs.loc[dup, 'method'].tolist()}")
    title = f"{group_header or group_column} "
    columns, wide = [], pd.DataFrame({"method": list(dict.fromkeys(costs["method"]))})
    for g in groups:
        part = costs[costs[group_column].astype(str) == g].set_index("method")
        for name, header in _COST_HEADERS:
            col = f"{g}_{name}"
            columns.append(Column(col, header, None, "{:.1f}", group=f"{title}{g}"))
            wide[col] = wide["method"].map(part[name]).astype("float64")
    return wide, TableSpec(columns=tuple(columns))
