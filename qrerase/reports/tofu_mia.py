"""The TOFU privacy table: membership-inference AUCs, PrivLeak and memorisation of every evaluated model.

One row per model (reference rows ``base`` and ``retain`` first), one column per TOFU metric of
:mod:`qrerase.metrics.registry` with a per-sequence statistic (the MIA AUCs of forget vs holdout, the
forget-set extraction strength and exact memorisation), and PrivLeak (:func:`qrerase.metrics.privleak.privleak`)
of the metric it is relative to (Min-K%), against the retain reference's row. The values come from
each model's ``sequence_metrics.json`` (rule evaluate).

Ranking: ``higher`` / ``lower`` metrics are ranked by the table writer; ``target`` metrics (AUC
closest to 0.5, PrivLeak closest to 0) are not (:class:`qrerase.reports.tables.Column` ranks in one
direction only); their header names the ideal value.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..metrics.privleak import privleak
from ..metrics.registry import metric, metrics_for
from .tables import Column, TableSpec

__all__ = ["mia_table"]


def _header(name: str) -> tuple[str, bool | None]:
    m = metric(name)
    if m.direction == "target":
        return f"{m.label} (ideal {m.target:g})", None
    return m.label, m.direction == "higher"


def mia_table(values: Mapping[str, Mapping[str, float]], reference: str = "retain") -> tuple[pd.DataFrame, TableSpec]:
    """``values``: model (row key) -> metric name -> value (``sequence_metrics.json``'s ``metrics``),
    in row order. Columns: the TOFU ``auc`` metrics, then each ``relative`` metric (PrivLeak) when the
    ``reference`` row is present (otherwise ``NaN``), then the ``mean`` metrics. A row missing a metric
    shows it as missing. Returns ``(df, spec)`` for :func:`qrerase.reports.tables.write_table`.
    """
    if not values:
        raise ValueError("mia_table: no models")
    aucs, means = metrics_for("tofu", "auc"), metrics_for("tofu", "mean")
    relative = metrics_for("tofu", "relative")
    rows = []
    for model, vals in values.items():
        row = {"method": model, **{n: float(vals.get(n, np.nan)) for n in aucs + means}}
        for n in relative:
            of = metric(n).of
            ref, own = values.get(reference, {}).get(of), vals.get(of)
            row[n] = np.nan if ref is None or own is None or not 0.0 <= ref < 1.0 else privleak(own, ref)
        rows.append(row)
    columns = []
    for n in aucs + relative + means:
        header, hib = _header(n)
        columns.append(Column(n, header, hib, "{:.2f}" if n in relative else "{:.4f}"))
    df = pd.DataFrame(rows, columns=["method", *(c.name for c in columns)])
    return df, TableSpec(columns=tuple(columns), label_column="method", reference_rows=("base", reference))
