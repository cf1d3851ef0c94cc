"""Diagnostics of the decompositions: principal angles (eq. 11), the RRQR bound (eq. 10), factor reports.

Paper equations: the numbering of T. Lizzo and L. Heck, "QR-Erase: Efficient Subspace-Based Machine
Unlearning with Layer Localization", AAAI-27 (CITATION.cff):

- eq. 7: partition of the CPQR at rank k, R_11 is its leading k×k block;
- eq. 10: sin Θ ≤ σ_{k+1} ‖R_11⁻¹‖₂;
- eq. 11: sin Θ = ‖P_F − P_F̂‖₂.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.linalg as sla

from .decompose import Decomposition, decompose
from .discriminate import check_module_pairs
from .energy import LayerSelection, layer_energy, select_layers
from .lowrank import as_lowrank, format_shape
from .module_names import block_of, layer_of, module_sort_key

__all__ = ["max_sin_theta", "rrqr_bound", "factor_report"]


def max_sin_theta(Q1: np.ndarray, Q2: np.ndarray) -> float:
    """Sine of the largest principal angle between range(Q1) and range(Q2), = ‖P1 − P2‖₂ (eq. 11).

    Q1 (n×k1) and Q2 (n×k2) must have orthonormal columns. Computed as max(‖Q1 − Q2(Q2ᵀQ1)‖₂,
    ‖Q2 − Q1(Q1ᵀQ2)‖₂), which is accurate for tiny angles (unlike sqrt(1 − cos²)); 1 when k1 ≠ k2.
    """
    Q1 = np.asarray(Q1, dtype=np.float64)
    Q2 = np.asarray(Q2, dtype=np.float64)
    if Q1.ndim != 2 or Q2.ndim != 2 or Q1.shape[0] != Q2.shape[0]:
        raise ValueError(
            f"max_sin_theta: bases must be n×k with the same n, "
            f"got {format_shape(Q1.shape)} and {format_shape(Q2.shape)}"
        )
    a = np.linalg.norm(Q1 - Q2 @ (Q2.T @ Q1), 2) if Q1.shape[1] else 0.0
    b = np.linalg.norm(Q2 - Q1 @ (Q1.T @ Q2), 2) if Q2.shape[1] else 0.0
    return float(min(1.0, max(a, b)))


def rrqr_bound(dec: Decomposition) -> float:
    """The paper's principal-angle bound σ_{k+1} ‖R_11⁻¹‖₂ (eq. 10) for a CPQR :class:`Decomposition`.

    R_11 is the leading k×k block of R in pivoted order (eq. 7), i.e. ``dec.R[:, dec.piv[:k]]``.
    Conventions: σ_{k+1} := 0 when k ≥ the number of (available) singular values, giving 0; a singular
    R_11 gives inf (unless σ_{k+1} = 0). Requires ``dec.singular_values`` (factored path).
    """
    if dec.decomp != "cpqr" or dec.piv is None:
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
    names: tuple[str, str] | None = None,
    forget_selection: LayerSelection | None = None,
):
    """Per-module diagnostics of a forget/retain adapter pair as a pandas DataFrame.

    One row per (set ∈ {forget, retain}, module), forget first, modules in block order. Columns:
    ``set, module, block, d_out, d_in, lora_rank, rank, fro_norm, energy, selected, sigma_k, sigma_k1,
    recon_err_cpqr, recon_err_svd, max_sin_theta_qr_vs_svd, bound_sigma_k1_r11inv``:

    - ``energy`` / ``selected``: E_ℓ of the module's layer within its set (eq. 14) and the eq. 15 rule
      (the forget set's: ``forget_selection``'s layers when given, rule energy's selection read by
      :func:`qrerase.method.energy.read_selection`; a layer of it that the forget set lacks is a ValueError);
    - ``recon_err_*``: ‖T − T_k‖_F / ‖T‖_F, computed from the small factored matrices;
    - ``max_sin_theta_qr_vs_svd``: largest principal-angle sine between the CPQR Q_k and SVD U_k (eq. 11);
    - ``bound_sigma_k1_r11inv``: σ_{k+1} ‖R_11⁻¹‖₂ (eq. 10; 0 when k ≥ rank, inf for singular R_11).

    ``rank`` applies to the forget set and ``retain_rank`` (default ``rank``) to the retain set.
    ``names`` (the two adapters' directories) are named in the error when the pair's modules differ.
    """
    import pandas as pd

    check_module_pairs(forget, retain, names)
    rows = []
    for set_name, factors, k in (
        ("forget", forget, rank),
        ("retain", retain, rank if retain_rank is None else retain_rank),
    ):
        lrs = {m: as_lowrank(f, m) for m, f in factors.items()}
        energy = layer_energy(lrs, granularity=energy_granularity)
        if set_name == "forget" and forget_selection is not None:
            selected = set(forget_selection.layers)
            if unknown := sorted(selected - set(energy)):
                raise ValueError(
                    f"factor_report: selected layer(s) {unknown[:3]} are no {energy_granularity} of the forget adapter"
                )
        else:
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
