"""The TOFU privacy table: membership-inference AUCs, PrivLeak and memorisation of every evaluated model.

One row per model (reference rows ``base`` and ``retain`` first), one column per registered TOFU
metric of :mod:`qrerase.metrics.registry` (a plug-in's too): those with a per-sequence statistic (the
MIA AUCs of forget vs holdout, the forget-set extraction strength and exact memorisation) and the
``relative`` ones (PrivLeak, :func:`qrerase.metrics.privleak.privleak`, of the Min-K% AUC against the
retain reference's row). The values come from each model's ``sequence_metrics.json`` (rule evaluate).

Ranking: every column in its registered direction (:meth:`qrerase.reports.tables.Column.for_metric`):
``higher`` / ``lower``, or closest to the target for the ``target`` metrics (AUC closest to 0.5,
PrivLeak closest to 0; the header shows ``(→ target)``).
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ...metrics.registry import metrics_for
from ...metrics.rows import metric_rows
from ...reports.tables import Column, TableSpec

__all__ = ["mia_table"]


def mia_table(values: Mapping[str, Mapping[str, float]], reference: str = "retain") -> tuple[pd.DataFrame, TableSpec]:
    """``values``: model (row key) -> metric name -> value (``sequence_metrics.json``'s ``metrics``),
    in row order. Columns: every registered TOFU metric (:func:`qrerase.metrics.registry.metrics_for`,
    a plug-in's too), in registry order within each aggregate: the ``auc`` metrics, then each
    ``relative`` metric (PrivLeak) when the ``reference`` row is present (otherwise ``NaN``), then the
    ``mean`` metrics; each formatted and ranked as registered. A row missing a metric
    shows it as missing. Returns ``(df, spec)`` for :func:`qrerase.reports.tables.write_table`.
    """
    if not values:
        raise ValueError("mia_table: no models")
    names = metrics_for("tofu", "auc") + metrics_for("tofu", "relative") + metrics_for("tofu", "mean")
    columns = [Column.for_metric(n) for n in names]
    df = pd.DataFrame(metric_rows(values, names, reference), columns=["method", *names])
    return df, TableSpec(columns=tuple(columns), label_column="method", reference_rows=("base", reference))
