"""The task-level track's table (the paper's Table 1 layout: unrelated, similar, forgotten skill)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ...reports.tables import Column, TableSpec

__all__ = ["task_level_table"]

#: role -> (header, higher is better) of the task table, in the paper's column order.
_TASK_ROLES = (("unrelated", "Unrelated", True), ("similar", "Similar", True), ("forget", "Forgotten", False))


def task_level_table(
    frame: pd.DataFrame, skills: Mapping[str, str] | None = None, wide: bool = False
) -> tuple[pd.DataFrame, TableSpec]:
    """The paper's Table 1 layout: Method, unrelated ↑, similar ↑, forgotten ↓ (exact-match accuracy).

    ``frame``: one row per method (``method`` column) with ``<role>_accuracy`` (and, for ``wide``,
    ``<role>_nll``) for the roles ``unrelated``, ``similar``, ``forget``
    (:func:`qrerase.tracks.task_level.evaluation.task_level_frame`).
    ``skills`` names each role's skill in the header (``Similar (word_math)``). Reference row: ``base``.
    ``wide`` adds the answer-token NLL per role (not ranked) and groups the columns by role.
    """
    skills = dict(skills or {})
    columns = []
    for role, header, hib in _TASK_ROLES:
        title = f"{header} ({skills[role]})" if skills.get(role) else header
        if wide:
            columns.append(Column(f"{role}_accuracy", "Acc.", hib, "{:.3f}", group=title))
            columns.append(Column(f"{role}_nll", "NLL", None, "{:.3f}", group=title))
        else:
            columns.append(Column(f"{role}_accuracy", title, hib, "{:.3f}"))
    missing = [c.name for c in columns if c.name not in frame.columns]
    if missing or "method" not in frame.columns:
        raise ValueError(f"task_level_table: missing column(s) {missing or ['method']} (got {list(frame.columns)})")
    spec = TableSpec(columns=tuple(columns), reference_rows=("base",))
    return frame[["method", *(c.name for c in columns)]].reset_index(drop=True), spec
