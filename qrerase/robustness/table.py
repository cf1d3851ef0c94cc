"""The ``<track>_robustness`` tables and figures from the stage's per-model rows (docs/robustness.md).

Input: one frame of every attacked model's rows (:data:`qrerase.robustness.runner.ROW_COLUMNS` plus
``model``), the names of the ceiling (fine-tuned) and floor (retain reference) models. Output:

* :func:`recovery_frame`: one row per model, attack setting, budget (or format) and scored set: the
  statistic, its recovery against the floor and ceiling put through the same attack, the relearning
  gain, the utility statistic; quantization rows add the share of the forgetting undone, the shift
  of the statistic and the median edit-to-step ratio;
* :func:`summary_markdown`: one line per model (its forgetting before the attack, the recovery after
  the largest budget of each training attack, each prompt attack's, each format's quantization recovery);
* :func:`subspace_frame`: the subspace diagnostic per model and subspace (mean share over the same
  modules for every row of a model, and its ratio to the random reference), with the retain control
  and the ceiling's own update in the model's erased subspace.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .measures import MIN_GAP, quantization_recovery, recovery, relearning_gain
from .settings import ATTACKS

__all__ = [
    "RECOVERY_COLUMNS",
    "recovery_frame",
    "summary_markdown",
    "subspace_frame",
    "SUBSPACES",
    "recovery_figure",
    "subspace_figure",
]

RECOVERY_COLUMNS = [
    "model",
    "attack",
    "mode",
    "lr_factor",
    "budget",
    "format",
    "set",
    "statistic",
    "recovery",
    "gain",
    "gap",
    "utility",
    "shift",
    "edit_step_ratio",
    "forgetting_undone",
    "overshoot",
]
_KEY = ["attack", "mode", "lr_factor", "budget", "format"]


def _value(frame: pd.DataFrame, model: str, key: tuple, scored: str) -> float:
    hit = frame[(frame["model"] == model) & (frame["set"] == scored)]
    for col, v in zip(_KEY, key):
        hit = hit[hit[col] == v]
    if len(hit) != 1:
        raise ValueError(
            f"robustness rows: {len(hit)} rows for model {model!r}, {dict(zip(_KEY, key))}, set {scored!r}"
        )
    return float(hit["value"].iloc[0])


def recovery_frame(rows: pd.DataFrame, ceiling: str, floor: str | None, models: Sequence[str]) -> pd.DataFrame:
    """The long table (:data:`RECOVERY_COLUMNS`), models in ``models`` order. A training attack's recovery
    is scaled by the floor and ceiling under the same attack and budget; ``floor`` None (a track without
    a floor) leaves recoveries empty. ``gap`` is ceiling − floor under the same attack and budget; where it is below
    :data:`~qrerase.robustness.measures.MIN_GAP` the recovery is undefined and left empty (the attack
    brought the floor to the ceiling: hypothesis 5 fails there; :func:`recovery` itself refuses it).
    Quantization: ``recovery`` is scaled like a training attack's, by the floor and ceiling put through
    the same round trip (empty without a floor); ``forgetting_undone`` is the unscaled share of the model's
    own forgetting the round trip undoes, (s_q − s_unlearned) / (s_fine-tuned − s_unlearned) (empty for the
    references and a model that forgot nothing); ``shift`` the statistic's change from the unquantized
    model. ``overshoot``: the model's forgetting went past the floor before any attack (its budget-0
    recovery on the row's set, for quantization its unattacked forget-set recovery, is below 0), so its
    ratios measure distance past the floor, not robustness; read ``statistic`` there."""
    rows = rows.fillna({"mode": "", "format": ""})
    out = []
    training = rows[rows["attack"] != "quantize"]
    for key, group in training.groupby(_KEY, sort=False):
        attack = key[0]
        sets = [
            s
            for s in group["set"].unique()
            if s in ATTACKS[attack]["scores"] or s.startswith("B:") and attack == "relearn"
        ]
        for model in models:
            for scored in sets:
                s = _value(rows, model, key, scored)
                rec = gap = np.nan
                if floor is not None:
                    what = f"recovery of {model} ({attack} {key[1]} x{key[2]} at {key[3]} steps, set {scored})"
                    low, high = _value(rows, floor, key, scored), _value(rows, ceiling, key, scored)
                    gap = high - low
                    if abs(gap) >= MIN_GAP:  # else undefined: the attack left the floor where the ceiling is
                        rec = recovery(s, low, high, what)
                out.append(
                    {
                        "model": model,
                        **dict(zip(_KEY, key)),
                        "set": scored,
                        "statistic": s,
                        "recovery": rec,
                        "gap": gap,
                        "utility": _value(rows, model, key, "utility"),
                    }
                )
    frame = pd.DataFrame(out)
    if not frame.empty and floor is not None:
        start = frame[frame["budget"] == 0].set_index(["model", "attack", "mode", "lr_factor", "set"])["recovery"]
        keys = frame[["model", "attack", "mode", "lr_factor", "set", "recovery"]].itertuples(index=False)
        starts = [start[(m, a, mo, f, s)] for m, a, mo, f, s, _ in keys]
        frame["gain"] = [relearning_gain(r, r0) for r, r0 in zip(frame["recovery"], starts)]
        frame["overshoot"] = [bool(r0 < 0) for r0 in starts]
    quant = []
    for fmt in rows.loc[rows["attack"] == "quantize", "format"].unique():
        key = ("quantize", "", 1.0, 0, fmt)
        for model in models:
            q = _value(rows, model, key, "forget")
            unq = _plain(rows, model)
            ceil = _plain(rows, ceiling)
            share = scaled = np.nan
            over = False
            if model not in (ceiling, floor) and abs(ceil - unq) > 1e-9:
                share = quantization_recovery(q, unq, ceil, f"quantization recovery of {model} ({fmt})")
            if floor is not None:
                low, high = _value(rows, floor, key, "forget"), _value(rows, ceiling, key, "forget")
                if abs(high - low) >= MIN_GAP:  # else undefined, as for a training attack
                    scaled = recovery(q, low, high, f"quantization recovery of {model} ({fmt}), scaled")
                floor0 = _plain(rows, floor)
                if abs(ceil - floor0) >= MIN_GAP:
                    over = recovery(unq, floor0, ceil, f"unattacked recovery of {model}") < 0
            ratio = rows[(rows["model"] == model) & (rows["format"] == fmt) & (rows["set"] == "weights")]["value"]
            quant.append(
                {
                    "model": model,
                    "attack": "quantize",
                    "mode": "",
                    "lr_factor": 1.0,
                    "budget": 0,
                    "format": fmt,
                    "set": "forget",
                    "statistic": q,
                    "recovery": scaled,
                    "forgetting_undone": share,
                    "overshoot": over,
                    "shift": q - unq,
                    "utility": _value(rows, model, key, "utility"),
                    "edit_step_ratio": float(ratio.iloc[0]) if len(ratio) else np.nan,
                }
            )
    return pd.concat([frame, pd.DataFrame(quant)], ignore_index=True).reindex(columns=RECOVERY_COLUMNS)


def _plain(rows: pd.DataFrame, model: str) -> float:
    """A model's unattacked forget statistic (budget 0 of any training attack: the model as given)."""
    hit = rows[
        (rows["model"] == model) & (rows["budget"] == 0) & (rows["attack"] != "quantize") & (rows["set"] == "forget")
    ]
    if hit.empty:
        raise ValueError(f"robustness rows: no unattacked forget score of model {model!r}")
    return float(hit["value"].iloc[0])


def _label(attack: str, mode: str, factor: float) -> str:
    return f"{attack} {mode} lr×{factor:g}"


def _kind(attack: str) -> str:
    return ATTACKS[attack]["kind"]


def summary_markdown(frame: pd.DataFrame, models: Sequence[str], labels: dict[str, str], statistic: str) -> str:
    """One line per model: the forget statistic on B before the attack and its recovery there, the
    recovery after the largest budget of each training attack on its first scored set (relearning and
    benign fine-tuning: B), that of the first relearning setting on B in each other language (``B:<lang>``
    sets), each prompt attack's recovery on B (in-context relearning at the largest m), each format's
    quantization recovery (scaled by the quantized floor and ceiling) and the Q4_0 edit-to-step ratio. A
    model whose forgetting went past the floor is marked so."""
    train = frame[frame["attack"].map(_kind) == "train"] if not frame.empty else frame
    prompt = frame[frame["attack"].map(_kind) == "prompt"] if not frame.empty else frame
    top = int(train["budget"].max()) if not train.empty else 0
    settings = list(train[["attack", "mode", "lr_factor"]].drop_duplicates().itertuples(index=False, name=None))
    langs = sorted(s for s in train["set"].unique() if s.startswith("B:"))  # B scored in other languages
    cross = [(*settings[0], lang) for lang in langs] if settings else []
    prompts = [(a, int(prompt.loc[prompt["attack"] == a, "budget"].max())) for a in prompt["attack"].unique()]
    fmts = list(frame.loc[frame["attack"] == "quantize", "format"].unique())
    ratio_fmts = ["q4_0"] if "q4_0" in fmts else fmts[:1]  # Zhang et al.'s explanation is about 4-bit
    header = ["Model", f"B {statistic}", "recovery₀"]
    header += [f"{_label(*s)} @{top}" for s in settings] + [f"{_label(*c[:3])} @{top} {c[3]}" for c in cross]
    header += [f"{a} m={b}" if a == "in_context" else a for a, b in prompts]
    header += [f"{f} recovery (scaled)" for f in fmts] + [f"{f} edit/step" for f in ratio_fmts] + ["utility"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def cell(v) -> str:
        return "–" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{round(float(v), 3) + 0.0:.3f}"

    def pick(m: str, attack: str, mode: str, factor: float, budget: int, scored: str, col: str):
        hit = frame[
            (frame["model"] == m)
            & (frame["attack"] == attack)
            & (frame["mode"] == mode)
            & (frame["lr_factor"] == factor)
            & (frame["budget"] == budget)
            & (frame["set"] == scored)
        ]
        return hit[col].iloc[0] if len(hit) else None

    def quant(m: str, fmt: str, col: str):
        hit = frame[(frame["model"] == m) & (frame["attack"] == "quantize") & (frame["format"] == fmt)]
        return hit[col].iloc[0] if len(hit) else None

    def own(attack: str) -> str:
        return ATTACKS[attack]["scores"][0]

    over = set(frame.loc[frame["overshoot"].fillna(False).astype(bool), "model"]) if "overshoot" in frame else set()
    for m in models:
        start = (*settings[0], 0, own(settings[0][0])) if settings else None
        row = [labels.get(m, m) + (" (overshoot: past the floor)" if m in over else "")]
        row += [cell(pick(m, *start, c) if start else None) for c in ("statistic", "recovery")]
        row += [cell(pick(m, a, mode, f, top, own(a), "recovery")) for a, mode, f in settings]
        row += [cell(pick(m, a, mode, f, top, lang, "recovery")) for a, mode, f, lang in cross]
        row += [cell(pick(m, a, "", 1.0, b, own(a), "recovery")) for a, b in prompts]
        row += [cell(quant(m, f, "recovery")) for f in fmts] + [
            cell(quant(m, f, "edit_step_ratio")) for f in ratio_fmts
        ]
        row.append(cell(pick(m, *start, "utility") if start else None))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


#: The diagnostic table's subspaces, in its order (``ceiling``: the ceiling's own relearning update in the
#: model's span(Q̃_f), the update's baseline direction).
SUBSPACES = ("erased", "ceiling", "task", "retain", "random")


def subspace_frame(
    sub: pd.DataFrame, models: Sequence[str], ceiling: str | None = None, spans: dict[str, str] | None = None
) -> pd.DataFrame:
    """Per model and subspace (:data:`SUBSPACES`): modules, mean and median share of the relearning update,
    the mean k / d_out, and the mean share over the random reference's mean share on the same modules
    (``× random``). Every row of a model averages the same modules: those its ``erased`` rows cover (an LL
    method's edited modules), else every module. ``ceiling`` and ``spans`` ({model: the name of its span in
    the ceiling's rows, ``erased:<name>``; default the model's own}) add the ``ceiling`` row: the ceiling's
    update on the model's modules, in the model's span(Q̃_f)."""
    out = []
    spans = spans or {}
    for m in models:
        g = sub[sub["model"] == m]
        if g.empty:
            continue
        mine = g[g["subspace"] == "erased"]
        modules = set(mine["module"]) if not mine.empty else set(g["module"])
        g = g[g["module"].isin(modules)]
        parts = {name: g[g["subspace"] == name] for name in SUBSPACES if name != "ceiling"}
        if ceiling is not None and not mine.empty:
            c = sub[(sub["model"] == ceiling) & sub["module"].isin(modules)]
            parts["ceiling"] = c[c["subspace"] == f"erased:{spans.get(m, m)}"]
            parts["ceiling_random"] = c[c["subspace"] == "random"]
        for name in SUBSPACES:
            h = parts.get(name)
            if h is None or h.empty:
                continue
            rand = (parts["ceiling_random"] if name == "ceiling" else parts["random"])["share"].mean()
            mean = float(h["share"].mean())
            out.append(
                {
                    "model": m,
                    "subspace": name,
                    "modules": len(h),
                    "mean_share": mean,
                    "median_share": float(h["share"].median()),
                    "k_over_d_out": float((h["k"] / h["d_out"]).mean()),
                    "x_random": mean / rand if rand > 0 else np.nan,
                }
            )
    return pd.DataFrame(
        out, columns=["model", "subspace", "modules", "mean_share", "median_share", "k_over_d_out", "x_random"]
    )


def recovery_figure(
    parts: Sequence[tuple[str, pd.DataFrame]], models: Sequence[str], labels: dict[str, str], title: str, out: str
) -> None:
    """Recovery against optimiser steps: one row of panels per experiment (``parts``: (name, its
    :func:`recovery_frame`)), one panel per training attack setting (on its first scored set, B), one line
    per model."""
    from matplotlib.figure import Figure

    from ..reports.plots import save_figure

    def scored(frame: pd.DataFrame) -> pd.DataFrame:
        train = frame[frame["attack"].map(_kind) == "train"]
        return train[train["set"] == train["attack"].map(lambda a: ATTACKS[a]["scores"][0])]

    settings = list(
        dict.fromkeys(
            s for _, f in parts for s in scored(f)[["attack", "mode", "lr_factor"]].itertuples(index=False, name=None)
        )
    )
    n, rows = max(1, len(settings)), max(1, len(parts))
    fig = Figure(figsize=(3.2 * n, 3.0 * rows + 0.4))
    axes = fig.subplots(rows, n, sharey=True, squeeze=False)
    for r, (exp, frame) in enumerate(parts):
        train = scored(frame)
        for ax, (a, mode, f) in zip(axes[r], settings):
            g = train[(train["attack"] == a) & (train["mode"] == mode) & (train["lr_factor"] == f)]
            for m in models:
                h = g[g["model"] == m].sort_values("budget")
                ax.plot(h["budget"], h["recovery"], marker="o", ms=3, label=labels.get(m, m))
            ax.set_title(f"{exp}: {_label(a, mode, f)}" if len(parts) > 1 else _label(a, mode, f), fontsize=8)
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlabel("optimiser steps")
            ax.axhline(0, color="grey", lw=0.5)
            ax.axhline(1, color="grey", lw=0.5, ls="--")
        axes[r][0].set_ylabel("recovery")
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, out, dpi=110)


def subspace_figure(parts: Sequence[tuple[str, pd.DataFrame]], labels: dict[str, str], title: str, out: str) -> None:
    """Mean share of the relearning update per model in each subspace (bars; random: the reference), one
    panel per experiment (``parts``: (name, its :func:`subspace_frame`))."""
    from matplotlib.figure import Figure

    from ..reports.plots import save_figure

    names = list(SUBSPACES)
    width = 0.8 / len(names)
    widest = max([len(set(t["model"])) for _, t in parts] or [1])
    fig = Figure(figsize=(max(4.0, 0.9 * widest + 1), 3.2 * max(1, len(parts))))
    axes = fig.subplots(max(1, len(parts)), 1, squeeze=False)
    for ax, (exp, table) in zip(axes[:, 0], parts):
        models = list(dict.fromkeys(table["model"]))
        for i, name in enumerate(names):
            h = table[table["subspace"] == name].set_index("model")["mean_share"]
            xs = [j + i * width for j, m in enumerate(models) if m in h.index]
            ax.bar(xs, [h[m] for m in models if m in h.index], width, label=name)
        ax.set_xticks(
            [j + width for j in range(len(models))],
            [labels.get(m, m) for m in models],
            rotation=30,
            ha="right",
            fontsize=7,
        )
        ax.set_ylabel("share of ‖ΔW‖²")
        ax.set_title(exp, fontsize=9)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
