"""qrerase: subspace-based machine unlearning with column-pivoted QR (QR-Erase) and SVD (UNLEARN).

Public API (the docs' Library API pages, docs/api/, render these docstrings):

- :func:`task_matrices` — read a PEFT LoRA adapter into factored task matrices T = s·B·A.
- :func:`decompose` — exact rank-k CPQR / SVD of a task matrix given as factors (or densely).
- :func:`forget_update` — subspace discrimination and reconstruction, T̃_f = (I − P_r) Q_f,k R_f,k Πᵀ.
- :func:`layer_energy`, :func:`select_layers` — normalised task energy E_ℓ and the E_ℓ ≥ 1/|L| rule.
- :mod:`qrerase.metrics.log_metrics` — TOFU metrics (Model Utility, Forget Quality) on TOFU-format eval logs.

The names are imported lazily so that ``import qrerase`` stays cheap (no torch import).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "task_matrices": "method.adapters",
    "decompose": "method.decompose",
    "forget_update": "method.discriminate",
    "layer_energy": "method.energy",
    "select_layers": "method.energy",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'qrerase' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
