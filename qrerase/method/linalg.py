"""Exact rank-k CPQR / SVD of (LoRA) task matrices and QR-Erase subspace discrimination.

Paper equations (numbering of ``paper/qr-erase.tex``):

- eqs. 1–2  (``eq:qr_forget``, ``eq:qr_retain``): column-pivoted QR  T Π = Q R  (LAPACK xGEQP3);
- eq. 3     (``eq:retain_projection``): P_r = Q_r,k Q_r,kᵀ;
- eq. 4     (``eq:discrimination``):   Q̃_f = (I − P_r) Q_f,k;
- eq. 5     (``eq:reconstruction``):   T̃_f = Q̃_f R_f,k Π_fᵀ;
- eq. 6     (``eq:forget_update``):    W' = W − T̃_f  (applied in :mod:`qrerase.method.erase`);
- eq. 7     (``eq:rrqr``): partition of the CPQR at rank k, R_11 is its leading k×k block;
- eq. 10    (``eq:principal_angle_bound``): sin Θ ≤ σ_{k+1} ‖R_11⁻¹‖₂;
- eq. 11    (``eq:projector_distance``): sin Θ = ‖P_F − P_F̂‖₂.

A LoRA task matrix T = s·B·A (B: d_out×r, A: r×d_in, r ≪ d) is never densified. With the thin QR
B = Q_B R_B, T = Q_B (R_B A) and the small r×d_in matrix M = R_B A carries everything:

- CPQR:  M Π = Q_s R_s  ⇒  T Π = (Q_B Q_s) R_s.  Column norms of T and M are equal (Q_B has
  orthonormal columns) and every Householder step commutes with Q_B, so the pivots equal those of
  xGEQP3 on the dense T (exact arithmetic; in floating point up to near-ties).
- SVD:   M = U_s S V_sᵀ  ⇒  T = (Q_B U_s) S V_sᵀ, and the singular values of T are those of M.

Sign convention (so that the factored and dense paths agree column by column): CPQR factors are
normalised to a non-negative diagonal of R_11; SVD factors so that the largest-magnitude entry of each
row of Vₖᵀ is positive. Everything is float64.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Iterable, Literal, Mapping, NamedTuple

import numpy as np
import scipy.linalg as sla

__all__ = [
    "METHODS",
    "LowRank",
    "Decomposition",
    "Update",
    "as_lowrank",
    "decompose",
    "decompose_dense",
    "forget_update",
    "forget_updates",
    "discriminate",
    "save_decompositions",
    "load_decompositions",
    "save_updates",
    "load_updates",
    "max_sin_theta",
    "rrqr_bound",
    "factor_report",
]

Method = Literal["cpqr", "svd"]
METHODS: tuple[str, ...] = ("cpqr", "svd")


# --------------------------------------------------------------------------------------------------
# Factored task matrices
# --------------------------------------------------------------------------------------------------


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(int(s)) for s in shape)


def _label(name: str | None) -> str:
    return f"module {name!r}" if name else "task matrix"


@dataclasses.dataclass(frozen=True, eq=False)
class LowRank:
    """A task matrix in factored form, T = B @ A (the LoRA scale s is already folded into B).

    Attributes
    ----------
    B : ndarray, shape (d_out, r), float64
    A : ndarray, shape (r, d_in), float64

    Shapes are validated on construction (2-D, matching inner dimension); finiteness is validated by
    the functions that consume factors, which know the module name for the error message.
    """

    B: np.ndarray
    A: np.ndarray

    def __post_init__(self) -> None:
        B = np.asarray(self.B, dtype=np.float64)
        A = np.asarray(self.A, dtype=np.float64)
        if B.ndim != 2 or A.ndim != 2 or B.shape[1] != A.shape[0]:
            raise ValueError(
                f"LowRank: factors must be B (d_out×r) and A (r×d_in), got B {_fmt_shape(B.shape)} and A {_fmt_shape(A.shape)}"
            )
        object.__setattr__(self, "B", B)
        object.__setattr__(self, "A", A)

    @property
    def shape(self) -> tuple[int, int]:
        """(d_out, d_in) of the task matrix."""
        return (int(self.B.shape[0]), int(self.A.shape[1]))

    @property
    def rank(self) -> int:
        """Inner (LoRA) dimension r; an upper bound on rank(T)."""
        return int(self.B.shape[1])

    def dense(self) -> np.ndarray:
        """The dense (d_out, d_in) float64 task matrix B @ A."""
        return self.B @ self.A

    def fro_norm(self) -> float:
        """‖B A‖_F without forming B A.

        Equal to sqrt(tr((BᵀB)(AAᵀ))); computed as ‖R_B A‖_F with B = Q_B R_B (thin QR), which avoids
        the cancellation of the Gram-matrix formula when ‖BA‖ ≪ ‖B‖‖A‖.
        """
        return _factored_fro_norm(self.B, self.A)


def _factored_fro_norm(B: np.ndarray, A: np.ndarray) -> float:
    if B.size == 0 or A.size == 0:
        return 0.0
    Rb = sla.qr(B, mode="r", check_finite=False)[0][: min(B.shape)]
    M = Rb @ A
    return 0.0 if _numerically_zero(B, A, M) else float(np.linalg.norm(M))


def _numerically_zero(B: np.ndarray, A: np.ndarray, M: np.ndarray) -> bool:
    """Whether T = B A (= Q_B M) is zero to working precision: ‖M‖_F ≤ 4·r·eps·‖B‖_F‖A‖_F.

    Exact cancellation inside B A (e.g. two opposite rank-1 terms) leaves rounding-level residue in
    M = R_B A; such a T is treated as the all-zero task matrix.
    """
    if not M.any():
        return True
    r = max(1, B.shape[1])
    return float(np.linalg.norm(M)) <= 4 * r * np.finfo(np.float64).eps * float(np.linalg.norm(B)) * float(np.linalg.norm(A))


def _small_matrix(B: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thin QR B = Q_B R_B and the small matrix M = R_B A, so that B A = Q_B M exactly (in exact arithmetic)."""
    Qb, Rb = sla.qr(B, mode="economic", check_finite=False)
    return Qb, Rb @ A


def _check_finite(x: np.ndarray, what: str, name: str | None, shape_desc: str) -> None:
    if not np.isfinite(x).all():
        raise ValueError(f"{_label(name)}: {what} contains NaN or Inf ({shape_desc})")


def as_lowrank(x: Any, name: str | None = None) -> LowRank:
    """Coerce ``LowRank`` or a ``(B, A)`` pair to :class:`LowRank`, validating shapes and finiteness."""
    if isinstance(x, LowRank):
        lr = x
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        try:
            lr = LowRank(x[0], x[1])
        except ValueError as exc:
            raise ValueError(f"{_label(name)}: {exc}") from None
    else:
        raise TypeError(f"{_label(name)}: expected LowRank or a (B, A) pair, got {type(x).__name__}")
    desc = f"B {_fmt_shape(lr.B.shape)}, A {_fmt_shape(lr.A.shape)}"
    _check_finite(lr.B, "factor B", name, desc)
    _check_finite(lr.A, "factor A", name, desc)
    return lr


def _task_shape(x: Any, name: str | None) -> tuple[int, int]:
    if isinstance(x, (LowRank, Decomposition)):
        return x.shape
    if isinstance(x, (tuple, list)) and len(x) == 2:
        B, A = (np.asarray(x[0]), np.asarray(x[1]))
        if B.ndim != 2 or A.ndim != 2 or B.shape[1] != A.shape[0]:
            raise ValueError(
                f"{_label(name)}: factors must be B (d_out×r) and A (r×d_in), got B {_fmt_shape(B.shape)} and A {_fmt_shape(A.shape)}"
            )
        return (int(B.shape[0]), int(A.shape[1]))
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{_label(name)}: a dense task matrix must be 2-D, got shape {_fmt_shape(arr.shape)}")
    return (int(arr.shape[0]), int(arr.shape[1]))


# --------------------------------------------------------------------------------------------------
# Decomposition
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Decomposition:
    """Rank-k CPQR or SVD of a task matrix T (d_out×d_in), with T_k = Q @ R.

    Attributes
    ----------
    method : {"cpqr", "svd"}
    rank : int
        k.
    Q : ndarray, shape (d_out, k), float64
        Orthonormal basis: Q_k of eq. 1 (CPQR) or U_k (SVD).
    R : ndarray, shape (k, d_in), float64
        In the ORIGINAL column order: R_k Πᵀ (CPQR, eq. 5) or S_k V_kᵀ (SVD).
    piv : ndarray of int, shape (d_in,), or None
        CPQR column pivots (``T[:, piv] = Q_full R_full``); None for SVD. From the factored path all
        d_in entries are returned but only the first min(r, d_out, d_in) are determined by T.
    diag : ndarray, float64
        |diag R| of the full CPQR, or all singular values (SVD) — every available value, not only k.
    singular_values : ndarray or None
        All singular values of T when cheaply available (factored path, and dense SVD).
    fro_norm : float
        ‖T‖_F.
    residual_norm : float
        ‖T − T_k‖_F: ‖R_22‖_F for CPQR (eq. 7), sqrt(Σ_{i>k} σ_i²) for SVD.
    factored : bool
        Whether T was given as LoRA factors.
    """

    method: str
    rank: int
    Q: np.ndarray
    R: np.ndarray
    piv: np.ndarray | None
    diag: np.ndarray
    singular_values: np.ndarray | None
    fro_norm: float
    residual_norm: float
    factored: bool

    @property
    def shape(self) -> tuple[int, int]:
        """(d_out, d_in) of T."""
        return (int(self.Q.shape[0]), int(self.R.shape[1]))

    @property
    def relative_error(self) -> float:
        """‖T − T_k‖_F / ‖T‖_F."""
        return self.residual_norm / self.fro_norm

    def approx(self) -> np.ndarray:
        """Dense rank-k approximation T_k = Q @ R, shape (d_out, d_in)."""
        return self.Q @ self.R

    def lowrank(self) -> LowRank:
        """T_k as :class:`LowRank` (B = Q, A = R)."""
        return LowRank(self.Q, self.R)


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def _check_rank(k: Any, available: int, name: str | None, shape_desc: str, what: str = "rank") -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"{_label(name)}: {what} k must be an integer, got {k!r} ({shape_desc})")
    k = int(k)
    if k <= 0:
        raise ValueError(f"{_label(name)}: {what} k={k} must be positive ({shape_desc})")
    if k > available:
        raise ValueError(f"{_label(name)}: {what} k={k} exceeds the available rank {available} ({shape_desc})")
    return k


def _normalise_cpqr_signs(Q: np.ndarray, Rk: np.ndarray, piv: np.ndarray) -> None:
    """In place: make diag(R_11) ≥ 0 (the diagonal entries of R_k in pivoted order)."""
    k = Q.shape[1]
    d = Rk[np.arange(k), np.arange(k)]
    sign = np.where(d < 0, -1.0, 1.0)
    Q *= sign
    Rk *= sign[:, None]


def _normalise_svd_signs(Q: np.ndarray, R: np.ndarray) -> None:
    """In place: make the largest-|·| entry of each row of R = S_k V_kᵀ positive."""
    if R.shape[0] == 0:
        return
    idx = np.argmax(np.abs(R), axis=1)
    sign = np.where(R[np.arange(R.shape[0]), idx] < 0, -1.0, 1.0)
    Q *= sign
    R *= sign[:, None]


def _svd(M: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    try:
        return sla.svd(M, full_matrices=False, lapack_driver="gesdd", check_finite=False)
    except np.linalg.LinAlgError:  # pragma: no cover - gesdd convergence failure is rare
        return sla.svd(M, full_matrices=False, lapack_driver="gesvd", check_finite=False)


def _cpqr_from(
    Qleft: np.ndarray | None, M: np.ndarray, k: int, factored: bool, singular_values: np.ndarray | None
) -> Decomposition:
    Qs, Rs, piv = sla.qr(M, pivoting=True, mode="economic", check_finite=False)
    Rk = Rs[:k].copy()
    Q = (Qleft @ Qs[:, :k]) if Qleft is not None else Qs[:, :k].copy()
    _normalise_cpqr_signs(Q, Rk, piv)
    R = np.empty_like(Rk)
    R[:, piv] = Rk  # (R_k Πᵀ)[:, piv[j]] = R_k[:, j]
    return Decomposition(
        method="cpqr",
        rank=k,
        Q=Q,
        R=R,
        piv=np.asarray(piv, dtype=np.int64),
        diag=np.abs(np.diag(Rs)).astype(np.float64),
        singular_values=singular_values,
        fro_norm=float(np.linalg.norm(Rs)),
        residual_norm=float(np.linalg.norm(Rs[k:])),
        factored=factored,
    )


def _svd_from(Qleft: np.ndarray | None, M: np.ndarray, k: int, factored: bool) -> Decomposition:
    Us, s, Vt = _svd(M)
    Q = (Qleft @ Us[:, :k]) if Qleft is not None else Us[:, :k].copy()
    R = s[:k, None] * Vt[:k]
    _normalise_svd_signs(Q, R)
    tail = s[k:]
    return Decomposition(
        method="svd",
        rank=k,
        Q=Q,
        R=R,
        piv=None,
        diag=s.copy(),
        singular_values=s.copy(),
        fro_norm=float(np.linalg.norm(s)),
        residual_norm=float(np.linalg.norm(tail)),
        factored=factored,
    )


def decompose(
    B: Any,
    A: Any | None,
    rank: int,
    method: Method = "cpqr",
    *,
    name: str | None = None,
    singular_values: bool = True,
) -> Decomposition:
    """Exact rank-k CPQR (eqs. 1–2, 7) or SVD of a task matrix, from its LoRA factors.

    Parameters
    ----------
    B : array_like, shape (d_out, r); or LowRank / dense (d_out, d_in) array when ``A`` is None
        Left factor, already carrying the LoRA scale s.
    A : array_like, shape (r, d_in), or None
        Right factor. ``None`` means ``B`` is a :class:`LowRank` or the dense task matrix
        (the latter is the same as :func:`decompose_dense`).
    rank : int
        k, with 1 ≤ k ≤ min(r, d_out, d_in) (min(d_out, d_in) for a dense T).
    method : {"cpqr", "svd"}
        "cpqr": T Π = Q R via xGEQP3 (``scipy.linalg.qr(pivoting=True)``), truncated to the leading k
        columns of Q / rows of R. "svd": T = U S Vᵀ via gesdd, truncated to U_k, S_k V_kᵀ.
    name : str, optional
        Module name used in error messages.
    singular_values : bool
        Factored CPQR only: also compute all singular values of T (those of the small matrix; needed by
        :func:`rrqr_bound`). ``False`` skips this (``Decomposition.singular_values`` is then None).

    Returns
    -------
    Decomposition
        Q (d_out×k) and R (k×d_in, original column order) in float64 with T_k = Q @ R.

    Notes
    -----
    Factored algorithm: thin QR B = Q_B R_B, then CPQR / SVD of the small matrix M = R_B A
    (min(r, d_out)×d_in) and Q = Q_B Q_small. Cost O((d_out + d_in) r²) instead of O(d_out d_in min(d_out, d_in)).
    The full singular values of T (those of M) are always returned on this path.

    Raises
    ------
    ValueError
        Bad shapes, NaN/Inf, k ≤ 0 or k > available rank, or T = 0 — for factors: ‖R_B A‖_F ≤
        4·r·eps·‖B‖_F‖A‖_F, i.e. zero to working precision (each message names the module and shapes).
    """
    _check_method(method)
    if A is None:
        if isinstance(B, (LowRank, tuple, list)):
            lr = as_lowrank(B, name)
        else:
            return decompose_dense(B, rank, method, name=name)
    else:
        lr = as_lowrank((B, A), name)
    (d_out, d_in), r = lr.shape, lr.rank
    desc = f"B {_fmt_shape(lr.B.shape)}, A {_fmt_shape(lr.A.shape)}, T {d_out}×{d_in}"
    k = _check_rank(rank, min(r, d_out, d_in), name, desc)
    Qb, M = _small_matrix(lr.B, lr.A)
    if _numerically_zero(lr.B, lr.A, M):
        raise ValueError(f"{_label(name)}: task matrix is all zero (to working precision; {desc})")
    if method == "cpqr":
        s = sla.svdvals(M, check_finite=False) if singular_values else None
        return _cpqr_from(Qb, M, k, True, s)
    return _svd_from(Qb, M, k, True)


def decompose_dense(T: Any, rank: int, method: Method = "cpqr", *, name: str | None = None) -> Decomposition:
    """Rank-k CPQR (xGEQP3) or SVD (gesdd) of a dense task matrix T (d_out×d_in), eqs. 1–2.

    Same conventions as :func:`decompose`; k ≤ min(d_out, d_in). ``singular_values`` is None for CPQR
    (not cheaply available) and all singular values for SVD.
    """
    _check_method(method)
    T = np.asarray(T, dtype=np.float64)
    if T.ndim != 2:
        raise ValueError(f"{_label(name)}: a dense task matrix must be 2-D, got shape {_fmt_shape(T.shape)}")
    desc = f"T {_fmt_shape(T.shape)}"
    _check_finite(T, "task matrix", name, desc)
    k = _check_rank(rank, min(T.shape), name, desc)
    if not T.any():
        raise ValueError(f"{_label(name)}: task matrix is all zero ({desc})")
    if method == "cpqr":
        return _cpqr_from(None, T, k, False, None)
    return _svd_from(None, T, k, False)


def _decompose_any(x: Any, rank: int, method: str, name: str | None) -> Decomposition:
    if isinstance(x, (LowRank, tuple, list)):
        return decompose(x, None, rank, method, name=name, singular_values=False)
    return decompose_dense(x, rank, method, name=name)


# --------------------------------------------------------------------------------------------------
# Subspace discrimination and reconstruction (eqs. 3–5)
# --------------------------------------------------------------------------------------------------


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
    method: Method = "cpqr",
    retain_rank: int | None = None,
    scale: float = 1.0,
    *,
    name: str | None = None,
) -> Update:
    """Discriminated forget update λ·T̃_f = U @ V (eqs. 3–5).

    Parameters
    ----------
    forget_factors, retain_factors : LowRank, (B, A) pair, or dense (d_out, d_in) array
        T_f and T_r of the same shape (d_out, d_in).
    rank : int
        k for the forget decomposition (Q_f,k, R_f,k).
    method : {"cpqr", "svd"}
        CPQR (QR-Erase) or SVD (UNLEARN).
    retain_rank : int, optional
        Rank of the retain basis Q_r,k in P_r = Q_r,k Q_r,kᵀ (eq. 3); default ``rank``.
    scale : float
        λ, folded into U.
    name : str, optional
        Module name for error messages.

    Returns
    -------
    Update
        (U, V) float64 with U (d_out×k) = λ (I − P_r) Q_f,k — computed as Q_f − Q_r (Q_rᵀ Q_f), never
        forming I − P_r (eq. 4) — and V (k×d_in) = R_f,k Π_fᵀ (CPQR) or S_k V_kᵀ (SVD), so that
        U @ V = λ·T̃_f (eq. 5). The edit is W' = W − U @ V (eq. 6).
    """
    _check_method(method)
    if not isinstance(scale, numbers.Real) or not math.isfinite(float(scale)):
        raise ValueError(f"{_label(name)}: scale must be a finite real number, got {scale!r}")
    fshape, rshape = _task_shape(forget_factors, name), _task_shape(retain_factors, name)
    if fshape != rshape:
        raise ValueError(
            f"{_label(name)}: forget task matrix is {_fmt_shape(fshape)} but retain task matrix is {_fmt_shape(rshape)}"
        )
    df = _decompose_any(forget_factors, rank, method, name)
    dr = _decompose_any(retain_factors, rank if retain_rank is None else retain_rank, method, name)
    return _discriminate(df, dr, float(scale))


def _discriminate(df: Decomposition, dr: Decomposition, scale: float, retain_rank: int | None = None) -> Update:
    """U = λ (Q_f − Q_r (Q_rᵀ Q_f)) (eq. 4, Q_r truncated to ``retain_rank`` columns) and V = R_f (eq. 5)."""
    Qr = dr.Q if retain_rank is None else dr.Q[:, :retain_rank]
    Qt = df.Q - Qr @ (Qr.T @ df.Q)
    return Update(scale * Qt, df.R)


def _check_module_pairs(forget: Mapping[str, Any], retain: Mapping[str, Any]) -> None:
    only_f = [m for m in forget if m not in retain]
    only_r = [m for m in retain if m not in forget]
    if only_f or only_r:
        raise ValueError(
            f"forget and retain factors cover different modules: only in forget {only_f[:5]}{'…' if len(only_f) > 5 else ''}, "
            f"only in retain {only_r[:5]}{'…' if len(only_r) > 5 else ''}"
        )
    for m in forget:
        fs, rs = _task_shape(forget[m], m), _task_shape(retain[m], m)
        if fs != rs:
            raise ValueError(f"module {m!r}: forget task matrix is {_fmt_shape(fs)} but retain task matrix is {_fmt_shape(rs)}")


def forget_updates(
    forget: Mapping[str, Any],
    retain: Mapping[str, Any],
    rank: int,
    method: Method = "cpqr",
    retain_rank: int | None = None,
    scale: float = 1.0,
    modules: Iterable[str] | None = None,
) -> dict[str, Update]:
    """:func:`forget_update` for every module of an adapter pair (eqs. 3–5, and eq. 16 via ``modules``).

    ``forget`` and ``retain`` map module names to factors and must cover the same modules with the same
    shapes (validated for all modules before any decomposition). ``modules`` restricts the output to a
    subset (e.g. the layers selected by :func:`qrerase.method.energy.select_layers`); order follows ``forget``.
    """
    _check_method(method)
    _check_module_pairs(forget, retain)
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
                desc = f"B {_fmt_shape(lr.B.shape)}, A {_fmt_shape(lr.A.shape)}"
                _check_rank(k, min(lr.rank, *lr.shape), m, desc)
    return {m: forget_update(forget[m], retain[m], rank, method, retain_rank, scale, name=m) for m in names}


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
        Same modules, shapes and method (e.g. from :func:`load_decompositions`).
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
    _check_module_pairs(forget, retain)
    for m in forget:
        df, dr = forget[m], retain[m]
        if df.method != dr.method:
            raise ValueError(f"module {m!r}: forget decomposition is {df.method} but retain decomposition is {dr.method}")
        if retain_rank is not None:
            _check_rank(retain_rank, dr.rank, m, f"retain decomposition Q_r {_fmt_shape(dr.Q.shape)}", "retain rank")
    return {m: _discriminate(forget[m], retain[m], float(scale), retain_rank) for m in forget}


# --------------------------------------------------------------------------------------------------
# Artifacts: decompositions and updates as safetensors
# --------------------------------------------------------------------------------------------------


def save_decompositions(path, decs: Mapping[str, Decomposition]) -> None:
    """Write decompositions as one safetensors file (atomically).

    Keys ``<module>.Q`` (d_out×k), ``<module>.R`` (k×d_in, original column order), ``<module>.diag``,
    ``<module>.piv`` (int64, CPQR only), ``<module>.singular_values`` (when available), float64; the
    safetensors metadata ``"qrerase"`` holds JSON {module: {method, rank, fro_norm, residual_norm, factored}}.
    """
    import json

    from ..io import save_arrays

    if not decs:
        raise ValueError(f"{path}: no decompositions to save")
    arrays: dict[str, np.ndarray] = {}
    meta = {}
    for m, d in decs.items():
        arrays[f"{m}.Q"] = d.Q
        arrays[f"{m}.R"] = d.R
        arrays[f"{m}.diag"] = d.diag
        if d.piv is not None:
            arrays[f"{m}.piv"] = d.piv.astype(np.int64)
        if d.singular_values is not None:
            arrays[f"{m}.singular_values"] = d.singular_values
        meta[m] = {"method": d.method, "rank": d.rank, "fro_norm": d.fro_norm, "residual_norm": d.residual_norm, "factored": d.factored}
    save_arrays(path, arrays, metadata={"format": "qrerase-decompositions", "qrerase": json.dumps(meta, sort_keys=True)})


def load_decompositions(path) -> dict[str, Decomposition]:
    """Read a :func:`save_decompositions` file; modules ordered by block index, then name."""
    import json

    from safetensors import safe_open

    from .energy import module_sort_key
    from ..io import load_arrays

    arrays = load_arrays(path)
    with safe_open(str(path), framework="numpy") as fh:
        meta_raw = (fh.metadata() or {}).get("qrerase")
    if meta_raw is None:
        raise ValueError(f"{path}: not a qrerase decompositions file (no 'qrerase' metadata)")
    meta = json.loads(meta_raw)
    out = {}
    for m in sorted(meta, key=module_sort_key):
        info = meta[m]
        try:
            out[m] = Decomposition(
                method=info["method"],
                rank=int(info["rank"]),
                Q=arrays[f"{m}.Q"],
                R=arrays[f"{m}.R"],
                piv=arrays.get(f"{m}.piv"),
                diag=arrays[f"{m}.diag"],
                singular_values=arrays.get(f"{m}.singular_values"),
                fro_norm=float(info["fro_norm"]),
                residual_norm=float(info["residual_norm"]),
                factored=bool(info["factored"]),
            )
        except KeyError as exc:
            raise ValueError(f"{path}: module {m!r} lacks {exc}") from None
    return out


def save_updates(path, updates: Mapping[str, Any]) -> None:
    """Write updates (U, V) as safetensors keys ``<module>.U`` (d_out×k) / ``<module>.V`` (k×d_in), float64, atomically.

    All updates are validated (shapes, finiteness) before anything is written.
    """
    from .erase import validate_updates
    from ..io import save_arrays

    checked = validate_updates(updates)
    arrays: dict[str, np.ndarray] = {}
    for m, (U, V) in checked.items():
        arrays[f"{m}.U"] = U
        arrays[f"{m}.V"] = V
    save_arrays(path, arrays, metadata={"format": "qrerase-updates"})


def load_updates(path) -> dict[str, Update]:
    """Read a :func:`save_updates` file into {module: Update(U, V)}, ordered by block index, then name."""
    from .energy import module_sort_key
    from ..io import load_arrays

    arrays = load_arrays(path)
    groups: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in arrays.items():
        m, _, which = key.rpartition(".")
        if which not in ("U", "V") or not m:
            raise ValueError(f"{path}: unexpected key {key!r} (expected '<module>.U' / '<module>.V')")
        groups.setdefault(m, {})[which] = arr
    out = {}
    for m in sorted(groups, key=module_sort_key):
        g = groups[m]
        if set(g) != {"U", "V"}:
            raise ValueError(f"{path}: module {m!r} lacks {'U' if 'V' in g else 'V'}")
        out[m] = Update(np.asarray(g["U"], dtype=np.float64), np.asarray(g["V"], dtype=np.float64))
    return out


# --------------------------------------------------------------------------------------------------
# Diagnostics (eqs. 7, 10, 11)
# --------------------------------------------------------------------------------------------------


def max_sin_theta(Q1: np.ndarray, Q2: np.ndarray) -> float:
    """Sine of the largest principal angle between range(Q1) and range(Q2), = ‖P1 − P2‖₂ (eq. 11).

    Q1 (n×k1) and Q2 (n×k2) must have orthonormal columns. Computed as max(‖Q1 − Q2(Q2ᵀQ1)‖₂,
    ‖Q2 − Q1(Q1ᵀQ2)‖₂), which is accurate for tiny angles (unlike sqrt(1 − cos²)); 1 when k1 ≠ k2.
    """
    Q1 = np.asarray(Q1, dtype=np.float64)
    Q2 = np.asarray(Q2, dtype=np.float64)
    if Q1.ndim != 2 or Q2.ndim != 2 or Q1.shape[0] != Q2.shape[0]:
        raise ValueError(f"max_sin_theta: bases must be n×k with the same n, got {_fmt_shape(Q1.shape)} and {_fmt_shape(Q2.shape)}")
    a = np.linalg.norm(Q1 - Q2 @ (Q2.T @ Q1), 2) if Q1.shape[1] else 0.0
    b = np.linalg.norm(Q2 - Q1 @ (Q1.T @ Q2), 2) if Q2.shape[1] else 0.0
    return float(min(1.0, max(a, b)))


def rrqr_bound(dec: Decomposition) -> float:
    """The paper's principal-angle bound σ_{k+1} ‖R_11⁻¹‖₂ (eq. 10) for a CPQR :class:`Decomposition`.

    R_11 is the leading k×k block of R in pivoted order (eq. 7), i.e. ``dec.R[:, dec.piv[:k]]``.
    Conventions: σ_{k+1} := 0 when k ≥ the number of (available) singular values, giving 0; a singular
    R_11 gives inf (unless σ_{k+1} = 0). Requires ``dec.singular_values`` (factored path).
    """
    if dec.method != "cpqr" or dec.piv is None:
        raise ValueError("rrqr_bound: needs a CPQR decomposition")
    if dec.singular_values is None:
        raise ValueError("rrqr_bound: singular values are not available (use the factored path)")
    k, s = dec.rank, dec.singular_values
    sigma_k1 = float(s[k]) if k < len(s) else 0.0
    if sigma_k1 == 0.0:
        return 0.0
    R11 = dec.R[:, dec.piv[:k]]
    smin = float(sla.svdvals(R11, check_finite=False)[-1])
    return math.inf if smin == 0.0 else sigma_k1 / smin


def factor_report(
    forget: Mapping[str, Any],
    retain: Mapping[str, Any],
    rank: int,
    retain_rank: int | None = None,
    energy_granularity: str = "block",
):
    """Per-module diagnostics of a forget/retain adapter pair as a pandas DataFrame.

    One row per (set ∈ {forget, retain}, module), forget first, modules in block order. Columns:
    ``set, module, block, d_out, d_in, lora_rank, rank, fro_norm, energy, selected, sigma_k, sigma_k1,
    recon_err_cpqr, recon_err_svd, max_sin_theta_qr_vs_svd, bound_sigma_k1_r11inv``:

    - ``energy`` / ``selected``: E_ℓ of the module's layer within its set (eq. 14) and the eq. 15 rule;
    - ``recon_err_*``: ‖T − T_k‖_F / ‖T‖_F, computed from the small factored matrices;
    - ``max_sin_theta_qr_vs_svd``: largest principal-angle sine between the CPQR Q_k and SVD U_k (eq. 11);
    - ``bound_sigma_k1_r11inv``: σ_{k+1} ‖R_11⁻¹‖₂ (eq. 10; 0 when k ≥ rank, inf for singular R_11).

    ``rank`` applies to the forget set and ``retain_rank`` (default ``rank``) to the retain set.
    """
    import pandas as pd

    from .energy import block_of, layer_energy, layer_of, module_sort_key, select_layers

    _check_module_pairs(forget, retain)
    rows = []
    for set_name, factors, k in (("forget", forget, rank), ("retain", retain, rank if retain_rank is None else retain_rank)):
        lrs = {m: as_lowrank(f, m) for m, f in factors.items()}
        energy = layer_energy(lrs, granularity=energy_granularity)
        selected = set(select_layers(energy))
        for m in sorted(lrs, key=module_sort_key):
            lr = lrs[m]
            dq = decompose(lr, None, k, "cpqr", name=m)
            ds = decompose(lr, None, k, "svd", name=m)
            s = ds.singular_values
            layer = layer_of(m, energy_granularity)
            rows.append(
                {
                    "set": set_name,
                    "module": m,
                    "block": block_of(m),
                    "d_out": lr.shape[0],
                    "d_in": lr.shape[1],
                    "lora_rank": lr.rank,
                    "rank": k,
                    "fro_norm": dq.fro_norm,
                    "energy": energy[layer],
                    "selected": layer in selected,
                    "sigma_k": float(s[k - 1]),
                    "sigma_k1": float(s[k]) if k < len(s) else 0.0,
                    "recon_err_cpqr": dq.relative_error,
                    "recon_err_svd": ds.relative_error,
                    "max_sin_theta_qr_vs_svd": max_sin_theta(dq.Q, ds.Q),
                    "bound_sigma_k1_r11inv": rrqr_bound(dq),
                }
            )
    df = pd.DataFrame(rows)
    df["block"] = df["block"].astype("Int64")
    return df
