"""Figures, rendered with matplotlib's Agg canvas (no pyplot state, no display needed).

Every figure is written atomically and deterministically: the output format comes from the file
suffix (``.png``, ``.pdf``, ``.svg``), ``svg.hashsalt`` is fixed, and date/software metadata is
dropped, so the same input gives byte-identical files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..io import atomic_path
from ..method.energy import select_layers
from ..method.energy import threshold as energy_threshold
from ..metrics.log_metrics import FORGET_QUALITY_THRESHOLD

__all__ = [
    "save_figure",
    "truth_ratio_plot",
    "energy_plot",
    "energy_overlay_plot",
    "tradeoff_plot",
]

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
    """ECDFs of forget-set truth ratios ``R_q`` (see :func:`qrerase.metrics.log_metrics.truth_ratios`) per method.

    The retain-only reference (``ratios[reference_label]``) is drawn as a dashed black line; every
    other curve's legend entry carries the KS p-value against it — exactly TOFU's Forget Quality,
    since the KS statistic is the largest vertical gap between the two ECDFs. The x axis is
    logarithmic (``R`` spans orders of magnitude). ``labels`` maps keys to display names (default
    :data:`qrerase.reports.tables.METHOD_LABELS`). Returns ``{key: p-value}`` for the non-reference keys.
    """
    from scipy.stats import ks_2samp

    from ..registry import method_labels

    if reference_label not in ratios:
        raise ValueError(f"truth_ratio_plot: reference {reference_label!r} not among {list(ratios)}")
    names = labels if labels is not None else method_labels()
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
        mark = " ✓" if p > FORGET_QUALITY_THRESHOLD else ""
        ax.step(
            xs,
            ys,
            where="post",
            color=colors[k % len(colors)],
            lw=1.5,
            label=f"{names.get(key, key)} (KS p = {p:.3g}{mark})",
        )
        k += 1
    xs, ys = _ecdf(ref)
    ax.step(
        xs,
        ys,
        where="post",
        color="black",
        ls="--",
        lw=1.8,
        label=f"{names.get(reference_label, reference_label)} (KS reference)",
    )
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
    selected: Sequence[str] | None = None,
) -> None:
    """Bars of the normalised task energy E_ℓ per layer (eq. 14) with the dashed 1/|L| line (eq. 15).

    The layers of ``selected`` (the layer-localised selection, e.g. rule energy's; default: eq. 15 on
    ``energy``, :func:`qrerase.method.energy.select_layers`) are drawn in a darker colour, like the
    paper's "Layer-wise normalised task energy" figure. A selected layer not in ``energy``: ValueError.
    """
    if not energy:
        raise ValueError(f"{path}: no layers to plot")
    names = list(energy)
    chosen = set(select_layers(energy) if selected is None else selected)
    if unknown := sorted(chosen - set(names)):
        raise ValueError(f"{path}: selected layer(s) {unknown} have no energy")
    values = np.asarray([energy[n] for n in names], dtype=np.float64)
    fig = Figure(figsize=(max(4.0, 0.35 * len(names) + 2.0), 3.2))
    ax = fig.add_subplot(1, 1, 1)
    colours = ["#1f4e79" if n in chosen else "#9ecae1" for n in names]
    ax.bar(np.arange(len(names)), values, color=colours)
    finish_energy_axes(fig, ax, names, energy_threshold(len(names)), title, path)


def energy_overlay_plot(
    energies: Mapping[str, Mapping[str, float]],
    path: str | os.PathLike,
    title: str | None = "Layer-wise normalised task energy per unlearning language",
) -> None:
    """Grouped bars of E_ℓ (eq. 14) per layer, one colour per series (e.g. unlearning language).

    ``energies`` maps a series label to ``{layer: E_ℓ}``; every series must have the same layers (the
    same model). The dashed line is the selection threshold 1/|L| (eq. 15): where the bars of all
    languages clear it, the same layers carry the forget set in every language.
    """
    if not energies:
        raise ValueError(f"{path}: no energy series to plot")
    series = list(energies)
    layers = list(energies[series[0]])
    for name in series[1:]:
        if list(energies[name]) != layers:
            raise ValueError(f"{path}: series {name!r} has layers {list(energies[name])}, expected {layers}")
    if not layers:
        raise ValueError(f"{path}: no layers to plot")
    width = 0.8 / len(series)
    colours = matplotlib.colormaps["tab10"].colors
    fig = Figure(figsize=(max(4.5, 0.45 * len(layers) * max(1, len(series) / 2) + 2.5), 3.4))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(layers), dtype=np.float64)
    for i, name in enumerate(series):
        values = np.asarray([energies[name][layer] for layer in layers], dtype=np.float64)
        ax.bar(x - 0.4 + width * (i + 0.5), values, width=width, color=colours[i % len(colours)], label=name)
    finish_energy_axes(fig, ax, layers, energy_threshold(len(layers)), title, path)


def finish_energy_axes(fig, ax, layers, threshold: float, title: str | None, path: str | os.PathLike) -> None:
    """Common finish of the energy bar charts: the 1/|L| selection line (eq. 15), layer ticks, labels, save."""
    ax.axhline(threshold, color="black", linestyle="--", linewidth=1, label=r"$1/|\mathcal{L}|$")
    ax.set_xticks(np.arange(len(layers)))
    ax.set_xticklabels(layers, rotation=90 if len(layers) > 12 else 0, fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel(r"$E_\ell$")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def tradeoff_plot(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | os.PathLike,
    xlabel: str,
    ylabel: str,
    log_x: bool = False,
    xline: float | None = None,
    xline_label: str | None = None,
    title: str | None = None,
) -> None:
    """One curve per method through its sweep points (``{label: (x, y)}``, in sweep order).

    TOFU / cross-lingual: x = Forget Quality (``log_x``, ``xline`` = 0.1, the p > 0.1 criterion),
    y = Model Utility relative to the base model; speech: x = D_f, y = D_r. Points with a
    non-positive x on a log axis are drawn at the axis floor (1e-12) so that no point disappears.
    """
    fig = Figure(figsize=(6.4, 4.6))
    ax = fig.add_subplot(1, 1, 1)
    markers = "os^vD<>ph*"
    for i, (label, (x, y)) in enumerate(curves.items()):
        x = np.asarray(x, dtype=np.float64)
        if log_x:
            x = np.maximum(x, 1e-12)
        ax.plot(x, np.asarray(y, dtype=np.float64), marker=markers[i % len(markers)], ms=4, lw=1.2, label=label)
    if log_x:
        ax.set_xscale("log")
    if xline is not None:
        ax.axvline(xline, color="0.3", ls="--", lw=1, label=xline_label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    save_figure(fig, path)
