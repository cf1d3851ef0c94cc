"""Utility–forgetting trade-off sweeps: one evaluated point per setting, the λ selection rule, the figure.

A *point* is one unlearned model: a subspace erase at rank k and scale λ (W' = W − λ T̃_f; the
forget update U V is stored at the configured λ₀, so a point rescales it by λ/λ₀ instead of
recomputing any factor), or an optimisation baseline trained for a number of epochs. Each point is
evaluated with the track's own protocol; for the text tracks that is the TOFU protocol plus the
answer-token NLL on the **held-out slice** (``tune_retain``: retain QA that no evaluation set
holds), which is what :func:`select_scale` reads. The selection never reads Forget Quality nor the
retain reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "scale_name",
    "scaled_updates",
    "mean_answer_nll",
    "select_scale",
    "tradeoff_frame",
    "share_unedited",
    "curves",
    "nll_rises",
    "point_reference",
    "POINT_COLUMNS",
    "PROTOCOLS",
]

#: the columns of one text-track point (in this order; metric columns follow).
POINT_COLUMNS = ("group", "method", "family", "rank", "scale", "epochs")

#: what a sweep point measures (config ``tradeoff.protocol``): ``full``, the whole TOFU protocol (generation
#: included), or ``nll``, answer NLLs only.
PROTOCOLS = ("full", "nll")


def scale_name(scale: float) -> str:
    """The path form of a scale: ``0.5 -> '0.5'``, ``2.0 -> '2'`` (``%g``); negative or non-finite is an error."""
    x = float(scale)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"scale: expected a finite number >= 0, got {scale!r}")
    return f"{x:g}"


def scaled_updates(updates: Mapping[str, tuple[Any, Any]], factor: float) -> dict[str, tuple[Any, Any]]:
    """``{module: (factor · U, V)}``: the forget update λ₀ T̃_f = U V rescaled to λ = factor · λ₀.

    ``U`` is ``(d_out, k)``, ``V`` is ``(k, d_in)`` (any array type supporting ``*``); the product
    ``(factor U) V`` is the rescaled edit, exactly, with no refactoring.
    """
    f = float(factor)
    if not math.isfinite(f):
        raise ValueError(f"scaled_updates: factor must be finite, got {factor!r}")
    return {name: (U * f, V) for name, (U, V) in updates.items()}


def mean_answer_nll(losses: Sequence[tuple[float, int]]) -> float:
    """Mean over questions of the per-token answer NLL, from ``(sum_nll, n_tokens)`` pairs (nats)."""
    if not losses:
        raise ValueError("mean_answer_nll: no answers")
    per_q = [s / c for s, c in losses if c > 0]
    if len(per_q) != len(losses):
        raise ValueError("mean_answer_nll: an answer has no tokens")
    return float(np.mean(per_q))


def select_scale(
    points: pd.DataFrame, max_rise: float, column: str = "tune_retain_nll", utility: str = "model_utility"
) -> pd.DataFrame:
    """The λ selection rule, per ``(method, rank)`` of the subspace points.

    Rule: the **largest** swept λ whose held-out retain NLL (``column``) exceeds the λ = 0 value (the
    unedited model) by at most ``max_rise`` nats. ``points`` needs ``family``, ``method``, ``rank``,
    ``scale`` and ``column``; every ``(method, rank)`` needs its λ = 0 point. Points without the
    held-out column's values (a track without a held-out slice) select nothing. Returns one row per
    ``(method, rank)``: ``method, rank, selected_scale, base_nll, selected_nll``. The rule reads only
    the held-out slice: no Forget Quality, no evaluation set, no retain reference.

    A degenerate point is never selected (λ = 0 then qualifies at worst): a non-finite NLL, or, where
    ``points`` has the ``utility`` column and the λ = 0 point's utility was measured (it is NaN
    throughout with ``tradeoff.protocol: nll``, where the rule reads the NLL alone), a utility that
    collapsed against the λ = 0 point's (:func:`qrerase.reports.tables.degenerate_utility`: not finite, or below
    :data:`~qrerase.reports.tables.DEGENERATE_UTILITY_FRACTION` of it).
    """
    from ..reports.tables import degenerate_utility

    if max_rise < 0:
        raise ValueError(f"select_scale: max_rise must be >= 0, got {max_rise}")
    sub = points[(points["family"] == "subspace") & points[column].notna()]
    rows = []
    for (method, rank), grp in sub.groupby(["method", "rank"], sort=False):
        base = grp[grp["scale"] == 0]
        if base.empty:
            raise ValueError(f"select_scale: {method} at k={rank} has no scale-0 point (the unedited model)")
        base_nll = float(base[column].iloc[0])
        nll = grp[column].astype(float)
        keep = np.isfinite(nll) & (nll - base_nll <= max_rise)
        u0 = float(base[utility].iloc[0]) if utility in grp.columns else math.nan
        if math.isfinite(u0):  # utility measured (the TOFU-protocol points; NaN throughout with protocol nll)
            keep &= ~grp[utility].map(lambda u, u0=u0: degenerate_utility(u, u0)).astype(bool)
        keep |= grp["scale"] == 0  # the unedited model
        ok = grp[keep]
        best = ok.sort_values("scale").iloc[-1]
        rows.append(
            {
                "method": method,
                "rank": int(rank),
                "selected_scale": float(best["scale"]),
                "base_nll": base_nll,
                "selected_nll": float(best[column]),
            }
        )
    return pd.DataFrame(rows, columns=["method", "rank", "selected_scale", "base_nll", "selected_nll"])


def point_reference(reference_dir, lang: str | None = None) -> dict:
    """The retain reference's eval log a point's Forget Quality is computed against: the TOFU eval
    directory, or its language ``lang`` subdirectory (a cross-lingual ``xling_evaluate`` output)."""
    from pathlib import Path

    from .eval_log import load_log

    return load_log(Path(reference_dir) / lang if lang else reference_dir)


def evaluate_text_point(
    model,
    tokenizer,
    template,
    eval_sets: Mapping[str, Sequence[Mapping[str, Any]]],
    tune_set: Sequence[Mapping[str, Any]],
    reference_log: Mapping,
    cfg,
    meta: Mapping[str, Any],
    protocol: str = "full",
) -> pd.DataFrame:
    """One text-track point: the TOFU protocol on ``eval_sets`` (Model Utility, Forget Quality against
    ``reference_log``, the twelve components, forget/retain answer NLL) plus ``tune_retain_nll``, the
    mean answer NLL on the held-out slice ``tune_set``. Returns a one-row frame:
    ``POINT_COLUMNS`` (from ``meta``), then the metrics in :func:`qrerase.metrics.log_metrics.metrics_frame` order,
    then ``tune_retain_nll``.

    ``protocol="nll"``: only ``forget_nll`` and ``retain_nll`` (the mean per-question answer NLL of the
    forget and retain evaluation sets' answers, as :func:`qrerase.metrics.log_metrics.answer_nll` reads them from
    a TOFU log) and ``tune_retain_nll``; ``model_utility`` and ``forget_quality`` are NaN. No
    generation, no paraphrased or perturbed answers: the sweep of a model too slow for the whole
    protocol at every point.
    """
    from ..metrics.log_metrics import metrics_frame
    from .evaluation import answer_losses, evaluate_log
    from .lm import qa_pair

    if protocol not in PROTOCOLS:
        raise ValueError(f"tradeoff.protocol: expected one of {list(PROTOCOLS)}, got {protocol!r}")
    row = {c: meta.get(c) for c in POINT_COLUMNS}
    if protocol == "full":
        log = evaluate_log(model, tokenizer, template, eval_sets, cfg)
        metrics = metrics_frame(log, reference_log, model=str(meta.get("method")))
        row.update(dict(zip(metrics["metric"], metrics["value"])))
    else:
        for name in ("forget", "retain"):
            pairs = [qa_pair(r) for r in eval_sets[name]]
            row[f"{name}_nll"] = mean_answer_nll(answer_losses(model, tokenizer, template, pairs, cfg))
        row["model_utility"] = row["forget_quality"] = float("nan")
    if tune_set:
        row["tune_retain_nll"] = mean_answer_nll(
            answer_losses(model, tokenizer, template, [qa_pair(r) for r in tune_set], cfg)
        )
    else:
        row["tune_retain_nll"] = float("nan")
    return pd.DataFrame([row])


def share_unedited(points: pd.DataFrame, sweeps: Sequence[tuple[str, int]]) -> pd.DataFrame:
    """``points`` plus, per group, a copy of its λ = 0 point for every subspace sweep in ``sweeps``
    (``(method, rank)`` pairs) that has none.

    W − 0·T̃_f is the unedited model whatever the method and k, so the workflow evaluates it once per
    group (for the track's first subspace method at the first swept k) and every sweep starts from
    that row. A group without a λ = 0 point is returned as it is (:func:`tradeoff_frame` names it).
    """
    if not {"group", "method", "family", "rank", "scale"} <= set(points.columns):
        raise ValueError("share_unedited: points need columns group, method, family, rank, scale")
    zero = points[(points["family"] == "subspace") & (points["scale"] == 0)]
    copies = []
    for _, rows in zero.groupby("group", sort=False):
        have = {(str(m), int(k)) for m, k in zip(rows["method"], rows["rank"])}
        for method, rank in sweeps:
            if (str(method), int(rank)) not in have:
                copies.append(rows.iloc[[0]].assign(method=method, rank=int(rank)))
    return pd.concat([points, *copies], ignore_index=True) if copies else points.copy()


def tradeoff_frame(points: pd.DataFrame) -> pd.DataFrame:
    """All points of a text track in sweep order (per group: subspace by method, rank, λ; baselines
    by method, epochs) with ``utility_rel`` = Model Utility / the unedited model's, taken from the
    group's λ = 0 point (any subspace method; a group is the TOFU run or one unlearning language);
    NaN where that utility is 0."""
    df = points.copy()
    base = df[(df["family"] == "subspace") & (df["scale"] == 0)].groupby("group", sort=False)["model_utility"].first()
    missing = sorted(set(df["group"]) - set(base.index))
    if missing:
        raise ValueError(
            f"tradeoff_frame: group(s) {missing} have no scale-0 point (the unedited model; add 0 to tradeoff.scales)"
        )
    # an unedited model with zero utility (harmonic mean of a zero component) has no relative scale
    df["utility_rel"] = df["model_utility"] / df["group"].map(base.where(base > 0))
    order = {m: i for i, m in enumerate(dict.fromkeys(df["method"]))}
    groups = {g: i for i, g in enumerate(dict.fromkeys(df["group"]))}
    df["_g"], df["_m"] = df["group"].map(groups), df["method"].map(order)
    df = df.sort_values(["_g", "family", "_m", "rank", "scale", "epochs"], kind="stable", na_position="first")
    return df.drop(columns=["_g", "_m"]).reset_index(drop=True)


def nll_rises(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` plus ``forget_rise`` and ``tune_retain_rise``: each point's forget-set and held-out
    retain answer NLL minus its group's unedited model's (the λ = 0 point), in nats."""
    base = frame[(frame["family"] == "subspace") & (frame["scale"] == 0)].groupby("group", sort=False)
    out = frame.copy()
    out["forget_rise"] = out["forget_nll"] - out["group"].map(base["forget_nll"].first())
    out["tune_retain_rise"] = out["tune_retain_nll"] - out["group"].map(base["tune_retain_nll"].first())
    return out


def curves(frame: pd.DataFrame, x: str, y: str, labels: Mapping[str, str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{label: (x, y)}`` per method (and rank, when several ranks are swept) in sweep order."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    ranks = frame.loc[frame["family"] == "subspace", "rank"].dropna().unique()
    groups = frame["group"].unique()
    for keys, grp in frame.groupby(["group", "family", "method", "rank"], sort=False, dropna=False):
        group, family, method, rank = keys
        label = labels.get(method, method)
        if family == "subspace" and len(ranks) > 1:
            label = f"{label}, k={int(rank)}"
        if len(groups) > 1:
            label = f"{label} ({group}→{group})"
        out[label] = (grp[x].to_numpy(), grp[y].to_numpy())
    return out
