"""The size study's table and figure: per width, seed and method the measures of
:mod:`qrerase.text.size_study`, their mean and spread over seeds, the log-log trend of selectivity
against parameter count, and its extrapolation to the paper's model sizes (labelled as such).

Per experiment (width, seed) it also records the membership-inference measures of the unedited
models (:data:`PRIVACY`, :func:`privacy_row`): the default attack's (Min-K%++) forget-vs-holdout AUC
of the fine-tuned model and of the retain reference, and the fine-tuned model's PrivLeak against the
reference: how much a width leaks before any unlearning (the sweep's points are not attacked)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..metrics.log_metrics import FORGET_QUALITY_THRESHOLD
from ..text.size_study import extrapolate, loglog_fit, rule_pick, selectivity_at_rise
from .plots import save_figure
from .tables import METHOD_LABELS

__all__ = [
    "sweep_rows",
    "exp_rows",
    "read_markdown_table",
    "aggregate",
    "trend",
    "render_markdown",
    "size_study_plot",
    "privacy_row",
    "PAPER_SIZES",
    "PRIVACY",
]

#: the paper's model sizes (parameters) the trend is extrapolated to.
PAPER_SIZES: dict[str, float] = {"7B": 7e9, "8B": 8e9, "70B": 70e9}

#: per-seed columns averaged per (width, method); the mechanistic ones are per experiment.
MEASURES = ("selectivity", "x_star", "picked", "forget_quality", "model_utility", "utility_rel")
MECHANISTIC = ("overlap", "overlap_random", "min_angle_deg", "effective_layers")
#: per-experiment membership-inference columns (:func:`privacy_row`), averaged like the mechanistic ones.
PRIVACY = ("base_mia_min_k_plus_plus", "base_privleak", "retain_mia_min_k_plus_plus")


def sweep_rows(points: pd.DataFrame, *, target: float, max_rise: float) -> pd.DataFrame:
    """One row per method of one sweep (``points``: the tradeoff point CSVs of
    :func:`qrerase.text.tradeoff.evaluate_text_point` of one model, subspace methods with a λ = 0 point).

    A subspace method's sweep runs over λ, a baseline's over epochs, both starting at the unedited
    model (the λ = 0 point). Columns: method, family, x_star / selectivity (:func:`selectivity_at_rise`
    at ``target`` nats), picked (:func:`rule_pick` at ``max_rise``), forget_quality, model_utility and
    utility_rel (Model Utility / the unedited model's) at the pick (NaN where the points were measured
    with the NLL-only protocol).
    """
    sub = points[points["family"] == "subspace"]
    base = sub[sub["scale"] == 0]
    if base.empty:
        raise ValueError("sweep: no λ = 0 point (tradeoff.scales needs 0)")
    base = base.iloc[0]
    rows = []
    for (family, method), grp in points.groupby(["family", "method"], sort=False):
        if family == "subspace":
            sweep = grp.assign(x=grp["scale"])
        else:
            sweep = pd.concat([base.to_frame().T, grp], ignore_index=True)
            sweep["x"] = [0.0, *grp["epochs"].astype(float)]
        sweep = sweep.sort_values("x", kind="stable")
        x = sweep["x"].astype(float).to_numpy()
        sel = selectivity_at_rise(x, sweep["forget_nll"].astype(float), sweep["tune_retain_nll"].astype(float), target)
        pick = rule_pick(x, sweep["tune_retain_nll"].astype(float), max_rise)
        at = sweep[x == pick].iloc[0]
        base_utility = float(base["model_utility"])
        rows.append(
            {
                "method": method,
                "family": family,
                "x_star": sel["x_star"],
                "selectivity": sel["selectivity"],
                "picked": pick,
                "forget_quality": float(at["forget_quality"]),
                "model_utility": float(at["model_utility"]),
                "utility_rel": float(at["model_utility"]) / base_utility if base_utility > 0 else math.nan,
            }
        )
    return pd.DataFrame(rows)


def exp_rows(
    points: pd.DataFrame, *, width: int, seed: int, n_params: int, target: float, max_rise: float
) -> pd.DataFrame:
    """:func:`sweep_rows` of one size-study experiment, preceded by its ``width``, ``seed`` and
    ``params`` (the fine-tuned model's parameter count)."""
    try:
        rows = sweep_rows(points, target=target, max_rise=max_rise)
    except ValueError as exc:
        raise ValueError(f"size study, width {width} seed {seed}: {exc}") from None
    rows.insert(0, "params", n_params)
    rows.insert(0, "seed", seed)
    rows.insert(0, "width", width)
    return rows


def privacy_row(sequence: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The :data:`PRIVACY` columns of one experiment from the ``sequence_metrics.json`` values of its
    ``base`` (fine-tuned) and ``retain`` models (:func:`qrerase.metrics.rows.metric_rows`: PrivLeak of the
    Min-K% AUC against the retain reference's, the Min-K%++ AUC). ValueError naming a missing model."""
    from ..metrics.rows import metric_rows

    missing = [m for m in ("base", "retain") if m not in sequence]
    if missing:
        raise ValueError(f"size study privacy: no sequence metrics of {missing}")
    rows = {
        str(r["method"]): r
        for r in metric_rows({m: sequence[m] for m in ("base", "retain")}, ("privleak", "mia_min_k_plus_plus"))
    }
    return {
        "base_mia_min_k_plus_plus": float(rows["base"]["mia_min_k_plus_plus"]),
        "base_privleak": float(rows["base"]["privleak"]),
        "retain_mia_min_k_plus_plus": float(rows["retain"]["mia_min_k_plus_plus"]),
    }


def aggregate(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample standard deviation (``<measure>_sd``; NaN with one seed) over seeds per
    (width, method), with the seed count and how many seeds reached the target rise (``reached``)."""
    cols = [c for c in (*MEASURES, *MECHANISTIC, *PRIVACY) if c in per_seed]
    order = {m: i for i, m in enumerate(dict.fromkeys(per_seed["method"]))}
    rows = []
    for (width, method), grp in per_seed.groupby(["width", "method"], sort=False):
        row = {"width": int(width), "params": int(grp["params"].iloc[0]), "method": method, "seeds": len(grp)}
        row["reached"] = int(grp["selectivity"].notna().sum())
        for c in cols:
            vals = grp[c].astype(float)
            row[c] = float(vals.mean()) if vals.notna().any() else math.nan
            row[f"{c}_sd"] = float(vals.std(ddof=1)) if vals.notna().sum() > 1 else math.nan
        rows.append(row)
    out = pd.DataFrame(rows)
    out["_m"] = out["method"].map(order)
    return out.sort_values(["_m", "width"], kind="stable").drop(columns="_m").reset_index(drop=True)


def trend(per_seed: pd.DataFrame, sizes: Mapping[str, float] = PAPER_SIZES) -> pd.DataFrame:
    """Per method: the log-log least-squares fit of selectivity against parameters over every (width,
    seed) point (:func:`loglog_fit`) and its extrapolation (with 95 % CI) to ``sizes``; ``note`` says
    why a method has no fit (fewer than 3 widths with a positive selectivity)."""
    rows = []
    for method, grp in per_seed.groupby("method", sort=False):
        fit = loglog_fit(grp["params"].astype(float), grp["selectivity"].astype(float))
        row: dict = {"method": method}
        if fit is None:
            row["note"] = "no fit: fewer than 3 widths with a positive selectivity"
        else:
            row.update({k: fit[k] for k in ("slope", "slope_se", "intercept", "n", "dropped")})
            row["note"] = "extrapolation: assumes the power law continues"
            for name, n in sizes.items():
                centre, lo, hi = extrapolate(fit, n) if fit["n"] > 2 else (math.nan,) * 3
                row[f"at_{name}"], row[f"at_{name}_lo"], row[f"at_{name}_hi"] = centre, lo, hi
        rows.append(row)
    return pd.DataFrame(rows)


def _pm(mean: float, sd: float, fmt: str) -> str:
    if not math.isfinite(mean):
        return "–"
    text = format(mean, fmt)
    return text if not math.isfinite(sd) else f"{text} ± {format(sd, fmt)}"


def render_markdown(agg: pd.DataFrame, fits: pd.DataFrame, target: float, max_rise: float) -> str:
    """The size study's Markdown table (mean ± sd over seeds) and the trend table."""
    privacy = all(c in agg for c in PRIVACY)
    head = (
        "| Method | Width | Params | Seeds | Selectivity | Forget Quality | Utility / base | Pick | "
        "Overlap (random) | N_eff layers |"
        + (" Min-K%++ AUC fine-tuned (retain) | PrivLeak fine-tuned |" if privacy else "")
        + "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|" if privacy else "")
        + "\n"
    )
    lines = []
    for _, r in agg.iterrows():
        extra = ""
        if privacy:
            extra = (
                f" {_pm(r['base_mia_min_k_plus_plus'], r['base_mia_min_k_plus_plus_sd'], '.3f')} "
                f"({_pm(r['retain_mia_min_k_plus_plus'], math.nan, '.3f')}) | "
                f"{_pm(r['base_privleak'], r['base_privleak_sd'], '.1f')} |"
            )
        lines.append(
            f"| {METHOD_LABELS.get(r['method'], r['method'])} | {r['width']} | {r['params']:,} | {r['seeds']} "
            f"({r['reached']} reached) | {_pm(r['selectivity'], r['selectivity_sd'], '.2f')} | "
            f"{_pm(r['forget_quality'], r['forget_quality_sd'], '.2e')} | "
            f"{_pm(r['utility_rel'], r['utility_rel_sd'], '.3f')} | {_pm(r['picked'], r['picked_sd'], 'g')} | "
            f"{_pm(r['overlap'], r['overlap_sd'], '.3f')} ({r['overlap_random']:.3f}) | "
            f"{_pm(r['effective_layers'], r['effective_layers_sd'], '.2f')} |" + extra
        )
    notes = (
        f"\nSelectivity: forget-set answer-NLL rise ÷ held-out retain NLL rise at the λ (epochs for a "
        f"baseline) where the held-out rise reaches {target:g} nats, interpolated on the grid ('reached': "
        f"seeds whose sweep got there). Forget Quality and Utility at the λ rule's pick (largest grid "
        f"value with held-out rise ≤ {max_rise:g} nats). Overlap: mean cos² of the principal angles "
        f"between the forget and retain SVD subspaces (random: k / d_out). N_eff: exp(entropy) of the "
        f"layer energies."
        + (
            " Min-K%++ AUC: forget-set vs holdout answers of the unedited fine-tuned model (mean ± sd over "
            "seeds; in parentheses the retain-only reference's; ideal 0.5). PrivLeak: the fine-tuned model's "
            "Min-K% AUC against the reference's (MUSE; ideal 0)."
            if privacy
            else ""
        )
        + "\n"
    )
    trend_lines = [
        "\n| Method | Slope (log-log) | Note | " + " | ".join(f"at {k} (95 % CI)" for k in PAPER_SIZES) + " |"
    ]
    trend_lines.append("|---|---:|---|" + "---:|" * len(PAPER_SIZES))
    for _, r in fits.iterrows():
        label = METHOD_LABELS.get(r["method"], r["method"])
        if "slope" not in r or not np.isfinite(r.get("slope", math.nan)):
            trend_lines.append(f"| {label} | – | {r['note']} |" + " – |" * len(PAPER_SIZES))
            continue
        cells = [f"{r[f'at_{k}']:.3g} [{r[f'at_{k}_lo']:.3g}, {r[f'at_{k}_hi']:.3g}]" for k in PAPER_SIZES]
        trend_lines.append(
            f"| {label} | {r['slope']:.3f} ± {r['slope_se']:.3f} | {r['note']} | " + " | ".join(cells) + " |"
        )
    return head + "\n".join(lines) + "\n" + notes + "\n".join(trend_lines) + "\n"


def size_study_plot(
    agg: pd.DataFrame,
    fits: pd.DataFrame,
    path: str | os.PathLike,
    title: str | None = None,
    extra: pd.DataFrame | None = None,
    extra_label: str | None = None,
) -> None:
    """Two panels against parameter count (log x), one line per method (mean ± sd over seeds):
    selectivity (log y; dashed: the fitted trend) and Forget Quality at the λ rule's pick (log y; the
    p = 0.1 line).

    ``extra``: points of a model that is not a width of the ladder (e.g. a real pretrained model),
    columns ``method``, ``params``, ``selectivity`` (and optionally ``forget_quality``), drawn as
    stars in their method's colour, with one legend entry ``extra_label``; NaN values are not drawn.
    """
    fig = Figure(figsize=(11, 4.4))
    ax_s, ax_q = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    markers = "os^vD<>ph*"
    fit_by = {r["method"]: r for _, r in fits.iterrows()}
    colours = {}
    for i, (method, grp) in enumerate(agg.groupby("method", sort=False)):
        label = METHOD_LABELS.get(method, method)
        n = grp["params"].to_numpy(dtype=float)
        for ax, col in ((ax_s, "selectivity"), (ax_q, "forget_quality")):
            y = np.maximum(grp[col].to_numpy(dtype=float), 1e-12)
            err = np.nan_to_num(grp[f"{col}_sd"].to_numpy(dtype=float))
            bars = ax.errorbar(n, y, yerr=err, marker=markers[i % len(markers)], ms=4, lw=1.2, capsize=2, label=label)
            colours[method] = bars.lines[0].get_color()
        fit = fit_by.get(method)
        if fit is not None and np.isfinite(fit.get("slope", math.nan)):
            xs = np.geomspace(n.min(), n.max(), 20)
            ax_s.plot(xs, 10 ** (fit["intercept"] + fit["slope"] * np.log10(xs)), ls="--", lw=0.8, color="0.4")
    if extra is not None and len(extra):
        star = {"marker": "*", "ms": 12, "ls": "none", "mec": "black", "mew": 0.6}
        for _, r in extra.iterrows():
            for ax, col in ((ax_s, "selectivity"), (ax_q, "forget_quality")):
                y = float(r.get(col, math.nan))
                if np.isfinite(y):
                    ax.plot([float(r["params"])], [max(y, 1e-12)], color=colours.get(r["method"], "0.2"), **star)
        ax_q.plot([], [], color="0.6", label=extra_label, **star)  # one legend entry for the stars
    ax_q.axhline(FORGET_QUALITY_THRESHOLD, color="0.3", ls="--", lw=1, label=f"p = {FORGET_QUALITY_THRESHOLD:g}")
    for ax, ylabel in (
        (ax_s, "selectivity (forget ÷ held-out retain NLL rise)"),
        (ax_q, "Forget Quality at the λ rule"),
    ):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    ax_q.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)


def read_markdown_table(text: str) -> pd.DataFrame:
    """The per-width table of a ``size_study.md`` as :func:`render_markdown` writes it (also when it is
    quoted in a docs page), back as :func:`aggregate`'s columns ``method, width, params, seeds,
    reached, selectivity(_sd), forget_quality(_sd)``: a published study can be re-plotted without its
    run directory. ``–`` reads as NaN; a row without ``±`` has sd NaN (one seed)."""
    by_label = {v: k for k, v in METHOD_LABELS.items()}

    def pm(cell: str) -> tuple[float, float]:
        parts = [c.strip() for c in cell.split("±")]
        value = math.nan if parts[0] in ("–", "") else float(parts[0])
        return value, float(parts[1]) if len(parts) > 1 else math.nan

    rows, inside = [], False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[:2] == ["Method", "Width"]:
            inside = True
            continue
        if not inside or set(line.strip()) <= set("|-: "):
            if inside and not line.strip():
                break
            continue
        seeds, _, reached = cells[3].partition(" (")
        sel, sel_sd = pm(cells[4])
        fq, fq_sd = pm(cells[5])
        rows.append(
            {
                "method": by_label.get(cells[0], cells[0]),
                "width": int(cells[1]),
                "params": int(cells[2].replace(",", "")),
                "seeds": int(seeds),
                "reached": int(reached.split()[0]) if reached else 0,
                "selectivity": sel,
                "selectivity_sd": sel_sd,
                "forget_quality": fq,
                "forget_quality_sd": fq_sd,
            }
        )
    if not rows:
        raise ValueError("no size-study table (a '| Method | Width | ...' header) in the text")
    return pd.DataFrame(rows)


def mechanistic_row(overlap: Sequence[Mapping[str, float]], energy: Mapping[str, float]) -> dict[str, float]:
    """The per-experiment mechanistic columns: means over layers of :func:`layer_overlap`'s rows and
    :func:`effective_layers` of the energy profile."""
    from ..method.separability import effective_layers

    return {
        "overlap": float(np.mean([r["overlap"] for r in overlap])),
        "overlap_random": float(np.mean([r["random"] for r in overlap])),
        "min_angle_deg": float(min(r["min_angle_deg"] for r in overlap)),
        "effective_layers": effective_layers(energy),
    }
