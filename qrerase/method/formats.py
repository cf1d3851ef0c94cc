"""File formats of the method's artifacts: decompositions and forget updates as safetensors.

:func:`save_decompositions` / :func:`load_decompositions` store the rank-k CPQR / SVD of every module
(:class:`~qrerase.method.decompose.Decomposition`); :func:`save_updates` / :func:`load_updates` the
forget updates U @ V = λ·T̃_f (:class:`~qrerase.method.discriminate.Update`, eq. 5). Files are written
atomically and byte-identically (:func:`qrerase.io.save_arrays`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..io import load_arrays, open_safetensors, save_arrays
from .decompose import Decomposition
from .discriminate import Update
from .erase import validate_updates
from .module_names import module_sort_key

__all__ = ["save_decompositions", "load_decompositions", "save_updates", "load_updates"]


def save_decompositions(path, decs: Mapping[str, Decomposition]) -> None:
    """Write decompositions as one safetensors file (atomically).

    Keys ``<module>.Q`` (d_out×k), ``<module>.R`` (k×d_in, original column order), ``<module>.diag``,
    ``<module>.piv`` (int64, CPQR only), ``<module>.singular_values`` (when available), float64; the
    safetensors metadata ``"qrerase"`` holds JSON {module: {decomp, rank, fro_norm, residual_norm, factored}}
    (files written before the rename have ``method`` for ``decomp``; :func:`load_decompositions` reads both).
    """
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
        meta[m] = {
            "decomp": d.decomp,
            "rank": d.rank,
            "fro_norm": d.fro_norm,
            "residual_norm": d.residual_norm,
            "factored": d.factored,
        }
    save_arrays(
        path, arrays, metadata={"format": "qrerase-decompositions", "qrerase": json.dumps(meta, sort_keys=True)}
    )


def load_decompositions(path) -> dict[str, Decomposition]:
    """Read a :func:`save_decompositions` file; modules ordered by block index, then name."""
    arrays = load_arrays(path)
    with open_safetensors(path) as fh:
        meta_raw = (fh.metadata() or {}).get("qrerase")
    if meta_raw is None:
        raise ValueError(f"{path}: not a qrerase decompositions file (no 'qrerase' metadata)")
    meta = json.loads(meta_raw)
    out = {}
    for m in sorted(meta, key=module_sort_key):
        info = meta[m]
        try:
            out[m] = Decomposition(
                decomp=info["decomp"] if "decomp" in info else info["method"],
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
    checked = validate_updates(updates)
    arrays: dict[str, np.ndarray] = {}
    for m, (U, V) in checked.items():
        arrays[f"{m}.U"] = U
        arrays[f"{m}.V"] = V
    save_arrays(path, arrays, metadata={"format": "qrerase-updates"})


def load_updates(path) -> dict[str, Update]:
    """Read a :func:`save_updates` file into {module: Update(U, V)}, ordered by block index, then name."""
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
