"""Normalised layer task energy and the layer-localisation rule (Layer-Localized QR-Erase).

Paper equations: the numbering of T. Lizzo and L. Heck, "QR-Erase: Efficient Subspace-Based Machine
Unlearning with Layer Localization", AAAI-27 (CITATION.cff):

- eq. 14: E_ℓ = ‖T_f^ℓ‖_F / Σ_{j∈L} ‖T_f^j‖_F;
- eq. 15: L_forget = {ℓ ∈ L : E_ℓ ≥ 1/|L|};
- eq. 16: W' = W − T̃_f only for ℓ ∈ L_forget
  (see :func:`modules_for_layers` and :func:`qrerase.method.discriminate.forget_updates`).

Rule energy writes the selection twice, ``energy.csv`` (``layer, energy, threshold, selected``) and
``selected_layers.json`` (``granularity, layers, modules``); :func:`read_selection` is the one reader
of both (every consumer reads the rule's selection, none recomputes it from rounded CSV energies).

A "layer" is either a transformer block (``granularity="block"``; the block's norm is the
root-sum-square of its modules' norms, i.e. the Frobenius norm of all its task matrices together) or a
single adapted module (``granularity="module"``); module names map to blocks as described in
:mod:`qrerase.method.module_names`.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .lowrank import LowRank, as_lowrank
from .module_names import check_granularity, layer_of, module_sort_key

__all__ = [
    "SELECT_RTOL",
    "LayerSelection",
    "threshold",
    "read_selection",
    "write_selection",
    "module_norms",
    "energy_from_norms",
    "layer_energy",
    "select_layers",
    "modules_for_layers",
    "select_modules",
    "selected_updates",
]

#: Relative tolerance of the eq. 15 threshold: a layer is selected when E_ℓ ≥ (1 − SELECT_RTOL)/|L|.
#: Without it, layers whose energy is mathematically exactly 1/|L| (e.g. uniform energies) could be
#: dropped by a one-ulp rounding of the normalisation. 1e-9 is far above rounding (~|L|·1e-16) and far
#: below any meaningful energy difference.
SELECT_RTOL = 1e-9


def threshold(n_layers: int) -> float:
    """Eq. 15's selection threshold 1/|L| for ``n_layers`` = |L| >= 1 layers (the dashed line of the
    energy figures, the ``threshold`` column of rule energy's CSV). :func:`select_layers` compares
    with it up to :data:`SELECT_RTOL`."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"threshold: the number of layers must be a positive int, got {n_layers!r}")
    return 1.0 / n_layers


@dataclass(frozen=True)
class LayerSelection:
    """Rule energy's layer selection as read back by :func:`read_selection`.

    layers: L_forget (eq. 15), in layer order. energy: layer -> E_ℓ (eq. 14) of every layer (from
    ``energy.csv``; ``None`` from the JSON). modules: the module names of L_forget (eq. 16; from
    ``selected_layers.json``; ``None`` from the CSV). granularity: ``"block"`` / ``"module"`` (JSON) or
    ``None`` (CSV).
    """

    layers: tuple[str, ...]
    energy: dict[str, float] | None = None
    modules: tuple[str, ...] | None = None
    granularity: str | None = None


def read_selection(path: str | os.PathLike) -> LayerSelection:
    """The layer selection (eqs. 14–16) that rule energy wrote: the one reader of its two files.

    ``*.csv`` (``energy.csv``: columns ``layer``, ``energy``, ``selected`` with ``True`` / ``False``):
    every layer's E_ℓ and the selected layers, read from the ``selected`` column (never recomputed from
    the rounded energies). ``*.json`` (``selected_layers.json``: ``granularity``, ``layers``,
    ``modules`` lists): the selected layers and their modules. Anything else, a missing column or key, a
    bad value: ``ValueError`` (one line naming the file).
    """
    path = Path(path)
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            modules, layers, granularity = data.get("modules"), data.get("layers"), data.get("granularity")
            if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
                raise ValueError(f'expected a "modules" list (rule energy\'s selection), got {modules!r}')
            if not isinstance(layers, list) or not all(isinstance(x, str) for x in layers):
                raise ValueError(f'expected a "layers" list of layer labels, got {layers!r}')
            check_granularity(granularity)
            return LayerSelection(tuple(layers), None, tuple(modules), granularity)
        if path.suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh))
            if not rows or not {"layer", "energy", "selected"} <= set(rows[0]):
                raise ValueError("expected rule energy's columns layer, energy, selected and one row per layer")
            energy, layers = {}, []
            for r in rows:
                flag = {"True": True, "False": False}.get(r["selected"])
                if flag is None:
                    raise ValueError(f"layer {r['layer']!r}: selected must be True or False, got {r['selected']!r}")
                energy[r["layer"]] = float(r["energy"])
                if flag:
                    layers.append(r["layer"])
            return LayerSelection(tuple(layers), energy)
        raise ValueError("expected rule energy's energy.csv or selected_layers.json")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_selection(
    energy: Mapping[str, float],
    selected: Iterable[str],
    modules: Iterable[str],
    granularity: str,
    csv_path: str | os.PathLike,
    json_path: str | os.PathLike,
) -> None:
    """Write rule energy's two files, the ones :func:`read_selection` reads: ``csv_path`` (``layer``,
    ``energy`` E_ℓ of eq. 14 in ``energy``'s order, ``threshold`` 1/|L|, ``selected`` of eq. 15) and
    ``json_path`` (``granularity``, the selected ``layers`` and their ``modules``: eq. 16's filter).
    Each is written atomically (:mod:`qrerase.io`)."""
    import pandas as pd

    from ..io import write_csv, write_json

    check_granularity(granularity)
    selected = list(selected)
    frame = pd.DataFrame(
        {
            "layer": list(energy),
            "energy": list(energy.values()),
            "threshold": threshold(len(energy)),
            "selected": [layer in selected for layer in energy],
        }
    )
    write_csv(csv_path, frame)
    write_json(json_path, {"granularity": granularity, "layers": selected, "modules": list(modules)})


def module_norms(factors: Mapping[str, Any]) -> dict[str, float]:
    """‖T‖_F per module from its factors (LowRank or (B, A) pair; a dense array also works), float.

    For factors the norm is computed without densifying: ‖BA‖_F = ‖R_B A‖_F with B = Q_B R_B
    (equal to sqrt(tr((BᵀB)(AAᵀ)))). NaN/Inf → ValueError naming the module.
    """
    out = {}
    for name, f in factors.items():
        if isinstance(f, (LowRank, tuple, list)):
            out[name] = as_lowrank(f, name).fro_norm()
        else:
            arr = np.asarray(f, dtype=np.float64)
            if not np.isfinite(arr).all():
                raise ValueError(f"module {name!r}: task matrix contains NaN or Inf (shape {arr.shape})")
            out[name] = float(np.linalg.norm(arr))
    return out


def energy_from_norms(norms: Mapping[str, float], granularity: str = "block") -> dict[str, float]:
    """Normalised energies E_ℓ (eq. 14) from per-module Frobenius norms.

    Parameters
    ----------
    norms : mapping module name → ‖T^m‖_F (finite, ≥ 0)
    granularity : {"block", "module"}
        "block": ‖T^ℓ‖_F = sqrt(Σ_{m∈ℓ} ‖T^m‖_F²) over the modules of block ℓ; "module": each module.

    Returns
    -------
    dict layer → E_ℓ (float), ordered by block index (modules: by block, then name), summing to 1.

    Raises
    ------
    ValueError
        Empty input, a negative/non-finite norm, a module without a block (granularity="block"), or
        zero total energy (all task matrices zero).
    """
    check_granularity(granularity)
    if not norms:
        raise ValueError("layer energy: no modules given")
    sq: dict[str, float] = {}
    for name in sorted(norms, key=module_sort_key):
        v = float(norms[name])
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"module {name!r}: task-matrix norm must be finite and non-negative, got {v}")
        layer = layer_of(name, granularity)
        sq[layer] = sq.get(layer, 0.0) + v * v
    layer_norms = {layer: math.sqrt(v) for layer, v in sq.items()}
    if granularity == "block":
        layer_norms = dict(sorted(layer_norms.items(), key=lambda kv: int(kv[0])))
    total = math.fsum(layer_norms.values())
    if total == 0.0:
        raise ValueError(
            f"layer energy: all {len(norms)} task matrices are zero (total energy 0), e.g. {next(iter(norms))!r}"
        )
    return {layer: v / total for layer, v in layer_norms.items()}


def layer_energy(factors: Mapping[str, Any], granularity: str = "block") -> dict[str, float]:
    """Normalised task energy E_ℓ = ‖T_f^ℓ‖_F / Σ_j ‖T_f^j‖_F (eq. 14) from factored task matrices.

    ``factors`` maps module names to LowRank / (B, A) (float, any shapes). Returns layer → E_ℓ as in
    :func:`energy_from_norms` (block labels are ``"0"``, ``"1"``, …; module labels are the names).
    """
    check_granularity(granularity)
    return energy_from_norms(module_norms(factors), granularity)


def select_layers(energy: Mapping[str, float], rtol: float = SELECT_RTOL) -> list[str]:
    """Layers with above-average energy, E_ℓ ≥ 1/|L| (eq. 15), in the order of ``energy``.

    The comparison is E_ℓ ≥ (1 − rtol)/|L| with a tiny relative tolerance (:data:`SELECT_RTOL`) so that
    layers at exactly the average are kept despite rounding. With uniform energies all layers are selected.
    """
    if not energy:
        raise ValueError("select_layers: no layers given")
    vals = {k: float(v) for k, v in energy.items()}
    bad = [k for k, v in vals.items() if not math.isfinite(v) or v < 0]
    if bad:
        raise ValueError(f"select_layers: energy of layer {bad[0]!r} is not a finite non-negative number")
    threshold = (1.0 - rtol) / len(vals)
    return [k for k, v in vals.items() if v >= threshold]


def modules_for_layers(layers: Iterable[str], module_names: Iterable[str], granularity: str = "block") -> list[str]:
    """The module names (in block order) covered by the given layer labels (eq. 16's ℓ ∈ L_forget)."""
    check_granularity(granularity)
    wanted = {str(layer) for layer in layers}
    return [m for m in sorted(module_names, key=module_sort_key) if layer_of(m, granularity) in wanted]


def select_modules(factors: Mapping[str, Any], granularity: str = "block", rtol: float = SELECT_RTOL) -> list[str]:
    """Convenience: modules of the layers selected by eqs. 14–15 for forget factors."""
    energy = layer_energy(factors, granularity)
    return modules_for_layers(select_layers(energy, rtol), factors, granularity)


def selected_updates(updates: Mapping[str, Any], selected_json: str | os.PathLike | None) -> dict[str, Any]:
    """The forget updates the erase applies: only those of the modules of L_forget (eq. 16), or all of
    them (eq. 6) when ``selected_json`` is None.

    ``updates`` maps module names to forget updates T̃_f (any value: arrays, :class:`LowRank`; passed
    through unchanged). ``selected_json`` is rule energy's selection file (:func:`read_selection`),
    whose ``"modules"`` list (eq. 15's layers as module names) gives the modules kept, in its order. A
    selected module without an update, or a file that is no such selection, is a ValueError naming the file.
    """
    if selected_json is None:
        return dict(updates)
    modules = read_selection(selected_json).modules
    if modules is None:
        raise ValueError(f"{selected_json}: expected rule energy's selected_layers.json (the modules of L_forget)")
    missing = [m for m in modules if m not in updates]
    if missing:
        raise ValueError(f"{selected_json}: selected modules {missing[:3]} have no forget update")
    return {m: updates[m] for m in modules}
