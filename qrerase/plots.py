"""Figures, rendered with matplotlib's Agg canvas (no pyplot state, no display needed).

Every figure is written atomically and deterministically: the output format comes from the file
suffix (``.png``, ``.pdf``, ``.svg``), ``svg.hashsalt`` is fixed, and date/software metadata is
dropped, so the same input gives byte-identical files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .io import atomic_path  # noqa: E402

__all__ = ["save_figure", "truth_ratio_plot", "energy_plot"]

_METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    "svg": {"Creator": None, "Date": None},
}
_RC = {"svg.hashsalt": "qrerase", "svg.fonttype": "path", "pdf.compression": 6}


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 150) -> None:
    """Save ``fig`` atomically and deterministically; the format is taken from ``path``'s suffix."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in _METADATA:
        raise ValueError(f"{path}: unsupported figure format {fmt!r} (use .png, .pdf or .svg)")
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    with matplotlib.rc_context(_RC), atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi, metadata=_METADATA[fmt])


def _ecdf(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xs = np.sort(np.asarray(x, dtype=np.float64))
    ys = np.arange(1, xs.size + 1) / xs.size
    return xs, ys


def truth_ratio_plot(
    ratios: Mapping[str, np.ndarray],
    reference_label: str,
    path: str | os.PathLike,
    title: str | None = "Forget-set truth ratios vs retain reference",
    labels: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """ECDFs of forget-set truth ratios ``R_q`` (see :func:`qrerase.tofu.truth_ratios`) per method.

    The retain-only reference (``ratios[reference_label]``) is drawn as a dashed black line; every
    other curve's legend entry carries the KS p-value against it — exactly TOFU's Forget Quality,
    since the KS statistic is the largest vertical gap between the two ECDFs. The x axis is
    logarithmic (``R`` spans orders of magnitude). ``labels`` maps keys to display names (default
    :data:`qrerase.tables.METHOD_LABELS`). Returns ``{key: p-value}`` for the non-reference keys.
    """
    from scipy.stats import ks_2samp

    from .tables import METHOD_LABELS

    if reference_label not in ratios:
        raise ValueError(f"truth_ratio_plot: reference {reference_label!r} not among {list(ratios)}")
    names = labels if labels is not None else METHOD_LABELS
    clean: dict[str, np.ndarray] = {}
    for key, arr in ratios.items():
        a = np.asarray(arr, dtype=np.float64).ravel()
        if a.size == 0:
            raise ValueError(f"truth_ratio_plot: no truth ratios for {key!r}")
        if not np.all(np.isfinite(a)) or np.any(a <= 0):
            raise ValueError(f"truth_ratio_plot: truth ratios of {key!r} must be finite and positive")
        clean[key] = a
    ref = clean[reference_label]

    fig = Figure(figsize=(6.0, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    pvalues: dict[str, float] = {}
    colors = matplotlib.colormaps["tab10"].colors
    k = 0
    for key, a in clean.items():
        if key == reference_label:
            continue
        p = float(ks_2samp(a, ref).pvalue)
        pvalues[key] = p
        xs, ys = _ecdf(a)
        mark = " ✓" if p > 0.1 else ""
        ax.step(xs, ys, where="post", color=colors[k % len(colors)], lw=1.5,
                label=f"{names.get(key, key)} (KS p = {p:.3g}{mark})")
        k += 1
    xs, ys = _ecdf(ref)
    ax.step(xs, ys, where="post", color="black", ls="--", lw=1.8,
            label=f"{names.get(reference_label, reference_label)} (KS reference)")
    ax.set_xscale("log")
    ax.set_xlabel(r"truth ratio $R = \exp(\overline{\ell}_{\mathrm{pert}} - \ell_{\mathrm{para}})$")
    ax.set_ylabel("ECDF over forget-set questions")
    ax.set_ylim(0.0, 1.02)
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8, frameon=True)
    fig.tight_layout()
    save_figure(fig, path)
    return pvalues


def energy_plot(
    energy: Mapping[str, float],
    path: str | os.PathLike,
    title: str | None = "Layer-wise normalised task energy",
) -> None:
    """Bars of the normalised task energy E_ℓ per layer (eq. 14) with the dashed 1/|L| line (eq. 15).

    Layers at or above the line (the layer-localised selection) are drawn in a darker colour, like
    the paper's "Layer-wise normalised task energy" figure.
    """
    if not energy:
        raise ValueError(f"{path}: no layers to plot")
    names = list(energy)
    values = np.asarray([energy[n] for n in names], dtype=np.float64)
    threshold = 1.0 / len(names)
    fig = Figure(figsize=(max(4.0, 0.35 * len(names) + 2.0), 3.2))
    ax = fig.add_subplot(1, 1, 1)
    colours = ["#1f4e79" if v >= threshold * (1 - 1e-9) else "#9ecae1" for v in values]
    ax.bar(np.arange(len(names)), values, color=colours)
    ax.axhline(threshold, color="black", linestyle="--", linewidth=1, label=r"$1/|\mathcal{L}|$")
    ax.set_xticks(np.arange(len(names)))
    ax.set_xticklabels(names, rotation=90 if len(names) > 12 else 0, fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel(r"$E_\ell$")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
