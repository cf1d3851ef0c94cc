"""How separable the forget and retain edits are: principal angles between their task subspaces, and
how concentrated the forget energy is over layers (the size study's mechanistic measures).

* :func:`principal_angles` — the principal angles θ_1 ≤ … ≤ θ_k between span(Q_f) and span(Q_r).
* :func:`layer_overlap` — per transformer block, the mean over its modules of the subspace overlap
  cos²θ averaged over the k angles (= ‖Q_fᵀ Q_r‖_F² / k), with the smallest angle and the overlap two
  random k-dimensional subspaces of the same d_out would have (k / d_out), for reference.
* :func:`effective_layers` — exp of the Shannon entropy of the normalised layer energies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .module_names import block_index

__all__ = ["principal_angles", "layer_overlap", "effective_layers"]


def principal_angles(Q_f: np.ndarray, Q_r: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between the column spaces of ``Q_f`` and ``Q_r``.

    ``Q_f`` is ``(d, k_f)``, ``Q_r`` is ``(d, k_r)``, real, finite (orthonormal columns are not
    required: :func:`scipy.linalg.subspace_angles` orthonormalises). With σ_i the singular values of
    orth(Q_f)ᵀ orth(Q_r), θ_i = arccos σ_i; 0 = a shared direction, π/2 = orthogonal. Returns
    ``min(k_f, k_r)`` angles, float64, ascending.
    """
    from scipy.linalg import subspace_angles

    A, B = np.asarray(Q_f, dtype=np.float64), np.asarray(Q_r, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[0]:
        raise ValueError(f"principal_angles: expected (d, k_f) and (d, k_r) matrices, got {A.shape} and {B.shape}")
    if min(A.shape[1], B.shape[1]) < 1:
        raise ValueError("principal_angles: a subspace has no columns")
    if not (np.isfinite(A).all() and np.isfinite(B).all()):
        raise ValueError("principal_angles: non-finite entries")
    return np.sort(subspace_angles(A, B))


def layer_overlap(forget: Mapping[str, Any], retain: Mapping[str, Any]) -> list[dict[str, float]]:
    """Per transformer block: how much the forget and retain task subspaces share.

    ``forget`` / ``retain`` map module names to objects with a ``Q`` attribute ``(d_out, k)`` (e.g.
    :class:`qrerase.method.decompose.Decomposition`; the SVD's U_k is the task matrix's leading
    column space). For each module in both, with θ its principal angles (:func:`principal_angles`),
    ``overlap = mean_i cos² θ_i`` ∈ [0, 1] (1: the same subspace) and ``random = k / d_out``, the
    expected overlap of two random k-dimensional subspaces of R^d_out. Returns one dict per block in
    block order: ``layer`` (block index), ``overlap`` and ``random`` (means over the block's modules),
    ``min_angle_deg`` (the smallest angle over its modules, degrees), ``modules`` (count).
    """
    common = [m for m in forget if m in retain]
    if not common:
        raise ValueError("layer_overlap: the forget and retain factors share no module")
    per_block: dict[int, list[tuple[float, float, float]]] = {}
    for m in common:
        theta = principal_angles(forget[m].Q, retain[m].Q)
        d_out, k = np.shape(forget[m].Q)[0], len(theta)
        values = (float(np.mean(np.cos(theta) ** 2)), k / d_out, math.degrees(float(theta[0])))
        per_block.setdefault(block_index(m), []).append(values)
    return [
        {
            "layer": b,
            "overlap": float(np.mean([v[0] for v in vals])),
            "random": float(np.mean([v[1] for v in vals])),
            "min_angle_deg": float(min(v[2] for v in vals)),
            "modules": len(vals),
        }
        for b, vals in sorted(per_block.items())
    ]


def effective_layers(energy: Mapping[str, float] | np.ndarray) -> float:
    """Effective number of layers of an energy profile: N_eff = exp(H), H = −Σ_ℓ p_ℓ ln p_ℓ.

    ``energy`` holds E_ℓ ≥ 0 per layer (eq. 14, any scale; normalised here to p_ℓ = E_ℓ / Σ E). N_eff
    is 1 when one layer holds all the energy and |L| when all layers hold the same (the Hill number
    of order 1; terms with p_ℓ = 0 contribute 0).
    """
    vals = np.asarray(list(energy.values()) if isinstance(energy, Mapping) else energy, dtype=np.float64).ravel()
    if vals.size == 0 or not np.isfinite(vals).all() or (vals < 0).any() or vals.sum() <= 0:
        raise ValueError("effective_layers: expected finite non-negative energies with a positive sum")
    p = vals / vals.sum()
    p = p[p > 0]
    return float(math.exp(-np.sum(p * np.log(p))))
