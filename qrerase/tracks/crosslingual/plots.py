"""The cross-lingual track's figure: relative Model Utility vs Forget Quality per language pair (matplotlib, Agg)."""

from __future__ import annotations

import os
from collections.abc import Mapping

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from ...metrics.log_metrics import FORGET_QUALITY_THRESHOLD
from ...reports.plots import save_figure

__all__ = ["crosslingual_scatter"]


def crosslingual_scatter(
    points,
    path: str | os.PathLike,
    labels: Mapping[str, str] | None = None,
    title: str | None = None,
    threshold: float = FORGET_QUALITY_THRESHOLD,
) -> None:
    """The paper's cross-lingual figure: relative Model Utility vs Forget Quality per language pair.

    ``points``: rows (a DataFrame or a list of dicts) with ``unlearn`` (language the model unlearned
    in), ``eval`` (language it is evaluated in), ``relative_utility`` (Model Utility divided by the base
    model's in the evaluation language) and ``forget_quality`` (KS p-value). Colour = unlearning
    language, marker = evaluation language; the x axis is logarithmic with the ``p = threshold``
    forgetting criterion drawn dashed. ``labels`` maps language codes to display names.
    """
    import pandas as pd
    from matplotlib.lines import Line2D

    frame = pd.DataFrame(points)
    need = {"unlearn", "eval", "relative_utility", "forget_quality"}
    if frame.empty or not need <= set(frame.columns):
        raise ValueError(f"{path}: need rows with columns {sorted(need)} (got {list(frame.columns)})")
    fq = frame["forget_quality"].to_numpy(dtype=np.float64)
    if not np.all(np.isfinite(fq)) or np.any(fq < 0) or np.any(fq > 1):
        raise ValueError(f"{path}: forget_quality must be p-values in [0, 1]")
    names = dict(labels or {})
    unlearn = list(dict.fromkeys(frame["unlearn"]))
    evals = list(dict.fromkeys(frame["eval"]))
    colours = matplotlib.colormaps["tab10"].colors
    markers = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
    floor = max(float(np.min(fq[fq > 0])) if np.any(fq > 0) else 1e-30, 1e-300) / 10
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot(1, 1, 1)
    for _, row in frame.iterrows():
        ax.scatter(
            max(float(row["forget_quality"]), floor),
            float(row["relative_utility"]),
            color=colours[unlearn.index(row["unlearn"]) % len(colours)],
            marker=markers[evals.index(row["eval"]) % len(markers)],
            s=55,
            edgecolors="black",
            linewidths=0.5,
        )
    ax.axvline(threshold, color="black", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"Forget Quality (KS p-value, log scale; dashed: p = {threshold:g})")
    ax.set_ylabel("Model Utility / base model's (eval language)")
    ax.grid(True, which="major", alpha=0.3)
    colour_handles = [
        Line2D([], [], color=colours[i % len(colours)], marker="o", linestyle="", label=names.get(x, x))
        for i, x in enumerate(unlearn)
    ]
    marker_handles = [
        Line2D([], [], color="grey", marker=markers[i % len(markers)], linestyle="", label=names.get(y, y))
        for i, y in enumerate(evals)
    ]
    first = ax.legend(
        handles=colour_handles,
        title="unlearn in",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )
    ax.add_artist(first)
    ax.legend(
        handles=marker_handles,
        title="evaluate in",
        loc="lower left",
        bbox_to_anchor=(1.01, 0.0),
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
