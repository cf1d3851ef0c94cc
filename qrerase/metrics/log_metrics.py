"""TOFU metrics (Maini et al., 2024) on TOFU-format evaluation logs, faithful to the reference protocol.

This module re-implements the aggregation of the TOFU release (``aggregate_eval_stat.py`` of
``locuslab/tofu``) so that logs written by the original TOFU evaluation code, and logs written by our
own evaluation, give the same numbers. On TOFU's published log of Llama-2-7B fine-tuned on ``full``
it gives Model Utility 0.6227 (the paper's *Base Model* row).

The log format (four sets, their fields) and its loading, validation and writing are
:mod:`qrerase.text.eval_log`.

Metrics (per log set; ``ℓ`` are mean per-token NLLs, ``q`` runs over questions, ``i`` over the
perturbed answers of a question)
--------------------------------------------------------------------------------------------------
- Probability, retain and forget:  ``P = mean_q exp(−ℓ_gt)``.
  Real authors and world facts (normalised over the answer and its perturbations):
  ``P = mean_q exp(−ℓ_gt) / (exp(−ℓ_gt) + Σ_i exp(−ℓ_pert,i))``.
- Truth-ratio statistic per question: ``R_q = exp(mean_i ℓ_pert,i − ℓ_para)``
  (``R = P(paraphrase)/geo-mean P(perturbed)``, per-token normalised).
  Forget set metric: ``mean_q min(R_q, 1/R_q)``; other sets: ``mean_q max(0, 1 − 1/R_q)``.
- ROUGE-L: ``mean_q rougeL_recall``.
- Model Utility: harmonic mean of the nine numbers {Probability, ROUGE-L, Truth Ratio} ×
  {retain, real authors, world facts} (0 when any of them is 0).
- Forget Quality: p-value of the two-sample Kolmogorov–Smirnov test (``scipy.stats.ks_2samp``)
  between the forget-set ``R_q`` of the evaluated model and of the retain-only reference model.
  Forgetting is deemed successful when ``p > 0.1`` (:data:`FORGET_QUALITY_THRESHOLD`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy.stats import hmean, ks_2samp

from ..text.eval_log import FILES, LOG_SETS, UTILITY_SETS, log_set_name

__all__ = [
    "FORGET_QUALITY_THRESHOLD",
    "probability",
    "rouge_l",
    "truth_ratios",
    "truth_ratio_metric",
    "component_metrics",
    "model_utility",
    "forget_ks",
    "forget_quality",
    "answer_nll",
    "metrics_frame",
]

#: "forgetting succeeds" when Forget Quality (a KS p-value) exceeds this.
FORGET_QUALITY_THRESHOLD = 0.1


def _questions(log_set: Mapping) -> list:
    return sorted(log_set["avg_gt_loss"], key=int)


def _vector(log_set: Mapping, field: str) -> np.ndarray:
    d = log_set[field]
    return np.array([float(d[q]) for q in _questions(log_set)], dtype=np.float64)


def _lists(log_set: Mapping, field: str) -> list[np.ndarray]:
    d = log_set[field]
    return [np.asarray(d[q], dtype=np.float64) for q in _questions(log_set)]


def probability(log_set: Mapping, kind: str) -> float:
    """TOFU Probability of one log set.

    ``kind`` is the set name (``retain``, ``forget``, ``real_authors``, ``world_facts``) or its file
    name. Retain/forget: ``mean_q exp(−avg_gt_loss)``. Real authors/world facts:
    ``mean_q exp(−avg_gt_loss) / (exp(−avg_gt_loss) + Σ_i exp(−average_perturb_loss_i))``.
    """
    name = log_set_name(kind)
    p_true = np.exp(-_vector(log_set, "avg_gt_loss"))
    if name in ("retain", "forget"):
        return float(np.mean(p_true))
    p_false = np.array([np.exp(-x).sum() for x in _lists(log_set, "average_perturb_loss")])
    return float(np.mean(p_true / (p_true + p_false)))


def rouge_l(log_set: Mapping) -> float:
    """TOFU ROUGE: ``mean_q rougeL_recall``."""
    return float(np.mean(_vector(log_set, "rougeL_recall")))


def truth_ratios(log_set: Mapping) -> np.ndarray:
    """Per-question truth-ratio statistic ``R_q = exp(mean_i average_perturb_loss_i − avg_paraphrased_loss)``.

    Returned in sorted-integer question order. This is what the KS test of Forget Quality compares.
    """
    pert = np.array([x.mean() for x in _lists(log_set, "average_perturb_loss")])
    para = _vector(log_set, "avg_paraphrased_loss")
    return np.exp(pert - para)


def truth_ratio_metric(log_set: Mapping, forget: bool) -> float:
    """TOFU Truth Ratio: ``mean_q min(R_q, 1/R_q)`` for the forget set, else ``mean_q max(0, 1 − 1/R_q)``."""
    r = truth_ratios(log_set)
    if forget:
        return float(np.mean(np.minimum(r, 1.0 / r)))
    return float(np.mean(np.maximum(0.0, 1.0 - 1.0 / r)))


def component_metrics(log: Mapping) -> dict[str, float]:
    """The twelve component metrics ``{set}_probability``, ``{set}_rougeL``, ``{set}_truth_ratio``.

    Sets in the order ``retain``, ``real_authors``, ``world_facts``, ``forget``.
    """
    out: dict[str, float] = {}
    for name in LOG_SETS:
        s = log[FILES[name]]
        out[f"{name}_probability"] = probability(s, name)
        out[f"{name}_rougeL"] = rouge_l(s)
        out[f"{name}_truth_ratio"] = truth_ratio_metric(s, forget=name == "forget")
    return out


def model_utility(log: Mapping) -> float:
    """Model Utility: ``hmean`` of {Probability, ROUGE-L, Truth Ratio} × {retain, real authors, world facts}.

    The harmonic mean is 0 when any of the nine numbers is 0.
    """
    comps = component_metrics(log)
    values = [comps[f"{s}_{m}"] for s in UTILITY_SETS for m in ("probability", "rougeL", "truth_ratio")]
    if min(values) <= 0.0:
        return 0.0
    return float(hmean(values))


def forget_ks(
    log: Mapping, reference_log: Mapping, *, name: str = "log", reference_name: str = "reference_log"
) -> tuple[float, float]:
    """KS test of forget-set truth ratios, model vs retain-only reference: ``(statistic, p-value)``."""
    f = FILES["forget"]
    n, m = len(log[f]["avg_gt_loss"]), len(reference_log[f]["avg_gt_loss"])
    if n != m:
        raise ValueError(
            f"forget quality: {name} has {n} forget-set questions but {reference_name} has {m}; "
            "both must be evaluated on the same forget split"
        )
    res = ks_2samp(truth_ratios(log[f]), truth_ratios(reference_log[f]))
    return float(res.statistic), float(res.pvalue)


def forget_quality(
    log: Mapping, reference_log: Mapping, *, name: str = "log", reference_name: str = "reference_log"
) -> float:
    """Forget Quality: p-value of ``scipy.stats.ks_2samp`` between the forget-set ``R_q`` of ``log``
    and of the retain-only ``reference_log``. Forgetting succeeds when ``p > 0.1``.

    Raises ``ValueError`` naming both logs when their forget sets differ in size.
    """
    return forget_ks(log, reference_log, name=name, reference_name=reference_name)[1]


def answer_nll(log_set: Mapping) -> float:
    """Mean answer-token NLL of a set (nats): ``mean_q avg_gt_loss`` (the selectivity diagnostic)."""
    return float(np.mean(_vector(log_set, "avg_gt_loss")))


def metrics_frame(log: Mapping, reference_log: Mapping | None = None, model: str = "name") -> pd.DataFrame:
    """Tidy metrics: columns ``model, metric, value``; one row per metric.

    Rows: the twelve :func:`component_metrics`, ``forget_nll`` and ``retain_nll``
    (:func:`answer_nll`), then ``model_utility``, then ``forget_quality`` (only when
    ``reference_log`` is given).
    """
    rows = [(model, k, v) for k, v in component_metrics(log).items()]
    rows += [(model, f"{name}_nll", answer_nll(log[FILES[name]])) for name in ("forget", "retain")]
    rows.append((model, "model_utility", model_utility(log)))
    if reference_log is not None:
        rows.append(
            (model, "forget_quality", forget_quality(log, reference_log, name=model, reference_name="reference"))
        )
    return pd.DataFrame(rows, columns=["model", "metric", "value"]).astype({"value": "float64"})
