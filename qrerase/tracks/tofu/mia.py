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

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ...metrics.registry import metric, metric_function, metrics_for
from ...reports.tables import Column, TableSpec

__all__ = ["mia_table", "metric_rows", "load_sequence_metrics"]


def load_sequence_metrics(path: str | os.PathLike) -> dict[str, float]:
    """The ``metrics`` mapping (metric name -> value) of one ``sequence_metrics.json`` (rule evaluate).
    ValueError (one line naming the file) when it is not such a file."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))["metrics"]
        return {str(k): float(v) for k, v in values.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a sequence_metrics.json with a 'metrics' mapping ({exc})") from None


def metric_rows(
    values: Mapping[str, Mapping[str, float]], names: Sequence[str], reference: str = "retain"
) -> list[dict[str, float | str]]:
    """One row per model of ``values`` (model -> metric name -> value, in row order): ``method`` and
    each metric of ``names`` (registered; NaN when the model lacks it). A ``relative`` metric
    (PrivLeak) is its registered function of the model's and the ``reference`` row's values of the
    metric it is relative to (NaN without a reference row or either value, or when the function
    rejects them with a ValueError: PrivLeak with a reference AUC of 1); the reference row's own
    PrivLeak is therefore 0."""
    rows = []
    for model, vals in values.items():
        row: dict[str, float | str] = {"method": model}
        for n in names:
            m = metric(n)
            if m.aggregate != "relative":
                row[n] = float(vals.get(n, np.nan))
                continue
            assert m.of is not None  # a relative metric names the metric it is computed from
            ref, own = values.get(reference, {}).get(m.of), vals.get(m.of)
            try:
                row[n] = float(metric_function(n)(own, ref)) if ref is not None and own is not None else np.nan
            except ValueError:  # outside the function's domain (PrivLeak: an AUC outside [0, 1], a reference AUC of 1)
                row[n] = np.nan
        rows.append(row)
    return rows


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
