"""The construction study of the paper's task vectors (docs/real-model.md, "The construction study").

The study varies how the edit W' = W − λ T̃_f (eqs. 3–6) is built, on the same fine-tuned model:

- the checkpoint the two task adapters learn from (``start``: ``finetuned`` or ``pretrained``);
- the retain projector P_r = Q_r Q_rᵀ of eq. 3 (``projector``): ``k``, the leading k columns of Q_r
  (the workflow's default, ``unlearn.retain_rank: null``), or ``full``, every column of the retain
  task matrix's orthonormal basis (its rank: the LoRA rank r, or less for a smaller module), as eqs. 3–4
  write it: only Q_f is truncated to k;
- k; and λ, on a doubling grid that stops past a held-out bound (:func:`doubling_sweep`).

Everything here is pure: the study's rules (``rules/studies/construction.smk``) load models, adapters
and data and call these functions. Arrays are float64 numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..method.decompose import Decomposition, check_decomp, decompose_any
from ..method.discriminate import Update, check_module_pairs, discriminate
from ..method.lowrank import as_lowrank

__all__ = [
    "PROJECTORS",
    "STARTS",
    "retain_projector_rank",
    "construction_updates",
    "explaining_rows",
    "doubling_sweep",
    "matching_scale",
    "check_construction",
    "with_unedited",
]

#: The retain projectors the study compares (:func:`retain_projector_rank`).
PROJECTORS: tuple[str, ...] = ("k", "full")
#: The checkpoints the task adapters may learn from.
STARTS: tuple[str, ...] = ("finetuned", "pretrained")


def retain_projector_rank(projector: str, rank: int, retain: Any, name: str | None = None) -> int:
    """The number of columns of Q_r in P_r = Q_r Q_rᵀ (eq. 3).

    ``projector="k"``: ``rank`` (k; at most the retain task matrix's rank). ``projector="full"``: the
    rank of the retain task matrix T_r = B A (``retain``: LowRank or a (B, A) pair, B (d_out×r),
    A (r×d_in)): its numerical rank, read from the small r×d_in matrix R_B A (B = Q_B R_B, the thin QR;
    rank(B A) = rank(R_B A) since Q_B has orthonormal columns) with ``numpy.linalg.matrix_rank``'s tolerance.
    """
    if projector not in PROJECTORS:
        raise ValueError(f"{name or 'projector'}: expected one of {list(PROJECTORS)}, got {projector!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{name or 'rank'}: k must be an integer >= 1, got {rank!r}")
    lr = as_lowrank(retain, name)
    _, r_b = np.linalg.qr(lr.B)
    full = int(np.linalg.matrix_rank(r_b @ lr.A))
    if full < 1:
        raise ValueError(f"{name or 'retain'}: the retain task matrix is zero (rank 0)")
    return full if projector == "full" else min(rank, full)


def construction_updates(
    forget: Mapping[str, Any],
    retain: Mapping[str, Any],
    rank: int,
    decomp: str,
    projector: str,
    modules: Iterable[str] | None = None,
) -> tuple[dict[str, Update], dict[str, tuple[Decomposition, int]]]:
    """T̃_f = (I − P_r) Q_f,k R_f,k Π_fᵀ per module at λ = 1 (eqs. 3–5) under a retain ``projector``.

    ``forget``, ``retain``: module → LowRank (or (B, A)) task matrices of the same modules and shapes.
    ``decomp``: ``"cpqr"`` (QR-Erase) or ``"svd"`` (UNLEARN). ``modules``: the modules to edit (the LL
    variants' layers of eq. 16), default all, in the order of ``forget``.

    Returns ``(updates, details)``: ``updates`` module → Update (U d_out×k, V k×d_in, U V = T̃_f);
    ``details`` module → (the forget decomposition at rank k, the number of Q_r columns in P_r).
    """
    check_decomp(decomp)
    check_module_pairs(forget, retain)
    wanted = None if modules is None else set(modules)
    if wanted is not None and wanted - set(forget):
        raise ValueError(f"modules not present in the task matrices: {sorted(wanted - set(forget))[:5]}")
    updates: dict[str, Update] = {}
    details: dict[str, tuple[Decomposition, int]] = {}
    for m in forget:
        if wanted is not None and m not in wanted:
            continue
        columns = retain_projector_rank(projector, rank, retain[m], m)
        df = decompose_any(forget[m], rank, decomp, m)
        dr = decompose_any(retain[m], columns, decomp, m)
        updates[m] = discriminate({m: df}, {m: dr}, retain_rank=columns)[m]  # eqs. 4-5 at lambda = 1
        details[m] = (df, columns)
    return updates, details


def explaining_rows(forget: Mapping[str, Any], updates: Mapping[str, Update], details: Mapping) -> list[dict]:
    """Per edited module, the quantities that explain an edit's size:

    - ``forget_norm`` ‖T_f‖_F and ``kept_energy`` ‖T_f,k‖_F² / ‖T_f‖_F² (the energy the rank-k
      truncation keeps; ‖T_f,k‖_F² = ‖T_f‖_F² − ‖T_f − T_f,k‖_F², eq. 7);
    - ``survives`` ‖T̃_f‖_F / ‖T_f,k‖_F (the share of the truncated task matrix left after the retain
      projection, eq. 4; ≤ 1);
    - ``retain_columns``: the columns of Q_r in P_r.
    """
    rows = []
    for m, (U, V) in updates.items():
        df, columns = details[m]
        total = float(df.fro_norm)
        kept2 = max(total**2 - float(df.residual_norm) ** 2, 0.0)
        tilde = float(np.linalg.norm(np.asarray(U) @ np.asarray(V)))
        rows.append(
            {
                "module": m,
                "forget_norm": total,
                "kept_energy": kept2 / total**2 if total > 0 else float("nan"),
                "survives": tilde / math.sqrt(kept2) if kept2 > 0 else float("nan"),
                "retain_columns": int(columns),
                "d_out": int(as_lowrank(forget[m], m).shape[0]),
            }
        )
    return rows


def doubling_sweep(
    point: Callable[[float], Mapping[str, float]],
    scales: Sequence[float],
    unedited_rise_base: float,
    stop_rise: float,
    column: str = "tune_retain_nll",
) -> list[dict]:
    """Evaluate ``point(λ)`` at each λ of ``scales`` (ascending) until the held-out statistic ``column``
    has risen by more than ``stop_rise`` above ``unedited_rise_base`` (the unedited model's value); the
    point that crosses the bound is kept, the larger λ are not evaluated. Returns the rows, each with
    ``scale`` and ``stopped`` (True on the crossing point).
    """
    xs = [float(s) for s in scales]
    if not xs or any(not math.isfinite(s) or s <= 0 for s in xs) or xs != sorted(set(xs)):
        raise ValueError(f"scales: expected distinct positive ascending values, got {list(scales)!r}")
    if not (math.isfinite(stop_rise) and stop_rise > 0):
        raise ValueError(f"stop_rise: expected a positive number, got {stop_rise!r}")
    rows = []
    for s in xs:
        row = {"scale": s, **point(s)}
        crossed = bool(float(row[column]) - unedited_rise_base > stop_rise)
        row["stopped"] = crossed
        rows.append(row)
        if crossed:
            break
    return rows


def matching_scale(rows: Sequence[Mapping[str, float]], target_rise: float) -> tuple[float, bool]:
    """The smallest swept λ whose ``forget_rise`` reaches ``target_rise`` (an optimisation baseline's
    forget NLL rise at its trade-off pick), as ``(λ, True)``; the largest swept λ and ``False`` if none
    does. ``rows``: dicts with ``scale`` and ``forget_rise``."""
    if not rows:
        raise ValueError("matching_scale: no points")
    ordered = sorted(rows, key=lambda r: float(r["scale"]))
    for r in ordered:
        if float(r["forget_rise"]) >= target_rise:
            return float(r["scale"]), True
    return float(ordered[-1]["scale"]), False


def with_unedited(points: Any, unedited: Mapping[str, float]) -> Any:
    """A variant's sweep (DataFrame with ``scale`` and the NLL columns) with the unedited model's row as
    its λ = 0 point, sorted by λ: the form :func:`qrerase.text.size_study.rule_pick` and
    :func:`~qrerase.text.size_study.selectivity_at_rise` read."""
    import pandas as pd

    cols = ["forget_nll", "retain_nll", "tune_retain_nll"]
    zero = pd.DataFrame([{"scale": 0.0, **{c: float(unedited[c]) for c in cols}}])
    return pd.concat([zero, points[["scale", *cols]]], ignore_index=True).sort_values("scale", kind="stable")


def check_construction(
    cfg: Mapping, baselines: Sequence[str], subspace: Sequence[str], tracks: Sequence[str] | None = None
) -> None:
    """The cross-key checks of the ``construction`` section (the schema checks each key): ValueError
    naming the key. ``baselines``: the text baselines the workflow knows; ``subspace``: its closed-form
    subspace methods; ``tracks``: the configured tracks the study can run on (a text sweep with a held-out
    slice), checked when given."""
    study = cfg.get("construction") or {}
    if not study:
        return
    r = cfg["lora"]["r"]
    if tracks is not None and not tracks:
        raise ValueError(
            f"config key 'construction': none of tracks {cfg['tracks']} has a trade-off sweep with a held-out slice"
        )
    big = [k for k in study["ranks"] if k > r]
    if big:
        raise ValueError(f"config key 'construction.ranks': {big} exceed lora.r = {r} (a task matrix's rank)")
    extra = sorted(set(study["protocol_ranks"]) - set(study["ranks"]))
    if extra:
        raise ValueError(f"config key 'construction.protocol_ranks': {extra} are not in construction.ranks")
    scales = [float(s) for s in study["scales"]]
    if scales != sorted(scales):
        raise ValueError(f"config key 'construction.scales': expected ascending values, got {study['scales']}")
    odd = sorted(set(study["methods"]) - set(subspace))
    if odd:
        raise ValueError(f"config key 'construction.methods': {odd} are not subspace methods ({list(subspace)})")
    unknown = sorted(set(study["baselines"]) - set(baselines))
    if unknown:
        raise ValueError(f"config key 'construction.baselines': {unknown} are not text baselines ({list(baselines)})")
    if study["protocol_ranks"] and (cfg.get("tradeoff") or {}).get("max_retain_nll_rise") is None:
        raise ValueError(
            "config key 'tradeoff.max_retain_nll_rise': construction.protocol_ranks needs the lambda rule's bound"
        )
