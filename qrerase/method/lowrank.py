"""The factored task matrix T = s·B·A of a LoRA adapter, and the checks every method function shares.

A LoRA task matrix T = s·B·A (B: d_out×r, A: r×d_in, r ≪ d) is never densified. With the thin QR
B = Q_B R_B, T = Q_B (R_B A) and the small r×d_in matrix M = R_B A carries everything
(:func:`small_matrix`; used by :func:`qrerase.method.decompose.decompose`), including the Frobenius
norm ‖T‖_F = ‖M‖_F (:meth:`LowRank.fro_norm`, the input of the task energy of eq. 14). Everything is
float64.

The small helpers :func:`format_shape`, :func:`task_label` and :func:`check_finite` build the
one-line error messages (naming the module and the shapes) of the whole :mod:`qrerase.method` package.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.linalg as sla

__all__ = [
    "LowRank",
    "as_lowrank",
    "small_matrix",
    "numerically_zero",
    "check_finite",
    "format_shape",
    "task_label",
]


def format_shape(shape: tuple[int, ...]) -> str:
    """``"d_out×d_in"``-style text of an array shape, for error messages."""
    return "×".join(str(int(s)) for s in shape)


def task_label(name: str | None) -> str:
    """How an error message names the task matrix: ``module 'name'``, or ``task matrix`` without a name."""
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
                "LowRank: factors must be B (d_out×r) and A (r×d_in), "
                f"got B {format_shape(B.shape)} and A {format_shape(A.shape)}"
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
    return 0.0 if numerically_zero(B, A, M) else float(np.linalg.norm(M))


def numerically_zero(B: np.ndarray, A: np.ndarray, M: np.ndarray) -> bool:
    """Whether T = B A (= Q_B M) is zero to working precision: ‖M‖_F ≤ 4·r·eps·‖B‖_F‖A‖_F.

    Exact cancellation inside B A (e.g. two opposite rank-1 terms) leaves rounding-level residue in
    M = R_B A; such a T is treated as the all-zero task matrix.
    """
    if not M.any():
        return True
    r = max(1, B.shape[1])
    return float(np.linalg.norm(M)) <= 4 * r * np.finfo(np.float64).eps * float(np.linalg.norm(B)) * float(
        np.linalg.norm(A)
    )


def small_matrix(B: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Thin QR B = Q_B R_B and the small matrix M = R_B A, so that B A = Q_B M exactly (in exact arithmetic)."""
    Qb, Rb = sla.qr(B, mode="economic", check_finite=False)
    return Qb, Rb @ A


def check_finite(x: np.ndarray, what: str, name: str | None, shape_desc: str) -> None:
    """ValueError naming the module and shapes when ``x`` holds NaN or Inf."""
    if not np.isfinite(x).all():
        raise ValueError(f"{task_label(name)}: {what} contains NaN or Inf ({shape_desc})")


def as_lowrank(x: Any, name: str | None = None) -> LowRank:
    """Coerce ``LowRank`` or a ``(B, A)`` pair to :class:`LowRank`, validating shapes and finiteness."""
    if isinstance(x, LowRank):
        lr = x
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        try:
            lr = LowRank(x[0], x[1])
        except ValueError as exc:
            raise ValueError(f"{task_label(name)}: {exc}") from None
    else:
        raise TypeError(f"{task_label(name)}: expected LowRank or a (B, A) pair, got {type(x).__name__}")
    desc = f"B {format_shape(lr.B.shape)}, A {format_shape(lr.A.shape)}"
    check_finite(lr.B, "factor B", name, desc)
    check_finite(lr.A, "factor A", name, desc)
    return lr
