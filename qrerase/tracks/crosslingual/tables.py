"""Cross-lingual unlearning results: metrics per (unlearning language, method, evaluation language) and
the paper's two cross-lingual tables.

Notation: a model unlearned in language X is evaluated in every language Y ("X→Y"). Model Utility
in Y uses Y's retain, real-authors and world-facts sets; Forget Quality in Y is the KS p-value of
the Y forget-set truth ratios against those of the retain-only reference model *evaluated in Y*
(:func:`qrerase.metrics.log_metrics.model_utility`, :func:`qrerase.metrics.log_metrics.forget_quality`). The
fine-tuned model before unlearning ("base") and the reference are multilingual and shared by every X.

:func:`metrics_rows` gives one tidy row per evaluated model and language; :func:`pairs_table` the
paper's methods × {X→Y} table (Utility and Forget per pair, ✓ for p > 0.1, best/second marked among
methods); :func:`matrix_table` the full Unlearn × Eval matrix of one method with the base-model rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ...metrics.log_metrics import FORGET_QUALITY_THRESHOLD, component_metrics, forget_quality, model_utility
from ...registry import method_labels, tex_method_labels
from ...reports.tables import METHOD_LABELS, Column, TableSpec, degenerate_utility, tex_escape
from .data import language_label

__all__ = ["BASE", "REFERENCE", "metrics_rows", "pairs_table", "matrix_table", "scatter_points", "pair_key"]

#: unlearn-column value of the models that did not unlearn (base model, retain reference).
BASE = "base"
REFERENCE = "retain"


def pair_key(unlearn: str, evaluate: str) -> str:
    """Row/column key of a language pair: ``'en>hi_R'``."""
    return f"{unlearn}>{evaluate}"


def metrics_rows(
    logs: Mapping[tuple[str, str], Mapping[str, Mapping]],
    reference: Mapping[str, Mapping],
) -> pd.DataFrame:
    """Tidy metrics of every evaluated model in every language.

    ``logs`` maps ``(unlearn, method)`` — ``('base', 'base')`` for the fine-tuned model,
    ``('en', 'qr_erase_ll')`` for a model unlearned in English — to ``{eval language: TOFU log}``;
    ``reference`` maps each evaluation language to the retain-only reference's log. Columns:
    ``unlearn, method, eval, model_utility, forget_quality`` and the twelve component metrics; the
    reference itself gets a row (``unlearn = method = 'retain'``) without Forget Quality.
    """
    rows = []
    for (unlearn, method), per_lang in [*logs.items(), ((REFERENCE, REFERENCE), reference)]:
        for lang, log in per_lang.items():
            if lang not in reference:
                raise ValueError(
                    f"cross-lingual metrics: no reference log in language {lang!r} (have {sorted(reference)})"
                )
            row = {"unlearn": unlearn, "method": method, "eval": lang, "model_utility": model_utility(log)}
            row["forget_quality"] = (
                np.nan
                if unlearn == REFERENCE
                else forget_quality(
                    log, reference[lang], name=f"{method} ({unlearn}) in {lang}", reference_name=f"reference in {lang}"
                )
            )
            row.update(component_metrics(log))
            rows.append(row)
    return pd.DataFrame(rows)


def _value(frame: pd.DataFrame, unlearn: str, method: str, lang: str, metric: str) -> float:
    hit = frame[(frame["unlearn"] == unlearn) & (frame["method"] == method) & (frame["eval"] == lang)]
    if len(hit) != 1:
        raise ValueError(
            f"cross-lingual table: {len(hit)} rows for unlearn={unlearn!r}, method={method!r}, eval={lang!r}"
        )
    return float(hit[metric].iloc[0])


def _tex_lang(code: str) -> str:
    return tex_escape(code)


def pairs_table(
    metrics: pd.DataFrame, methods: Sequence[str], pairs: Sequence[tuple[str, str]]
) -> tuple[pd.DataFrame, TableSpec]:
    """The paper's cross-lingual table: rows = base model, retain reference, then ``methods``; per pair
    X→Y two columns, Utility ↑ and Forget ↑ (✓ for p > 0.1), best/second marked among the methods; a
    pair whose utility collapsed below the base model's in Y is degenerate (Forget not ranked, no ✓).

    The reference rows are the models that did not unlearn, evaluated in Y (the same for every X).
    Returns ``(df, spec)`` for :func:`qrerase.reports.tables.write_table`.
    """
    if not pairs:
        raise ValueError("cross-lingual table: no language pairs")
    records = []
    for name, unlearn_of in (
        (BASE, lambda x: BASE),
        (REFERENCE, lambda x: REFERENCE),
        *((m, lambda x: x) for m in methods),
    ):
        rec = {"method": name}
        for x, y in pairs:
            key = pair_key(x, y)
            rec[f"{key}:utility"] = _value(metrics, unlearn_of(x), name, y, "model_utility")
            rec[f"{key}:forget"] = _value(metrics, unlearn_of(x), name, y, "forget_quality")
        records.append(rec)
    columns = []
    for x, y in pairs:
        key = pair_key(x, y)
        group, tex_group = f"{x}→{y}", f"{_tex_lang(x)}$\\to${_tex_lang(y)}"
        columns.append(Column(f"{key}:utility", "Utility", True, "{:.4f}", group=group, tex_group=tex_group))
        columns.append(
            Column(
                f"{key}:forget",
                "Forget",
                True,
                "sci",
                check_threshold=FORGET_QUALITY_THRESHOLD,
                group=group,
                tex_group=tex_group,
            )
        )
    degenerate = {}
    for x, y in pairs:
        key = pair_key(x, y)
        base = records[0][f"{key}:utility"]
        degenerate[f"{key}:forget"] = tuple(
            r["method"] for r in records[2:] if _degenerate(r[f"{key}:utility"], r[f"{key}:forget"], base)
        )
    spec = TableSpec(
        columns=tuple(columns),
        label_column="method",
        reference_rows=(BASE, REFERENCE),
        labels=method_labels(),
        tex_labels=tex_method_labels(),
        degenerate={k: v for k, v in degenerate.items() if v},
    )
    return pd.DataFrame(records), spec


def _degenerate(utility, forget, base_utility) -> bool:
    """A measured pair whose utility collapsed (:func:`qrerase.reports.tables.degenerate_utility`)."""
    return not (pd.isna(utility) and pd.isna(forget)) and degenerate_utility(utility, base_utility)


def matrix_table(
    metrics: pd.DataFrame, method: str, unlearn: Sequence[str], evaluate: Sequence[str]
) -> tuple[pd.DataFrame, TableSpec]:
    """The full Unlearn × Eval matrix of one method: a row per pair (base-model rows first, one per
    evaluation language), columns Util. and FQ (✓ for p > 0.1; nothing ranked; ``(degenerate)``
    instead when the pair's utility collapsed below the base model's in Y).

    Row keys are ``'base>Y'`` and ``'X>Y'``; display labels ``'Base Model → English'``,
    ``'English → Hindi (R)'``.
    """
    records, labels, tex_labels = [], {}, {}
    for src in (BASE, *unlearn):
        for y in evaluate:
            key = pair_key(src, y)
            name = METHOD_LABELS[BASE] if src == BASE else language_label(src)
            labels[key] = f"{name} → {language_label(y)}"
            tex_labels[key] = f"{tex_escape(name)} $\\to$ {tex_escape(language_label(y))}"
            m = BASE if src == BASE else method
            records.append(
                {
                    "pair": key,
                    "model_utility": _value(metrics, src, m, y, "model_utility"),
                    "forget_quality": _value(metrics, src, m, y, "forget_quality"),
                }
            )
    columns = (
        Column("model_utility", "Util.", None, "{:.4f}"),
        Column("forget_quality", "FQ", None, "sci", check_threshold=FORGET_QUALITY_THRESHOLD),
    )
    base_of = {pair_key(BASE, y): r["model_utility"] for y, r in zip(evaluate, records)}
    collapsed = tuple(
        r["pair"]
        for r in records[len(evaluate) :]
        if _degenerate(r["model_utility"], r["forget_quality"], base_of[pair_key(BASE, r["pair"].split(">")[-1])])
    )
    spec = TableSpec(
        columns=columns,
        label_column="pair",
        label_header="Unlearn → Eval",
        reference_rows=tuple(pair_key(BASE, y) for y in evaluate),
        labels=labels,
        tex_labels=tex_labels,
        degenerate={"forget_quality": collapsed} if collapsed else {},
    )
    return pd.DataFrame(records), spec


def scatter_points(metrics: pd.DataFrame, method: str, unlearn: Sequence[str], evaluate: Sequence[str]) -> pd.DataFrame:
    """Rows ``unlearn, eval, model_utility, relative_utility, forget_quality`` of ``method`` for every
    X→Y; relative utility = Model Utility / the base model's in Y (the paper's "normalised utility")."""
    rows = []
    for x in unlearn:
        for y in evaluate:
            mu = _value(metrics, x, method, y, "model_utility")
            base = _value(metrics, BASE, BASE, y, "model_utility")
            rows.append(
                {
                    "unlearn": x,
                    "eval": y,
                    "model_utility": mu,
                    "relative_utility": mu / base if base > 0 else np.nan,
                    "forget_quality": _value(metrics, x, method, y, "forget_quality"),
                }
            )
    return pd.DataFrame(rows)
