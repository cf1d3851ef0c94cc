"""The construction study's tables and frontier figure (rule construction_tables; docs/real-model.md).

Inputs are the study's artifacts as pandas frames: the variants' sweeps (``scale``, the three NLLs and
their rises above the unedited model), their per-module quantities, the TOFU-protocol points at the
λ rule's pick, the adapters' own effects and the baselines' points (answer-NLL sweep over epochs and
TOFU-protocol points).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..text.construction import with_unedited
from ..text.size_study import rule_pick, selectivity_at_rise
from .plots import save_figure

__all__ = ["VARIANT", "variant_rows", "baseline_rows", "module_summary", "construction_markdown", "frontier_plot"]

#: The columns naming a variant.
VARIANT = ["start", "projector", "rank", "method"]


def _metric(frame: pd.DataFrame, name: str) -> float:
    """A metric of a ``model,metric,value`` table."""
    hit = frame.loc[frame["metric"] == name, "value"]
    return float(hit.iloc[0]) if len(hit) else math.nan


def variant_rows(sweeps: pd.DataFrame, picks: pd.DataFrame, unedited: Mapping, max_rise: float) -> pd.DataFrame:
    """One row per variant: the λ rule's pick (``pick``) and the rises there, the selectivity at a
    held-out rise of ``max_rise`` (:func:`~qrerase.text.size_study.selectivity_at_rise`; NaN when the
    sweep never reaches it), the largest λ swept and whether the sweep stopped at the held-out bound,
    the largest forget rise reached, and the TOFU-protocol point at the pick where one was measured."""
    rows = []
    for key, grp in sweeps.groupby(VARIANT, sort=False):
        sweep = with_unedited(grp, unedited)
        x = sweep["scale"].astype(float).to_numpy()
        pick = rule_pick(list(x), list(sweep["tune_retain_nll"]), max_rise)
        at = sweep[x == pick].iloc[0]
        sel = selectivity_at_rise(list(x), list(sweep["forget_nll"]), list(sweep["tune_retain_nll"]), max_rise)
        row = dict(zip(VARIANT, key))
        row.update(
            pick=pick,
            forget_rise=float(at["forget_nll"]) - float(unedited["forget_nll"]),
            tune_retain_rise=float(at["tune_retain_nll"]) - float(unedited["tune_retain_nll"]),
            selectivity=sel["selectivity"],
            largest_scale=float(grp["scale"].max()),
            stopped=bool(grp["stopped"].any()),
            max_forget_rise=float(grp["forget_rise"].max()),
        )
        hit = picks
        for c, v in zip(VARIANT, key):
            hit = hit[hit[c] == v] if len(hit) else hit
        row["model_utility"] = float(hit["model_utility"].iloc[0]) if len(hit) else math.nan
        row["forget_quality"] = float(hit["forget_quality"].iloc[0]) if len(hit) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def baseline_rows(
    sweep: pd.DataFrame, points: pd.DataFrame, metrics: Mapping[str, pd.DataFrame], unedited: Mapping, max_rise: float
) -> pd.DataFrame:
    """One row per baseline and swept number of epochs: the rises (answer-NLL sweep), the TOFU-protocol
    point (from ``points``, or the method's main-table ``metrics`` at its configured epochs, which is the
    same training), and ``pick``: the epochs the λ rule's analogue picks (the most epochs whose held-out
    rise is at most ``max_rise``; 0 = the unedited model)."""
    rows = []
    for method, grp in sweep.groupby("method", sort=False):
        grp = grp.sort_values("epochs")
        x = np.array([0.0, *grp["epochs"].astype(float)])
        nll = np.array([float(unedited["tune_retain_nll"]), *grp["tune_retain_nll"].astype(float)])
        pick = rule_pick(list(x), list(nll), max_rise)
        for _, r in grp.iterrows():
            e = int(r["epochs"])
            hit = points[(points["method"] == method) & (points["epochs"] == e)]
            mu = float(hit["model_utility"].iloc[0]) if len(hit) else math.nan
            fq = float(hit["forget_quality"].iloc[0]) if len(hit) else math.nan
            if not len(hit) and e == int(grp["epochs"].max()) and method in metrics:
                mu, fq = _metric(metrics[method], "model_utility"), _metric(metrics[method], "forget_quality")
            rows.append(
                {
                    "method": method,
                    "epochs": e,
                    "forget_rise": float(r["forget_nll"]) - float(unedited["forget_nll"]),
                    "tune_retain_rise": float(r["tune_retain_nll"]) - float(unedited["tune_retain_nll"]),
                    "picked": e == pick,
                    "model_utility": mu,
                    "forget_quality": fq,
                }
            )
    return pd.DataFrame(rows)


def module_summary(modules: pd.DataFrame) -> pd.DataFrame:
    """Per variant and module type (``q_proj``, …): the edited modules, the mean ‖T_f‖_F, the mean
    energy the rank-k truncation keeps and the mean share of ‖T_f,k‖ that survives the retain projection."""
    frame = modules.assign(kind=modules["module"].str.rsplit(".", n=1).str[-1])
    out = (
        frame.groupby([*VARIANT, "kind"], sort=False)
        .agg(
            modules=("module", "size"),
            forget_norm=("forget_norm", "mean"),
            kept_energy=("kept_energy", "mean"),
            survives=("survives", "mean"),
            retain_columns=("retain_columns", "mean"),
        )
        .reset_index()
    )
    return out


def _fmt(v) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        return "–" if not math.isfinite(v) else f"{v:.3g}"
    return str(v)


def _md(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(frame.columns) + " |\n|" + "---|" * len(frame.columns) + "\n"
    return head + "".join("| " + " | ".join(_fmt(v) for v in r) + " |\n" for r in frame.itertuples(index=False))


def construction_markdown(
    variants: pd.DataFrame, baselines: pd.DataFrame, effects: pd.DataFrame, summary: pd.DataFrame
) -> str:
    """The Markdown page of the study's table: variants, baselines, the adapters' effects, and the
    explaining quantities averaged over every edited module of a variant."""
    per_variant = (
        summary.assign(w=summary["modules"])
        .groupby(VARIANT, sort=False)
        .apply(
            lambda g: pd.Series(
                {
                    "modules": int(g["w"].sum()),
                    "kept_energy": float(np.average(g["kept_energy"], weights=g["w"])),
                    "survives": float(np.average(g["survives"], weights=g["w"])),
                }
            ),
            include_groups=False,
        )
        .reset_index()
    )
    return (
        "# The construction study\n\n## Variants (the λ rule's pick)\n\n"
        + _md(variants)
        + "\n## Baselines\n\n"
        + _md(baselines)
        + "\n## The adapters on their own checkpoint (training-set answer NLL)\n\n"
        + _md(effects)
        + "\n## What the edit keeps (mean over the edited modules)\n\n"
        + _md(per_variant)
    )


def frontier_plot(
    sweeps: pd.DataFrame, variants: pd.DataFrame, baselines: pd.DataFrame, path: str | os.PathLike, max_rise: float
) -> None:
    """Forget-set answer NLL rise against the held-out retain rise: one panel per start, a line per
    variant through its λ points (from the unedited model at the origin), the baselines over epochs in
    every panel; a star where a TOFU-protocol point was measured. Both axes symlog."""
    starts = list(dict.fromkeys(sweeps["start"]))
    fig = Figure(figsize=(6.0 * len(starts), 4.8))
    for i, start in enumerate(starts):
        ax = fig.add_subplot(1, len(starts), i + 1)
        for key, grp in sweeps[sweeps["start"] == start].groupby(VARIANT, sort=False):
            grp = grp.sort_values("scale")
            x = [0.0, *grp["tune_retain_rise"].astype(float)]
            y = [0.0, *grp["forget_rise"].astype(float)]
            ax.plot(x, y, marker=".", ms=3, lw=0.9, label=f"{key[3]} k{key[2]} P_r:{key[1]}")
        marked = variants[(variants["start"] == start) & variants["forget_quality"].notna()]
        ax.scatter(
            marked["tune_retain_rise"],
            marked["forget_rise"],
            marker="*",
            s=70,
            c="k",
            zorder=3,
            label="TOFU-protocol point (λ rule)",
        )
        for method, grp in baselines.groupby("method", sort=False):
            ax.plot(
                [0.0, *grp["tune_retain_rise"]],
                [0.0, *grp["forget_rise"]],
                ls="--",
                marker="s",
                ms=4,
                lw=1.2,
                label=f"{method} (epochs)",
            )
        ax.axvline(max_rise, color="0.3", ls=":", lw=1)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_xlabel("held-out retain answer NLL rise (nats)")
        ax.set_ylabel("forget answer NLL rise (nats)")
        ax.set_title(f"adapters from the {start} checkpoint")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=5, loc="best", ncol=2)
    fig.tight_layout()
    save_figure(fig, path)
