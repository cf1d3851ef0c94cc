"""The paper's TOFU table (Model Utility, Forget Quality, privacy; the wide variant with the twelve components).

Privacy columns (:func:`privacy_metrics`: the TOFU metrics registered with a ``headline`` position,
:func:`qrerase.metrics.registry.headline_metrics`, from each model's ``sequence_metrics.json``,
:func:`privacy_frame`): built in, PrivLeak (MUSE; of the Min-K% AUC against the retain reference's;
ideal 0) and the forget-vs-holdout AUC of the default attack (:data:`DEFAULT_ATTACK`, Min-K%++; ideal
0.5), each formatted and ranked as registered (by distance to the ideal); a plug-in's headline metric
is one more column.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ...metrics.log_metrics import FORGET_QUALITY_THRESHOLD
from ...metrics.registry import headline_metrics
from ...metrics.rows import metric_rows
from ...reports.tables import Column, TableSpec, degenerate_utility
from ...text.eval_log import SET_LABELS

__all__ = ["tofu_table", "degenerate_rows", "privacy_frame", "privacy_metrics", "DEFAULT_ATTACK"]

#: The membership-inference attack whose AUC the TOFU tables show (a registered ``auc`` metric).
DEFAULT_ATTACK = "mia_min_k_plus_plus"


def privacy_metrics() -> tuple[str, ...]:
    """The privacy columns of the TOFU tables, in order: the TOFU track's headline metrics
    (:func:`qrerase.metrics.registry.headline_metrics`; built in: ``privleak``, :data:`DEFAULT_ATTACK`)."""
    return tuple(headline_metrics("tofu"))


_TOFU_SET_GROUPS = tuple(SET_LABELS.items())  # (set, label) in component order


def degenerate_rows(wide_df: pd.DataFrame) -> tuple[str, ...]:
    """The non-reference methods of a wide TOFU frame (``method``, ``model_utility``,
    ``forget_quality``) whose Model Utility collapsed against the ``base`` row's
    (:func:`qrerase.reports.tables.degenerate_utility`: below the fraction, or not finite while the
    row has a Forget Quality; without a ``base`` row, only a non-finite utility)."""
    base = wide_df.loc[wide_df["method"] == "base", "model_utility"]
    base_utility = float(base.iloc[0]) if len(base) else float("nan")
    return tuple(
        str(m)
        for m, u, fq in zip(wide_df["method"], wide_df["model_utility"], wide_df["forget_quality"])
        if m not in ("base", "retain") and not (pd.isna(u) and pd.isna(fq)) and degenerate_utility(u, base_utility)
    )


def privacy_frame(values: Mapping[str, Mapping[str, float]], reference: str = "retain") -> pd.DataFrame:
    """The privacy columns of :func:`tofu_table`: ``method`` and each of :func:`privacy_metrics`, one
    row per model of ``values`` (row key -> ``sequence_metrics.json``'s ``metrics``).
    :func:`qrerase.metrics.rows.metric_rows`: PrivLeak against the ``reference`` row (0 for the
    reference itself; NaN without a reference row)."""
    if reference not in values:
        raise ValueError(f"privacy_frame: no sequence metrics of the reference row {reference!r}")
    names = privacy_metrics()
    return pd.DataFrame(metric_rows(values, names, reference), columns=["method", *names])


def tofu_table(
    rows: pd.DataFrame, wide: bool = False, privacy: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, TableSpec]:
    """The paper's TOFU table: Method, Model Utility ↑, Forget Quality ↑ (✓ when p > 0.1).

    A method whose Model Utility is below :data:`~qrerase.reports.tables.DEGENERATE_UTILITY_FRACTION`
    of the base model's (or not finite) is degenerate (:func:`degenerate_rows`): its Forget Quality
    prints as ``1 (degenerate)``, not ranked and without ✓ (a collapsed model forgets nothing).

    ``rows`` is either tidy (columns ``model, metric, value``, e.g. concatenated
    :func:`qrerase.metrics.log_metrics.metrics_frame` outputs) or wide (one row per method with a ``method`` or
    ``model`` column and metric columns). Reference rows: ``base``, ``retain``. A missing Forget
    Quality shows as ``---``. ``wide=True`` adds the twelve component metrics grouped by set
    (forget-set components are not ranked: lower is not uniformly better there) and, when the rows
    hold ``forget_nll`` / ``retain_nll`` and a ``base`` row, the selectivity diagnostic: each
    model's change of forget-set and retain-set answer NLL against the base model (nats; a
    selective erase raises the first far more than the second).
    ``privacy`` (:func:`privacy_frame`): adds its :func:`privacy_metrics` columns last (group
    "Privacy" in the wide table), highlighted by distance to the ideal; a row it lacks (an imported
    model: no forward pass here) shows them as missing.
    Returns ``(df, spec)`` for :func:`qrerase.reports.tables.write_table`.
    """
    if {"model", "metric", "value"} <= set(rows.columns):
        dup = rows.duplicated(["model", "metric"])
        if dup.any():
            bad = rows.loc[dup, ["model", "metric"]].to_records(index=False).tolist()[:5]
            raise ValueError(f"tofu_table: duplicate (model, metric) rows {bad}")
        order = list(dict.fromkeys(rows["model"]))
        wide_df = rows.pivot(index="model", columns="metric", values="value").reindex(order)
        wide_df = wide_df.reset_index().rename(columns={"model": "method"})
        wide_df.columns.name = None
    else:
        key = "method" if "method" in rows.columns else "model" if "model" in rows.columns else None
        if key is None:
            raise ValueError(
                "tofu_table: need a 'method' or 'model' column or tidy model/metric/value rows "
                f"(got {list(rows.columns)})"
            )
        wide_df = rows.rename(columns={key: "method"}).copy()
    if "model_utility" not in wide_df.columns:
        raise ValueError("tofu_table: no 'model_utility' values")
    if "forget_quality" not in wide_df.columns:
        wide_df["forget_quality"] = np.nan
    columns = [
        Column("model_utility", "Model Utility", True, "{:.4f}", group="Overall" if wide else None),
        Column(
            "forget_quality",
            "Forget Quality",
            True,
            "sci",
            check_threshold=FORGET_QUALITY_THRESHOLD,
            group="Overall" if wide else None,
        ),
    ]
    if wide:
        for set_name, group in _TOFU_SET_GROUPS:
            hib = None if set_name == "forget" else True
            for metric, header in (("probability", "Prob."), ("rougeL", "ROUGE-L"), ("truth_ratio", "TR")):
                name = f"{set_name}_{metric}"
                if name not in wide_df.columns:
                    wide_df[name] = np.nan
                columns.append(Column(name, header, hib, "{:.4f}", group=group))
        if {"forget_nll", "retain_nll"} <= set(wide_df.columns) and (wide_df["method"] == "base").any():
            base = wide_df.loc[wide_df["method"] == "base"].iloc[0]
            for set_name in ("forget", "retain"):
                wide_df[f"{set_name}_dnll"] = wide_df[f"{set_name}_nll"] - base[f"{set_name}_nll"]
                columns.append(Column(f"{set_name}_dnll", f"{set_name} ΔNLL", None, "{:.3f}", group="Selectivity"))
    if privacy is not None:
        names = privacy_metrics()
        missing = [c for c in ("method", *names) if c not in privacy.columns]
        if missing:
            raise ValueError(f"tofu_table: privacy frame lacks column(s) {missing}")
        dup = sorted(set(privacy.loc[privacy["method"].astype(str).duplicated(), "method"].astype(str)))
        if dup:
            raise ValueError(f"tofu_table: duplicate privacy row(s) {dup}")
        by_method = privacy.set_index(privacy["method"].astype(str))
        for n in names:
            wide_df[n] = [float(by_method[n].get(str(m), np.nan)) for m in wide_df["method"]]
            columns.append(Column.for_metric(n, group="Privacy" if wide else None))
    keep = ["method"] + [c.name for c in columns]
    spec = TableSpec(
        columns=tuple(columns),
        label_column="method",
        reference_rows=("base", "retain"),
        degenerate={"forget_quality": degenerate_rows(wide_df)},
    )
    return wide_df[keep].reset_index(drop=True), spec
