"""The task-level track's λ / k sweep and its λ rule.

A *point* is the fine-tuned model erased by one subspace method at rank k and scale λ,
W' = W − λ U V on the method's modules (every adapted module, eq. 6, or the LL selection, eq. 16),
with ``U V = (I − P_r) Q_f,k R_f,k Π_fᵀ`` built at λ = 1 from the λ-free factors
(:func:`qrerase.method.discriminate.discriminate`) and scaled by λ, exactly as the erase rules build
it at the configured λ. Each point is scored on

* the **held-out slice** ``tune_retain`` (the ``new`` split of the similar and unrelated skills: in
  no training run of the subspace methods and in no table): ``tune_retain_nll``, the token-mean
  answer NLL Σ NLL / Σ tokens (nats, EOS included) — the only quantity the λ rule reads;
* each role's evaluation set (the table's protocol, :func:`qrerase.tracks.task_level.evaluation.evaluate_roles`):
  ``<role>_accuracy``, ``<role>_nll``, ``<role>_n`` — reported, never read by the rule.

The λ rule is :func:`qrerase.text.tradeoff.select_scale` (the TOFU track's): per (method, k), the
largest swept λ whose ``tune_retain_nll`` exceeds the λ = 0 value by at most ``max_rise`` nats.
:func:`picked_rows` turns the picked points into the table's long rows (one per model and role).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pandas as pd

from ...workflow.naming import format_model
from .data import ROLES

__all__ = ["erase_points", "held_out_nll", "point_row", "picked_rows"]


def erase_points(
    model,
    factors: Mapping[int, tuple[Mapping, Mapping]],
    scales: Sequence[float],
    modules: Sequence[str] | None = None,
    retain_rank: int | None = None,
) -> Iterator[tuple[int, float]]:
    """Yield ``(k, λ)`` with ``model`` erased at that point; its weights are restored after each point
    (and on exit, also after an error).

    ``factors[k] = (forget, retain)``: module → :class:`qrerase.method.decompose.Decomposition` (the
    factors rule's outputs at rank k; retain factors at rank ≥ k). ``modules``: the modules edited
    (the LL selection), None = every module of the forget factors. Points in order of k, then λ.
    """
    import torch

    from ...method.discriminate import discriminate
    from ...method.erase import apply_updates

    if not factors or not scales:
        raise ValueError("erase_points: no ranks or no scales to sweep")
    bad = [s for s in scales if not (isinstance(s, (int, float)) and math.isfinite(s) and s >= 0)]
    if bad:
        raise ValueError(f"erase_points: scales must be finite numbers >= 0, got {bad}")
    first = next(iter(factors.values()))[0]
    names = list(first) if modules is None else list(modules)
    missing = [m for m in names if m not in first]
    if missing:
        raise ValueError(f"erase_points: modules {missing[:3]} have no factors")
    original = {n: model.get_submodule(n).weight.detach().clone() for n in names}

    def restore() -> None:
        with torch.no_grad():
            for n, w in original.items():
                model.get_submodule(n).weight.copy_(w)

    try:
        for k in sorted(factors):
            forget, retain = factors[k]
            unit = discriminate(
                {n: forget[n] for n in names}, {n: retain[n] for n in names}, retain_rank=retain_rank, scale=1.0
            )
            for lam in scales:
                apply_updates(model, {n: (float(lam) * unit[n].U, unit[n].V) for n in names})
                yield int(k), float(lam)
                restore()
    finally:
        restore()


def held_out_nll(model, tokenizer, template, records: Sequence[Mapping[str, Any]], cfg) -> float:
    """Token-mean answer NLL of ``records`` (Σ NLL / Σ tokens over the answers, EOS included; nats).

    For a ``cloze`` knowledge item the answer is its correct option's text, as in
    :func:`qrerase.tracks.task_level.evaluation.evaluate_skill`. ``cfg``: an ``EvalConfig``.
    """
    from ...text.evaluation import answer_losses
    from ...text.lm import qa_pair

    if not records:
        raise ValueError("held_out_nll: the held-out slice is empty")
    losses = answer_losses(model, tokenizer, template, [qa_pair(r) for r in records], cfg)
    tokens = sum(c for _, c in losses)
    if tokens == 0:
        raise ValueError("held_out_nll: no answer tokens")
    return float(sum(s for s, _ in losses) / tokens)


def point_row(method: str, rank: int, scale: float, tune_nll: float, roles: Sequence[Mapping[str, Any]]) -> dict:
    """One sweep point as a flat row: ``family, method, rank, scale, tune_retain_nll`` then per role
    ``<role>_accuracy, <role>_nll, <role>_n`` (``roles``: rows of :func:`evaluate_roles`)."""
    row: dict[str, Any] = {
        "family": "subspace",
        "method": method,
        "rank": int(rank),
        "scale": float(scale),
        "tune_retain_nll": float(tune_nll),
    }
    for r in roles:
        row.update({f"{r['role']}_accuracy": r["accuracy"], f"{r['role']}_nll": r["nll"], f"{r['role']}_n": r["n"]})
    return row


def picked_rows(points: pd.DataFrame, selection: pd.DataFrame, skills: Mapping[str, str]) -> list[dict]:
    """The table's long rows (``model, role, skill, n, accuracy, nll``; model ``<method>_k<rank>``) of
    each selected point: ``selection`` has ``method, rank, selected_scale`` (select_scale's output)."""
    rows = []
    for s in selection.itertuples(index=False):
        at = (points["method"] == s.method) & (points["rank"] == s.rank)
        hit = points[at & (points["scale"] == s.selected_scale)]
        if len(hit) != 1:
            raise ValueError(f"picked_rows: {len(hit)} points for {s.method} k={s.rank} λ={s.selected_scale}")
        p = hit.iloc[0]
        for role in ROLES:
            rows.append(
                {
                    "model": format_model(s.method, int(s.rank)),
                    "role": role,
                    "skill": skills[role],
                    "n": int(p[f"{role}_n"]),
                    "accuracy": float(p[f"{role}_accuracy"]),
                    "nll": float(p[f"{role}_nll"]),
                }
            )
    return rows
