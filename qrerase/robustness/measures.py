"""The robustness stage's measures (docs/robustness.md): recovery, relearning gain, the subspace share of
an attack's update, and the seeded A/B split of a forget set. Numpy only.

With s the track's forget statistic (answer NLL on text, accuracy on speech) of the attacked model on
half B, at an attack budget b (optimiser steps):

``recovery_b = (s_attacked,b − s_floor,b) / (s_ceiling,b − s_floor,b)``

floor: the retain reference put through the same attack (never saw the forget set); ceiling: the
fine-tuned model put through it (never unlearned). 0: the attack taught B no more than it teaches a
model that never learned it; 1: B is back to where the un-unlearned model is under the same attack.
``gain_b = recovery_b − recovery_0``: how much of the forgetting the attack undid. Quantization:
``(s_quantized − s_unlearned) / (s_fine-tuned − s_unlearned)``, the share of the forgetting it undoes.

The subspace share of an update ΔW (d_out × d_in) in span(Q) (Q: d_out × k, orthonormal columns):
``‖Qᵀ ΔW‖²_F / ‖ΔW‖²_F`` ∈ [0, 1]; a uniformly random k-dimensional subspace gets k / d_out in
expectation (:func:`random_subspace`), the reference beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["recovery", "relearning_gain", "quantization_recovery", "subspace_share", "random_subspace", "split_halves"]

#: A floor–ceiling gap smaller than this (in the statistic's units) cannot scale a recovery.
MIN_GAP = 1e-9


def _ratio(num: float, den: float, what: str) -> float:
    values = (num, den)
    if not all(isinstance(v, (int, float, np.floating)) and math.isfinite(v) for v in values):
        raise ValueError(f"{what}: non-finite value in {values}")
    if abs(den) < MIN_GAP:
        raise ValueError(f"{what}: the gap it is scaled by is {den:.3g}, too small to scale a recovery")
    return float(num) / float(den)


def recovery(attacked: float, floor: float, ceiling: float, what: str = "recovery") -> float:
    """``(attacked − floor) / (ceiling − floor)`` (module docstring), a float (not clipped: below 0 the
    attack left B further from the ceiling than the floor is, above 1 beyond it). A one-line ValueError
    naming ``what`` where ceiling and floor agree (|gap| < :data:`MIN_GAP`) or a value is not finite."""
    return _ratio(float(attacked) - float(floor), float(ceiling) - float(floor), what)


def relearning_gain(recovery_b: float, recovery_0: float) -> float:
    """``recovery_b − recovery_0``: the share of the forgetting the attack of budget b undid."""
    return float(recovery_b) - float(recovery_0)


def quantization_recovery(quantized: float, unlearned: float, finetuned: float, what: str = "quantization") -> float:
    """``(quantized − unlearned) / (fine-tuned − unlearned)``: the share of the forgetting that
    quantizing the unlearned model undoes (0: none, 1: all). One-line ValueError where the method forgot
    nothing (the fine-tuned and unlearned statistics agree) or a value is not finite."""
    return _ratio(float(quantized) - float(unlearned), float(finetuned) - float(unlearned), what)


def subspace_share(delta: np.ndarray, basis: np.ndarray, atol: float = 1e-8) -> float:
    """``‖Qᵀ ΔW‖²_F / ‖ΔW‖²_F``: the share of ΔW's energy in span(Q).

    Parameters
    ----------
    delta : ndarray, shape (d_out, d_in)
        The update (e.g. W_attacked − W_unlearned of one module).
    basis : ndarray, shape (d_out, k)
        Orthonormal columns (QᵀQ = I within ``atol``), e.g. Q̃_f orthonormalised or the top-k left
        singular vectors of the forget task matrix.

    Returns a float in [0, 1]; 0 for ΔW = 0. ValueError on shapes that do not match, a basis that is
    not orthonormal, or a non-finite entry.
    """
    delta, basis = np.asarray(delta, dtype=np.float64), np.asarray(basis, dtype=np.float64)
    if delta.ndim != 2 or basis.ndim != 2 or basis.shape[0] != delta.shape[0]:
        raise ValueError(f"subspace_share: ΔW {delta.shape} and Q {basis.shape} are not d_out×d_in and d_out×k")
    if not (np.isfinite(delta).all() and np.isfinite(basis).all()):
        raise ValueError("subspace_share: non-finite entry in ΔW or Q")
    if not np.allclose(basis.T @ basis, np.eye(basis.shape[1]), atol=atol):
        raise ValueError(f"subspace_share: Q {basis.shape} does not have orthonormal columns")
    total = float(np.sum(delta * delta))
    if total == 0.0:
        return 0.0
    inside = basis.T @ delta
    return min(1.0, float(np.sum(inside * inside)) / total)


def random_subspace(d_out: int, k: int, seed: int) -> np.ndarray:
    """A uniformly random k-dimensional subspace of R^d_out as a (d_out, k) orthonormal basis: the Q of
    a Gaussian matrix's QR (signs fixed by R's diagonal, so the distribution is Haar). Seeded."""
    if not (isinstance(k, int) and isinstance(d_out, int) and 1 <= k <= d_out):
        raise ValueError(f"random_subspace: expected 1 <= k <= d_out, got k={k!r}, d_out={d_out!r}")
    g = np.random.default_rng(seed).standard_normal((d_out, k))
    q, r = np.linalg.qr(g)
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def split_halves(entities: Sequence[str], seed: int, share: float = 0.5) -> np.ndarray:
    """The seeded A/B split of a forget set by its entities (author, speaker, skill, language): a bool
    (N,) mask, True for half A (trained on by the relearning attack), False for B (scored).

    Within each entity the items are permuted with a generator seeded by ``seed`` and ceil(n · share)
    go to A (``share`` in (0, 1); 0.5: halves), so every entity is in both halves and B's items cannot be
    guessed from another entity's. A one-line ValueError names an entity whose A or B would be empty.
    """
    if not 0 < share < 1:
        raise ValueError(f"split_halves: share must be in (0, 1), got {share!r}")
    entities = [str(e) for e in entities]
    if not entities:
        raise ValueError("split_halves: the forget set is empty")
    in_a = np.zeros(len(entities), dtype=bool)
    rng = np.random.default_rng(seed)
    for entity in sorted(set(entities)):
        idx = np.flatnonzero(np.asarray(entities) == entity)
        n_a = math.ceil(len(idx) * share)
        if not 0 < n_a < len(idx):
            raise ValueError(
                f"split_halves: entity {entity!r} has {len(idx)} item(s), so a share of {share} leaves a half empty"
            )
        in_a[rng.permutation(idx)[:n_a]] = True
    return in_a
