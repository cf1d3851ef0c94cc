"""QR-Erase subspace discrimination and reconstruction: the forget update λ·T̃_f = U @ V.

Paper equations: the numbering of T. Lizzo and L. Heck, "QR-Erase: Efficient Subspace-Based Machine
Unlearning with Layer Localization", AAAI-27 (CITATION.cff):

- eq. 3: P_r = Q_r,k Q_r,kᵀ;
- eq. 4: Q̃_f = (I − P_r) Q_f,k;
- eq. 5: T̃_f = Q̃_f R_f,k Π_fᵀ;
- eq. 6: W' = W − T̃_f  (applied in :mod:`qrerase.method.erase`);
- eq. 16: only the modules of the selected layers (``modules``).

Q_f,k, R_f,k come from :func:`qrerase.method.decompose.decompose` (CPQR for QR-Erase, SVD for UNLEARN).
Everything is float64.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from .decompose import Decomp, Decomposition, check_rank, decompose_any, resolve_decomp, task_shape
from .lowrank import LowRank, as_lowrank, format_shape, task_label
from .module_names import module_sort_key

__all__ = ["Update", "forget_update", "forget_updates", "discriminate", "check_module_pairs"]


class Update(NamedTuple):
    """A rank-k weight edit U @ V = λ·T̃_f (eq. 5 scaled); apply as W' = W − U @ V (eq. 6).

    U : (d_out, k) float64 — λ·Q̃_f = λ·(I − P_r) Q_f,k
    V : (k, d_in) float64 — R_f,k Π_fᵀ (CPQR) or S_k V_kᵀ (SVD)
    """

    U: np.ndarray
    V: np.ndarray


def forget_update(
    forget_factors: Any,
    retain_factors: Any,
    rank: int,
    decomp: Decomp = "cpqr",
    retain_rank: int | None = None,
    scale: float = 1.0,
    *,
    name: str | None = None,
    method: Decomp | None = None,
) -> Update:
    """Discriminated forget update λ·T̃_f = U @ V (eqs. 3–5).

    Parameters
    ----------
    forget_factors, retain_factors : LowRank, (B, A) pair, or dense (d_out, d_in) array
        T_f and T_r of the same shape (d_out, d_in).
    rank : int
        k for the forget decomposition (Q_f,k, R_f,k).
    decomp : {"cpqr", "svd"}
        The decomposition: CPQR (QR-Erase) or SVD (UNLEARN).
    retain_rank : int, optional
        Rank of the retain basis Q_r,k in P_r = Q_r,k Q_r,kᵀ (eq. 3); default ``rank``.
    scale : float
        λ, folded into U.
    name : str, optional
        Module name for error messages.
    method : {"cpqr", "svd"}, optional
        Deprecated name of ``decomp`` (DeprecationWarning; removed in the next release).

    Returns
    -------
    Update
        (U, V) float64 with U (d_out×k) = λ (I − P_r) Q_f,k — computed as Q_f − Q_r (Q_rᵀ Q_f), never
        forming I − P_r (eq. 4) — and V (k×d_in) = R_f,k Π_fᵀ (CPQR) or S_k V_kᵀ (SVD), so that
        U @ V = λ·T̃_f (eq. 5). The edit is W' = W − U @ V (eq. 6).
    """
    decomp = resolve_decomp(decomp, method, "forget_update")
    if not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise ValueError(f"{task_label(name)}: scale must be a finite real number, got {scale!r}")
    fshape, rshape = task_shape(forget_factors, name), task_shape(retain_factors, name)
    if fshape != rshape:
        raise ValueError(
            f"{task_label(name)}: forget task matrix is {format_shape(fshape)} "
            f"but retain task matrix is {format_shape(rshape)}"
        )
    df = decompose_any(forget_factors, rank, decomp, name)
    dr = decompose_any(retain_factors, rank if retain_rank is None else retain_rank, decomp, name)
    return _discriminate(df, dr, float(scale))


def _discriminate(df: Decomposition, dr: Decomposition, scale: float, retain_rank: int | None = None) -> Update:
    """U = λ (Q_f − Q_r (Q_rᵀ Q_f)) (eq. 4, Q_r truncated to ``retain_rank`` columns) and V = R_f (eq. 5)."""
    Qr = dr.Q if retain_rank is None else dr.Q[:, :retain_rank]
    Qt = df.Q - Qr @ (Qr.T @ df.Q)
    return Update(scale * Qt, df.R)


def _modules_summary(modules: list[str]) -> str:
    """``k_proj, v_proj (4 modules: model.layers.0.self_attn.k_proj, …)``: target names, count, first ones."""
    targets = sorted({m.rsplit(".", 1)[-1] for m in modules})
    shown = ", ".join(modules[:3]) + (", …" if len(modules) > 3 else "")
    return f"{', '.join(targets)} ({len(modules)} module{'s' if len(modules) != 1 else ''}: {shown})"


def check_module_pairs(
    forget: Mapping[str, Any], retain: Mapping[str, Any], names: tuple[str, str] | None = None
) -> None:
    """ValueError unless ``forget`` and ``retain`` cover the same modules with the same task-matrix shapes.

    ``names``: what the two come from (e.g. the adapter directories), named in the one-line error.
    """
    what = f"forget adapter {names[0]} and retain adapter {names[1]}" if names else "forget and retain factors"
    only_f = sorted((m for m in forget if m not in retain), key=module_sort_key)
    only_r = sorted((m for m in retain if m not in forget), key=module_sort_key)
    if only_f or only_r:
        parts = [f"only forget has {_modules_summary(only_f)}"] if only_f else []
        parts += [f"only retain has {_modules_summary(only_r)}"] if only_r else []
        raise ValueError(f"{what} adapt different modules: {'; '.join(parts)}")
    for m in forget:
        fs, rs = task_shape(forget[m], m), task_shape(retain[m], m)
        if fs != rs:
            raise ValueError(
                f"{what + ': ' if names else ''}module {m!r}: forget task matrix is {format_shape(fs)} "
                f"but retain task matrix is {format_shape(rs)}"
            )


def forget_updates(
    forget: Mapping[str, Any],
    retain: Mapping[str, Any],
    rank: int,
    decomp: Decomp = "cpqr",
    retain_rank: int | None = None,
    scale: float = 1.0,
    modules: Iterable[str] | None = None,
    *,
    method: Decomp | None = None,
) -> dict[str, Update]:
    """:func:`forget_update` for every module of an adapter pair (eqs. 3–5, and eq. 16 via ``modules``).

    ``forget`` and ``retain`` map module names to factors and must cover the same modules with the same
    shapes (validated for all modules before any decomposition). ``modules`` restricts the output to a
    subset (e.g. the layers selected by :func:`qrerase.method.energy.select_layers`); order follows ``forget``.
    ``decomp``: ``"cpqr"`` or ``"svd"`` (``method``: its deprecated name, DeprecationWarning).
    """
    decomp = resolve_decomp(decomp, method, "forget_updates")
    check_module_pairs(forget, retain)
    if modules is None:
        names = list(forget)
    else:
        wanted = set(modules)
        unknown = sorted(wanted - set(forget))
        if unknown:
            raise ValueError(f"modules not present in the factors: {unknown[:5]}")
        names = [m for m in forget if m in wanted]
    kr = rank if retain_rank is None else retain_rank
    # validate everything (shapes, finiteness, ranks) before the first decomposition
    for m in names:
        for fac, k in ((forget[m], rank), (retain[m], kr)):
            if isinstance(fac, (LowRank, tuple, list)):
                lr = as_lowrank(fac, m)
                desc = f"B {format_shape(lr.B.shape)}, A {format_shape(lr.A.shape)}"
                check_rank(k, min(lr.rank, *lr.shape), m, desc)
    return {m: forget_update(forget[m], retain[m], rank, decomp, retain_rank, scale, name=m) for m in names}


def discriminate(
    forget: Mapping[str, Decomposition],
    retain: Mapping[str, Decomposition],
    retain_rank: int | None = None,
    scale: float = 1.0,
) -> dict[str, Update]:
    """Eqs. 3–5 from stored decompositions: U = λ (I − P_r) Q_f,k, V = R_f,k Π_fᵀ per module.

    Parameters
    ----------
    forget, retain : mapping module → Decomposition
        Same modules, shapes and decomposition (e.g. from :func:`qrerase.method.formats.load_decompositions`).
    retain_rank : int, optional
        Columns of Q_r used in P_r (eq. 3); default: all k_r of the retain decomposition. Truncating is
        exact: the leading columns of a rank-k CPQR / SVD are the rank-k' (k' < k) factorisation.
    scale : float
        λ, folded into U.

    Returns
    -------
    dict module → Update, in the order of ``forget``; equal to :func:`forget_update` on the factors.
    """
    if not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise ValueError(f"scale must be a finite real number, got {scale!r}")
    check_module_pairs(forget, retain)
    for m in forget:
        df, dr = forget[m], retain[m]
        if df.decomp != dr.decomp:
            raise ValueError(
                f"module {m!r}: forget decomposition is {df.decomp} but retain decomposition is {dr.decomp}"
            )
        if retain_rank is not None:
            check_rank(retain_rank, dr.rank, m, f"retain decomposition Q_r {format_shape(dr.Q.shape)}", "retain rank")
    return {m: _discriminate(forget[m], retain[m], float(scale), retain_rank) for m in forget}
