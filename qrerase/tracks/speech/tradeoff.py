"""Speech trade-off sweeps (issue 14): D_r against D_f for every method, and the λ rule.

* :func:`subspace_sweep` — a subspace method (QR-Erase / UNLEARN, all layers or the LL selection) at
  every rank k and scale λ, erased in-process from the λ-free factors: per k, U = λ (I − P_r) Q_f,k
  and V = R_f,k Π_fᵀ (:func:`qrerase.method.discriminate.discriminate`), W' = W − U V on the selected modules
  (:func:`qrerase.method.erase.apply_updates`), the original weights restored between points.
* :func:`baseline_sweep` — an optimisation baseline (GA, SCRUB, Bad Teaching) at each value of one
  training knob (``epochs`` or ``lr``); the configured value re-uses the workflow's trained model.
* :func:`sweep_sets` — the track's evaluation sets D_t, D_f, D_r plus D_v, the held-out
  slice of the retained speakers (:func:`qrerase.tracks.speech.data.val_mask`), which only the λ rule reads.
* :func:`select_scale` — the λ rule (the speech form of :func:`qrerase.text.tradeoff.select_scale`): the
  largest λ of the grid whose D_v accuracy, for every given (setting, method) at the given rank, stays
  within ``max_drop`` points of the fine-tuned model's.
* :func:`tradeoff_plot` — D_r (y) against D_f (x), one panel per setting, one curve per method.

Every sweep returns tidy rows: ``setting, method, param, value, rank, D_t, D_f, D_r, D_v`` with
accuracies as fractions (top-k, k from the config) and ``rank`` empty for the baselines.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "SWEEP_COLUMNS",
    "sweep_sets",
    "evaluate_point",
    "subspace_sweep",
    "baseline_sweep",
    "select_scale",
    "tradeoff_plot",
]

SWEEP_COLUMNS = ["setting", "method", "param", "value", "rank", "D_t", "D_f", "D_r", "D_v"]


def sweep_sets(index: pd.DataFrame, setting: str) -> dict[str, np.ndarray]:
    """D_t, D_f, D_r of the setting (:func:`qrerase.tracks.speech.data.eval_masks`) and D_v (held-out slice)."""
    from .data import eval_masks, val_mask

    sets = {**eval_masks(index, setting), "D_v": val_mask(index, setting)}
    empty = [name for name, mask in sets.items() if not mask.any()]
    if empty:
        raise ValueError(
            f"speech sweep ({setting} setting): empty evaluation set(s) {empty}; D_v needs speech.val_fraction > 0"
        )
    return sets


def evaluate_point(
    model, arrays: Mapping[str, np.ndarray], sets: Mapping[str, np.ndarray], top_k: int, batch_size: int
) -> dict[str, float]:
    """Top-k accuracy (fraction) of ``model`` on every set: ``{'D_t': …, 'D_f': …, 'D_r': …, 'D_v': …}``."""
    from .train import evaluate_sets

    frame = evaluate_sets(model, arrays, sets, k=top_k, batch_size=batch_size)
    return dict(zip(frame["set"], frame["accuracy"].astype(float)))


def _row(setting: str, method: str, param: str, value: float, rank: Any, acc: Mapping[str, float]) -> dict:
    return {
        "setting": setting,
        "method": method,
        "param": param,
        "value": float(value),
        "rank": rank,
        **{s: acc[s] for s in ("D_t", "D_f", "D_r", "D_v")},
    }


def subspace_sweep(
    model,
    factors: Mapping[int, tuple[Mapping, Mapping]],
    scales: Sequence[float],
    evaluate: Callable[[Any], Mapping[str, float]],
    setting: str,
    method: str,
    modules: Sequence[str] | None = None,
    retain_rank: int | None = None,
) -> pd.DataFrame:
    """Erase ``model`` (the fine-tuned model, modified and restored in place) at every (k, λ).

    ``factors[k] = (forget, retain)``: module → :class:`qrerase.method.decompose.Decomposition` at rank k (the
    ``factors`` rule's output, independent of λ). ``modules``: the LL selection (eq. 16), None = every
    module (eq. 6). ``evaluate(model)`` returns the accuracies of one point. Rows ordered by k, then λ.
    """
    import torch

    from ...method.discriminate import discriminate
    from ...method.erase import apply_updates

    if not factors or not scales:
        raise ValueError(f"subspace_sweep ({method}): no ranks or no scales to sweep")
    for lam in scales:
        if not (isinstance(lam, (int, float)) and math.isfinite(lam)):
            raise ValueError(f"subspace_sweep ({method}): scale must be a finite number, got {lam!r}")
    first = next(iter(factors.values()))[0]
    names = list(first) if modules is None else list(modules)
    missing = [m for m in names if m not in first]
    if missing:
        raise ValueError(f"subspace_sweep ({method}): selected modules {missing[:3]} have no factors")
    original = {n: model.get_submodule(n).weight.detach().clone() for n in names}
    rows = []
    try:
        for k in sorted(factors):
            forget, retain = factors[k]
            unit = discriminate(forget, retain, retain_rank=retain_rank, scale=1.0)
            for lam in scales:
                apply_updates(model, {n: (float(lam) * unit[n].U, unit[n].V) for n in names})
                rows.append(_row(setting, method, "scale", lam, int(k), evaluate(model)))
                with torch.no_grad():
                    for n, w in original.items():
                        model.get_submodule(n).weight.copy_(w)
    finally:
        with torch.no_grad():
            for n, w in original.items():
                model.get_submodule(n).weight.copy_(w)
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def baseline_sweep(
    method: str,
    load_model: Callable[[], Any],
    arrays: Mapping[str, np.ndarray],
    forget_mask: np.ndarray,
    retain_mask: np.ndarray,
    cfg: Mapping[str, Any],
    param: str,
    values: Sequence[float],
    evaluate: Callable[[Any], Mapping[str, float]],
    setting: str,
    trained: Callable[[], Any] | None = None,
) -> pd.DataFrame:
    """Run baseline ``method`` from a fresh ``load_model()`` at each value of ``param`` (``epochs`` or
    ``lr``) over ``cfg`` (the settings of a :class:`qrerase.tracks.speech.settings.SpeechBaselineConfig`, seed and
    threads included); ``trained()`` returns the workflow's model at the configured value (re-used, not retrained)."""
    from .baselines import SpeechBaselineConfig, run_baseline

    if param not in ("epochs", "lr"):
        raise ValueError(f"baseline_sweep ({method}): sweep 'epochs' or 'lr', got {param!r}")
    if not values:
        raise ValueError(f"baseline_sweep ({method}): no {param} values to sweep")
    rows = []
    for value in values:
        if trained is not None and value == cfg.get(param):
            model = trained()
        else:
            swept = {**cfg, "method": method, param: int(value) if param == "epochs" else float(value)}
            point = SpeechBaselineConfig.from_dict(swept)
            model, _ = run_baseline(method, load_model(), arrays, forget_mask, retain_mask, point)
        rows.append(_row(setting, method, param, value, None, evaluate(model)))
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def select_scale(
    sweep: pd.DataFrame, base: pd.DataFrame, rank: int, methods: Sequence[str], max_drop: float = 0.05
) -> tuple[float | None, pd.DataFrame]:
    """The λ rule: the largest λ whose D_v accuracy stays ≥ (fine-tuned D_v − ``max_drop``) for every
    setting of ``base`` and every method of ``methods`` at rank ``rank``.

    ``sweep``: subspace rows (``param == 'scale'``); ``base``: one row per setting with its fine-tuned
    ``D_v``. Returns (λ or None when no λ qualifies, per (setting, method) frame with the largest
    admissible λ and the D_v drop at it). Only D_v is read: never D_t, D_f or D_r.
    """
    rows, selected = [], None
    sub = sweep[(sweep["param"] == "scale") & (sweep["rank"] == rank)]
    grid = sorted(set(sub["value"].astype(float)))
    if not grid:
        raise ValueError(f"select_scale: no subspace sweep rows at rank {rank}")
    admissible = set(grid)
    for b in base.itertuples(index=False):
        for method in methods:
            d = sub[(sub["setting"] == b.setting) & (sub["method"] == method)]
            if d.empty:
                raise ValueError(f"select_scale: no sweep rows for {method} in the {b.setting} setting at rank {rank}")
            dv = d["D_v"].astype(float)
            ok = d[np.isfinite(dv) & (dv >= b.D_v - max_drop - 1e-12)]  # a degenerate point never qualifies
            best = float(ok["value"].max()) if not ok.empty else None
            drop = None if best is None else float(b.D_v - ok.loc[ok["value"] == best, "D_v"].iloc[0])
            rows.append({"setting": b.setting, "method": method, "rank": rank, "largest_scale": best, "D_v_drop": drop})
            admissible &= set(ok["value"].astype(float))
    if admissible:
        selected = max(admissible)
    return selected, pd.DataFrame(rows, columns=["setting", "method", "rank", "largest_scale", "D_v_drop"])


def tradeoff_plot(
    sweep: pd.DataFrame, base: pd.DataFrame, path: str | os.PathLike, rank: int, labels: Mapping[str, str] | None = None
) -> None:
    """D_r (%) against D_f (%): one panel per setting; subspace methods at rank ``rank`` over λ (other
    ranks as faint dots), baselines over their knob; the fine-tuned model as a black star."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ...reports.plots import save_figure
    from .tables import SETTING_LABELS

    labels = dict(labels or {})
    settings = list(dict.fromkeys(base["setting"]))
    if not settings:
        raise ValueError(f"{path}: no settings to plot")
    fig = Figure(figsize=(5.0 * len(settings), 4.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(settings), squeeze=False)[0]
    colours = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]
    methods = list(dict.fromkeys(sweep["method"]))
    for ax, setting in zip(axes, settings):
        d = sweep[sweep["setting"] == setting]
        for i, method in enumerate(methods):
            m = d[d["method"] == method]
            colour = colours[i % len(colours)]
            if (m["param"] == "scale").any():
                other = m[m["rank"] != rank]
                ax.scatter(100 * other["D_f"], 100 * other["D_r"], color=colour, s=8, alpha=0.3)
                m = m[m["rank"] == rank]
                tag = f"λ, k={rank}"
            else:
                tag = m["param"].iloc[0] if len(m) else ""
            m = m.sort_values("value")
            ax.plot(
                100 * m["D_f"],
                100 * m["D_r"],
                color=colour,
                marker="o",
                markersize=3,
                label=f"{labels.get(method, method)} ({tag})",
            )
        b = base[base["setting"] == setting].iloc[0]
        ax.scatter([100 * b.D_f], [100 * b.D_r], marker="*", s=120, color="black", zorder=5, label="fine-tuned")
        ax.set_title(SETTING_LABELS.get(setting, setting) + " unlearning", fontsize=10)
        ax.set_xlabel("$D_f$ accuracy (%) ↓")
        ax.set_ylabel("$D_r$ accuracy (%) ↑")
        ax.set_xlim(-3, 103)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0].legend(frameon=False, fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)
