"""Speech-track reports: the paper's speech table, the energy comparison of the two settings, the rank figure.

* :func:`speech_table` — method rows; D_t ↑, D_f ↓, D_r ↑ (top-k accuracy, %) under one column group
  per setting ("Sample", "Class"), the fine-tuned model as the unranked reference row.
* :func:`speech_mia_table` — method rows; the LOSS attack's AUC (registered metric ``mia_loss``,
  :mod:`qrerase.tracks.speech.privacy`) per setting, ranked by distance to 0.5, the fine-tuned model as the
  unranked reference row.
* :func:`localisation` — how concentrated a setting's task energy E_ℓ (eq. 14) is: the largest E_ℓ, the
  number of layers with E_ℓ ≥ 1/|L| (eq. 15), the share of energy in them, and the effective number of
  layers exp(H), H = −Σ E_ℓ log E_ℓ (|L| for uniform energy, 1 when one layer holds everything).
  "More localised" = fewer effective layers.
* :func:`rank_curve` / :func:`rank_plot` — rank k vs the whole-model relative reconstruction error of
  the forget task matrices, sqrt(Σ_m e_m² ‖T_m‖²) / sqrt(Σ_m ‖T_m‖²) (e_m the per-module rank-k error of
  :func:`qrerase.method.diagnostics.factor_report`), and vs D_f / D_r accuracy after erasing at rank k.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ...method.energy import select_layers
from ...method.energy import threshold as energy_threshold
from ...metrics.registry import metric, metrics_for
from ...registry import RANK_PAIRS, method_labels
from ...reports.tables import Column, TableSpec
from ...workflow.naming import format_model

__all__ = [
    "SETTING_LABELS",
    "speech_table",
    "speech_mia_table",
    "localisation",
    "energy_compare_plot",
    "rank_curve",
    "rank_plot",
]

SETTING_LABELS = {"sample": "Sample", "class": "Class"}
_SET_HEADERS = {"D_t": ("$D_t$", True), "D_f": ("$D_f$", False), "D_r": ("$D_r$", True)}


def speech_table(
    evals: pd.DataFrame, settings: Sequence[str], models: Sequence[str], row_key=lambda m: m
) -> tuple[pd.DataFrame, TableSpec]:
    """Wide table from tidy evaluation rows (columns ``setting, model, set, accuracy``).

    One row per model of ``models`` (labelled ``row_key(model)``, e.g. ``qr_erase_k4`` → ``qr_erase``),
    columns ``<setting>_<set>`` in percent. Reference row: ``base`` ("Fine-Tuned Model"). Missing
    (setting, model, set) combinations raise ValueError naming them.
    """
    need = {"setting", "model", "set", "accuracy"}
    if not need <= set(evals.columns):
        raise ValueError(f"speech_table: evaluation rows need columns {sorted(need)}, got {list(evals.columns)}")
    lookup = {(r.setting, r.model, r.set): float(r.accuracy) for r in evals.itertuples(index=False)}
    rows, columns = [], []
    for s in settings:
        for name, (tex, hib) in _SET_HEADERS.items():
            columns.append(Column(f"{s}_{name}", name, hib, "{:.1f}", group=SETTING_LABELS.get(s, s), tex_header=tex))
    for m in models:
        row = {"method": row_key(m)}
        for s in settings:
            for name in _SET_HEADERS:
                if (s, m, name) not in lookup:
                    raise ValueError(f"speech_table: no {name} accuracy of model {m!r} in setting {s!r}")
                row[f"{s}_{name}"] = 100.0 * lookup[(s, m, name)]
        rows.append(row)
    spec = TableSpec(
        columns=tuple(columns), reference_rows=("base",), labels={**method_labels(), "base": "Fine-Tuned Model"}
    )
    return pd.DataFrame(rows), spec


#: Short headers of the speech attack table (other metrics: their registered label).
_MIA_HEADERS = {"mia_loss": "LOSS AUC"}


def speech_mia_table(
    values: Mapping[tuple[str, str], Mapping[str, float]],
    settings: Sequence[str],
    models: Sequence[str],
    row_key=lambda m: m,
) -> tuple[pd.DataFrame, TableSpec]:
    """``values``: (setting, model) -> {metric name: value} (rule speech_evaluate's ``metrics``). One row
    per model of ``models`` (labelled ``row_key(model)``); per setting (group: the setting's label), one
    column ``<setting>_<metric>`` per registered metric of the speech track
    (:func:`qrerase.metrics.registry.metrics_for`, registry order: the LOSS attack's AUC ``mia_loss``,
    then a plug-in's), ranked by the metric's direction (``mia_loss``: closest to 0.5 best). Reference
    row: ``base``. A missing (setting, model) or metric raises ValueError naming it.
    """
    names = [n for n in metrics_for("speech") if metric(n).aggregate in ("auc", "mean")]
    rows = []
    for m in models:
        row: dict[str, float | str] = {"method": row_key(m)}
        for s in settings:
            for n in names:
                if n not in values.get((s, m), {}):
                    raise ValueError(f"speech_mia_table: no {n} of model {m!r} in setting {s!r}")
                row[f"{s}_{n}"] = float(values[(s, m)][n])
        rows.append(row)
    columns = tuple(
        Column.for_metric(n, f"{s}_{n}", header=_MIA_HEADERS.get(n, metric(n).label), group=SETTING_LABELS.get(s, s))
        for s in settings
        for n in names
    )
    spec = TableSpec(columns=columns, reference_rows=("base",), labels={**method_labels(), "base": "Fine-Tuned Model"})
    return pd.DataFrame(rows, columns=["method", *(c.name for c in columns)]), spec


def localisation(energy: Mapping[str, float], selected: Sequence[str] | None = None) -> dict[str, float]:
    """Concentration of normalised layer energies (they must sum to 1): ``n_layers``, ``max_energy``,
    ``n_selected`` (the layers of ``selected``, rule energy's E_ℓ ≥ 1/|L| selection read by
    :func:`qrerase.method.energy.read_selection`; default: eq. 15 on ``energy``), ``selected_share``
    (Σ E_ℓ over them), ``effective_layers`` = exp(H). A selected layer not in ``energy``: ValueError."""
    e = np.asarray([float(v) for v in energy.values()], dtype=np.float64)
    if e.size == 0 or not np.isfinite(e).all() or (e < 0).any() or not math.isclose(e.sum(), 1.0, rel_tol=1e-6):
        raise ValueError(f"localisation: energies must be finite, non-negative and sum to 1, got {e.tolist()}")
    selected = select_layers(energy) if selected is None else list(selected)
    if unknown := [k for k in selected if k not in energy]:
        raise ValueError(f"localisation: selected layer(s) {unknown} have no energy")
    nz = e[e > 0]
    return {
        "n_layers": int(e.size),
        "max_energy": float(e.max()),
        "n_selected": len(selected),
        "selected_share": float(sum(float(energy[k]) for k in selected)),
        "effective_layers": float(math.exp(-(nz * np.log(nz)).sum())),
    }


def energy_compare_plot(
    energies: Mapping[str, Mapping[str, float]], path: str | os.PathLike, title: str | None = None
) -> None:
    """Grouped bars of E_ℓ per layer for several settings (same layers), with the 1/|L| line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ...reports.plots import finish_energy_axes

    if not energies:
        raise ValueError(f"{path}: no energies to plot")
    layers = list(next(iter(energies.values())))
    for name, e in energies.items():
        if list(e) != layers:
            raise ValueError(f"{path}: setting {name!r} has layers {list(e)}, expected {layers}")
    width = 0.8 / len(energies)
    fig = Figure(figsize=(max(4.0, 0.6 * len(layers) + 2.0), 3.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colours = ["#1f4e79", "#d95f02", "#1b9e77", "#7570b3"]
    x = np.arange(len(layers))
    for i, (name, e) in enumerate(energies.items()):
        stats = localisation(e)
        ax.bar(
            x - 0.4 + width * (i + 0.5),
            [e[k] for k in layers],
            width,
            color=colours[i % len(colours)],
            label=f"{name} (effective layers {stats['effective_layers']:.2f})",
        )
    finish_energy_axes(fig, ax, layers, energy_threshold(len(layers)), title, path)


def rank_curve(reports: Mapping[int, pd.DataFrame], evals: pd.DataFrame) -> pd.DataFrame:
    """Per rank k and decomposition: forget-task-matrix reconstruction error and D_f / D_r accuracy.

    ``reports[k]`` is the factor report at rank k; ``evals`` tidy rows (``model, set, accuracy``) of
    models ``qr_erase_k<k>`` (CPQR) and ``unlearn_k<k>`` (SVD). Returns columns ``rank, decomp,
    recon_error, D_f, D_r``.
    """
    rows = []
    acc = {(r.model, r.set): float(r.accuracy) for r in evals.itertuples(index=False)}
    for k in sorted(reports):
        rep = reports[k]
        f = rep[rep["set"] == "forget"]
        if f.empty:
            raise ValueError(f"rank_curve: factor report at rank {k} has no forget rows")
        norm2 = (f["fro_norm"].to_numpy(dtype=np.float64)) ** 2
        for decomp, method in RANK_PAIRS:
            err = f[f"recon_err_{decomp}"].to_numpy(dtype=np.float64)
            total = math.sqrt(float((err**2 * norm2).sum()) / float(norm2.sum()))
            model = format_model(method, k)
            try:
                rows.append((k, decomp, total, acc[(model, "D_f")], acc[(model, "D_r")]))
            except KeyError as exc:
                raise ValueError(f"rank_curve: no accuracy for {model} ({exc})") from None
    return pd.DataFrame(rows, columns=["rank", "decomp", "recon_error", "D_f", "D_r"])


def rank_plot(
    curves: Mapping[str, pd.DataFrame],
    path: str | os.PathLike,
    selected_rank: int | None = None,
    base: Mapping[str, Mapping[str, float]] | None = None,
) -> None:
    """Top: reconstruction error vs rank; bottom: D_f (solid) and D_r (dashed) accuracy vs rank;
    one column per setting, CPQR and SVD curves; dotted line at ``selected_rank``; grey marks at the
    fine-tuned model's accuracies (``base[setting]['D_f' / 'D_r']``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ...reports.plots import save_figure

    if not curves:
        raise ValueError(f"{path}: no rank curves to plot")
    fig = Figure(figsize=(4.2 * len(curves), 5.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(curves), squeeze=False, sharex="col")
    style = {"cpqr": ("#d95f02", "o", "CPQR (QR-Erase)"), "svd": ("#1f4e79", "s", "SVD (UNLEARN)")}
    for j, (setting, df) in enumerate(curves.items()):
        top, bottom = axes[0, j], axes[1, j]
        for decomp, (colour, marker, label) in style.items():
            d = df[df["decomp"] == decomp].sort_values("rank")
            top.plot(d["rank"], d["recon_error"], color=colour, marker=marker, label=label)
            bottom.plot(d["rank"], 100 * d["D_f"], color=colour, marker=marker, label=f"{label} $D_f$")
            bottom.plot(d["rank"], 100 * d["D_r"], color=colour, marker=marker, linestyle="--", label=f"{label} $D_r$")
        if base and setting in base:
            bottom.axhline(100 * base[setting]["D_f"], color="grey", linewidth=0.8, label="fine-tuned $D_f$")
        if selected_rank is not None:
            for ax in (top, bottom):
                ax.axvline(selected_rank, color="black", linestyle=":", linewidth=1)
        top.set_title(SETTING_LABELS.get(setting, setting) + " unlearning", fontsize=10)
        top.set_ylabel(r"$\|T_f - T_{f,k}\|_F / \|T_f\|_F$")
        bottom.set_ylabel("accuracy (%)")
        bottom.set_xlabel("rank $k$")
        ranks = sorted(df["rank"].unique())
        bottom.set_xticks(ranks)
        top.grid(alpha=0.3)
        bottom.grid(alpha=0.3)
        if j == 0:
            top.legend(frameon=False, fontsize=7)
            bottom.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
