"""Exact rank-k CPQR / SVD of (LoRA) task matrices: the decompositions of QR-Erase and UNLEARN.

Paper equations: the numbering of T. Lizzo and L. Heck, "QR-Erase: Efficient Subspace-Based Machine
Unlearning with Layer Localization", AAAI-27 (CITATION.cff):

- eqs. 1–2: column-pivoted QR  T Π = Q R  (LAPACK xGEQP3);
- eq. 7: partition of the CPQR at rank k, R_11 is its leading k×k block.

The discrimination (eqs. 3–5) is :mod:`qrerase.method.discriminate`, the diagnostics (eqs. 10–11)
:mod:`qrerase.method.diagnostics`, the safetensors files :mod:`qrerase.method.formats`.

A LoRA task matrix T = s·B·A (B: d_out×r, A: r×d_in, r ≪ d) is never densified. With the thin QR
B = Q_B R_B, T = Q_B (R_B A) and the small r×d_in matrix M = R_B A carries everything:

- CPQR:  M Π = Q_s R_s  ⇒  T Π = (Q_B Q_s) R_s.  Column norms of T and M are equal (Q_B has
  orthonormal columns) and every Householder step commutes with Q_B, so the pivots equal those of
  xGEQP3 on the dense T (exact arithmetic; in floating point up to near-ties).
- SVD:   M = U_s S V_sᵀ  ⇒  T = (Q_B U_s) S V_sᵀ, and the singular values of T are those of M.

Sign convention (so that the factored and dense paths agree column by column): CPQR factors are
normalised to a non-negative diagonal of R_11; SVD factors so that the largest-magnitude entry of each
row of Vₖᵀ is positive. Everything is float64.

The decomposition is named ``decomp`` (``"cpqr"`` or ``"svd"``) everywhere, as in
:attr:`qrerase.registry.Method.decomp`; "method" is an unlearning method (``qr_erase_ll``, ``ga``, …).
``method=`` is still accepted by the functions here and in :mod:`qrerase.method.discriminate`, and
``Decomposition.method`` still reads, with a DeprecationWarning, for one release.
"""

from __future__ import annotations

import dataclasses
import numbers
import warnings
from typing import Any, Literal, cast

import numpy as np
import scipy.linalg as sla

from .lowrank import LowRank, as_lowrank, check_finite, format_shape, numerically_zero, small_matrix, task_label

__all__ = [
    "DECOMPOSITIONS",
    "Decomposition",
    "decompose",
    "decompose_dense",
    "decompose_any",
    "task_shape",
    "check_decomp",
    "resolve_decomp",
    "check_rank",
]

Decomp = Literal["cpqr", "svd"]
#: The two decompositions of a task matrix: column-pivoted QR (QR-Erase) and SVD (UNLEARN).
DECOMPOSITIONS: tuple[str, ...] = ("cpqr", "svd")


# --------------------------------------------------------------------------------------------------
# Decomposition
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Decomposition:
    """Rank-k CPQR or SVD of a task matrix T (d_out×d_in), with T_k = Q @ R.

    Attributes
    ----------
    decomp : {"cpqr", "svd"}
        The decomposition (``method`` is its deprecated name).
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

    decomp: str
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
    def method(self) -> str:
        """Deprecated name of :attr:`decomp` (DeprecationWarning; removed in the next release)."""
        warnings.warn("Decomposition.method is deprecated; use Decomposition.decomp", DeprecationWarning, stacklevel=2)
        return self.decomp

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


def task_shape(x: Any, name: str | None) -> tuple[int, int]:
    """(d_out, d_in) of a task matrix given as LowRank, Decomposition, (B, A) pair or dense array."""
    if isinstance(x, (LowRank, Decomposition)):
        return x.shape
    if isinstance(x, (tuple, list)) and len(x) == 2:
        B, A = (np.asarray(x[0]), np.asarray(x[1]))
        if B.ndim != 2 or A.ndim != 2 or B.shape[1] != A.shape[0]:
            raise ValueError(
                f"{task_label(name)}: factors must be B (d_out×r) and A (r×d_in), "
                f"got B {format_shape(B.shape)} and A {format_shape(A.shape)}"
            )
        return (int(B.shape[0]), int(A.shape[1]))
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{task_label(name)}: a dense task matrix must be 2-D, got shape {format_shape(arr.shape)}")
    return (int(arr.shape[0]), int(arr.shape[1]))


def check_decomp(decomp: str) -> Decomp:
    """``decomp`` when it is one of :data:`DECOMPOSITIONS`, else ValueError."""
    if decomp not in DECOMPOSITIONS:
        raise ValueError(f"decomp must be one of {DECOMPOSITIONS}, got {decomp!r}")
    return cast(Decomp, decomp)


def resolve_decomp(decomp: str, method: str | None, func: str) -> Decomp:
    """The checked decomposition of a call of ``func`` that may still pass the deprecated ``method=``.

    ``method`` not None: DeprecationWarning naming ``decomp=`` (pointing at the caller of ``func``), and
    it is the decomposition; TypeError when ``decomp`` was also given as something else.
    """
    if method is not None:
        warnings.warn(
            f"{func}(method=...) is deprecated: the decomposition is decomp=... ('cpqr' or 'svd')",
            DeprecationWarning,
            stacklevel=3,
        )
        if decomp not in ("cpqr", method):  # "cpqr" is the default: decomp was not given
            raise TypeError(f"{func}: got decomp={decomp!r} and the deprecated method={method!r}; pass decomp only")
        decomp = method
    return check_decomp(decomp)


def check_rank(k: Any, available: int, name: str | None, shape_desc: str, what: str = "rank") -> int:
    """k as an int when 1 ≤ k ≤ ``available``; else ValueError naming the module and shapes."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"{task_label(name)}: {what} k must be an integer, got {k!r} ({shape_desc})")
    k = int(k)
    if k <= 0:
        raise ValueError(f"{task_label(name)}: {what} k={k} must be positive ({shape_desc})")
    if k > available:
        raise ValueError(f"{task_label(name)}: {what} k={k} exceeds the available rank {available} ({shape_desc})")
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
        decomp="cpqr",
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
        decomp="svd",
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
    decomp: Decomp = "cpqr",
    *,
    name: str | None = None,
    singular_values: bool = True,
    method: Decomp | None = None,
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
    decomp : {"cpqr", "svd"}
        "cpqr": T Π = Q R via xGEQP3 (``scipy.linalg.qr(pivoting=True)``), truncated to the leading k
        columns of Q / rows of R. "svd": T = U S Vᵀ via gesdd, truncated to U_k, S_k V_kᵀ.
    name : str, optional
        Module name used in error messages.
    singular_values : bool
        Factored CPQR only: also compute all singular values of T (those of the small matrix; needed by
        :func:`qrerase.method.diagnostics.rrqr_bound`). ``False`` skips this
        (``Decomposition.singular_values`` is then None).
    method : {"cpqr", "svd"}, optional
        Deprecated name of ``decomp`` (DeprecationWarning; removed in the next release).

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
    decomp = resolve_decomp(decomp, method, "decompose")
    if A is None:
        if isinstance(B, (LowRank, tuple, list)):
            lr = as_lowrank(B, name)
        else:
            return decompose_dense(B, rank, decomp, name=name)
    else:
        lr = as_lowrank((B, A), name)
    (d_out, d_in), r = lr.shape, lr.rank
    desc = f"B {format_shape(lr.B.shape)}, A {format_shape(lr.A.shape)}, T {d_out}×{d_in}"
    k = check_rank(rank, min(r, d_out, d_in), name, desc)
    Qb, M = small_matrix(lr.B, lr.A)
    if numerically_zero(lr.B, lr.A, M):
        raise ValueError(f"{task_label(name)}: task matrix is all zero (to working precision; {desc})")
    if decomp == "cpqr":
        s = sla.svdvals(M, check_finite=False) if singular_values else None
        return _cpqr_from(Qb, M, k, True, s)
    return _svd_from(Qb, M, k, True)


def decompose_dense(
    T: Any, rank: int, decomp: Decomp = "cpqr", *, name: str | None = None, method: Decomp | None = None
) -> Decomposition:
    """Rank-k CPQR (xGEQP3) or SVD (gesdd) of a dense task matrix T (d_out×d_in), eqs. 1–2.

    Same conventions as :func:`decompose` (``method``: the deprecated name of ``decomp``);
    k ≤ min(d_out, d_in). ``singular_values`` is None for CPQR (not cheaply available) and all singular
    values for SVD.
    """
    decomp = resolve_decomp(decomp, method, "decompose_dense")
    T = np.asarray(T, dtype=np.float64)
    if T.ndim != 2:
        raise ValueError(f"{task_label(name)}: a dense task matrix must be 2-D, got shape {format_shape(T.shape)}")
    desc = f"T {format_shape(T.shape)}"
    check_finite(T, "task matrix", name, desc)
    k = check_rank(rank, min(T.shape), name, desc)
    if not T.any():
        raise ValueError(f"{task_label(name)}: task matrix is all zero ({desc})")
    if decomp == "cpqr":
        return _cpqr_from(None, T, k, False, None)
    return _svd_from(None, T, k, False)


def decompose_any(x: Any, rank: int, decomp: str, name: str | None) -> Decomposition:
    """:func:`decompose` for factors (without the singular values), :func:`decompose_dense` for a dense T."""
    if isinstance(x, (LowRank, tuple, list)):
        return decompose(x, None, rank, decomp, name=name, singular_values=False)
    return decompose_dense(x, rank, decomp, name=name)
