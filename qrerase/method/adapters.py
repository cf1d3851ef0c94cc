"""Task matrices from PEFT LoRA adapters, kept factored: T = s·B·A with s = lora_alpha / r.

A PEFT LoRA adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` with keys
``base_model.model.<module>.lora_A.weight`` (r×d_in) and ``…lora_B.weight`` (d_out×r). Module names
returned here have PEFT's ``base_model.model.`` prefix and the ``.lora_A/B.weight`` suffix stripped, so
they equal the base model's module names (``model.layers.0.self_attn.q_proj``; its weight is
``<module>.weight`` in the base state dict, shape d_out×d_in, the same as T).

``fan_in_fan_out`` adapters (PEFT's setting for GPT-2-style ``Conv1D`` layers, whose weight is stored
transposed, d_in×d_out) are read the same way: lora_A is r×d_in and lora_B d_out×r, PEFT adds
(s·B·A)ᵀ to the stored weight, and T = s·B·A here is always the linear map's own orientation
(y = T x, d_out×d_in), so Conv1D and nn.Linear modules factor, discriminate and erase alike; only the
write-back transposes (:func:`qrerase.method.erase.apply_updates`, the erase adapter's ``fan_in_fan_out``).

Per-module rank and alpha follow PEFT exactly: ``rank_pattern`` / ``alpha_pattern`` keys are regexes
matched as ``re.match(rf"(.*\\.)?({key})$", module)`` (first matching key wins), the scale is
alpha / r, or alpha / sqrt(r) with ``use_rslora``.

Factor files written by :func:`save_factors` are safetensors with keys ``<module>.B`` and ``<module>.A``
(float64; B already carries s).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..io import load_arrays, open_safetensors, save_arrays
from .lowrank import LowRank, as_lowrank
from .module_names import module_sort_key

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "LowRank",
    "LoraAdapterConfig",
    "read_adapter_config",
    "check_adapter_dir",
    "adapter_ranks",
    "checkpoint_shapes",
    "check_adapter_fits",
    "pattern_key",
    "lora_scale",
    "task_matrices",
    "save_factors",
    "load_factors",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

_KEY_RE = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])(?:\.(?P<adapter>[^.]+))?\.weight$")

# options that make the adapter's delta something other than s·B·A on an nn.Linear-style (d_out×d_in) weight
_UNSUPPORTED = {
    "use_dora": "DoRA (magnitude-rescaled) adapters",
    "lora_bias": "LoRA bias terms",
    "layer_replication": "layer replication",
    "target_parameters": "target_parameters (nn.Parameter targets)",
    "use_qalora": "QALoRA",
}


@dataclasses.dataclass(frozen=True)
class LoraAdapterConfig:
    """The subset of a PEFT ``LoraConfig`` that determines T = s·B·A."""

    path: str
    r: int
    lora_alpha: float
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    use_rslora: bool
    base_model_name_or_path: str | None
    fan_in_fan_out: bool = False

    def rank_for(self, module: str) -> int:
        key = pattern_key(self.rank_pattern, module)
        return int(self.rank_pattern[key]) if key is not None else int(self.r)

    def alpha_for(self, module: str) -> float:
        key = pattern_key(self.alpha_pattern, module)
        return float(self.alpha_pattern[key]) if key is not None else float(self.lora_alpha)

    def scale_for(self, module: str, r: int) -> float:
        return lora_scale(self.alpha_for(module), r, self.use_rslora)


def pattern_key(patterns: Mapping[str, Any], module: str) -> str | None:
    """The first ``rank_pattern``/``alpha_pattern`` key matching ``module`` (PEFT's ``get_pattern_key``), or None."""
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return None


def lora_scale(alpha: float, r: int, use_rslora: bool = False) -> float:
    """LoRA scale s = alpha / r, or alpha / sqrt(r) for rsLoRA."""
    if r <= 0:
        raise ValueError(f"LoRA rank must be positive, got {r}")
    return float(alpha) / (math.sqrt(r) if use_rslora else float(r))


def read_adapter_config(adapter_dir: str | Path) -> LoraAdapterConfig:
    """Parse ``<adapter_dir>/adapter_config.json``; FileNotFoundError / ValueError naming the path."""
    adapter_dir = Path(adapter_dir)
    if not adapter_dir.is_dir():
        raise FileNotFoundError(f"{adapter_dir}: adapter directory not found")
    path = adapter_dir / ADAPTER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path}: adapter config not found")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON adapter config ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: adapter config must be a JSON object")
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise ValueError(f"{path}: peft_type {peft_type!r} is not supported (only LORA)")
    for opt, what in _UNSUPPORTED.items():
        if cfg.get(opt):
            raise ValueError(f"{path}: {what} ({opt}={cfg[opt]!r}) are not supported")
    try:
        r = int(cfg["r"])
        alpha = float(cfg.get("lora_alpha", r))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: missing or invalid 'r'/'lora_alpha' ({exc})") from exc
    rank_pattern = dict(cfg.get("rank_pattern") or {})
    alpha_pattern = dict(cfg.get("alpha_pattern") or {})
    return LoraAdapterConfig(
        path=str(adapter_dir),
        r=r,
        lora_alpha=alpha,
        rank_pattern={k: int(v) for k, v in rank_pattern.items()},
        alpha_pattern={k: float(v) for k, v in alpha_pattern.items()},
        use_rslora=bool(cfg.get("use_rslora", False)),
        base_model_name_or_path=cfg.get("base_model_name_or_path"),
        fan_in_fan_out=bool(cfg.get("fan_in_fan_out", False)),
    )


def _check_weights_file(path: Path) -> None:
    if not path.is_file():
        bin_path = path.with_name("adapter_model.bin")
        if bin_path.is_file():
            raise ValueError(f"{bin_path}: pickle adapters are not supported; save the adapter with safetensors")
        raise FileNotFoundError(f"{path}: adapter weights not found")


def check_adapter_dir(adapter_dir: str | Path) -> LoraAdapterConfig:
    """The checks :func:`task_matrices` makes before reading tensors, for planning time: a readable
    LoRA ``adapter_config.json``, and ``adapter_model.safetensors`` whose header lists lora_A/lora_B
    tensors (the tensors themselves are not read). FileNotFoundError / ValueError naming the path."""
    from safetensors import safe_open

    cfg = read_adapter_config(adapter_dir)
    wpath = Path(adapter_dir) / ADAPTER_WEIGHTS
    _check_weights_file(wpath)
    try:
        with safe_open(str(wpath), framework="numpy") as fh:
            keys = list(fh.keys())
    except Exception as exc:  # safetensors raises several exception types
        raise ValueError(f"{wpath}: not a readable safetensors file ({exc})") from exc
    for key in keys:
        if _KEY_RE.match(key) is None:
            raise ValueError(
                f"{wpath}: unsupported tensor {key!r} (only lora_A / lora_B weights of linear layers are supported)"
            )
    if not keys:
        raise ValueError(f"{wpath}: no LoRA weights found")
    return cfg


def adapter_ranks(adapter_dir: str | Path) -> dict[str, int]:
    """Module -> LoRA rank of an adapter, from ``adapter_config.json`` (``r`` with ``rank_pattern``
    applied, :meth:`LoraAdapterConfig.rank_for`) for each module whose lora_A the weights file's header
    lists; no tensor is read. For planning: a rank k above a module's rank cannot be kept."""
    from safetensors import safe_open

    cfg = check_adapter_dir(adapter_dir)
    wpath = Path(adapter_dir) / ADAPTER_WEIGHTS
    with safe_open(str(wpath), framework="numpy") as fh:
        keys = list(fh.keys())
    modules = {m.group("module") for m in map(_KEY_RE.match, keys) if m is not None and m.group("which") == "A"}
    return {module: cfg.rank_for(module) for module in sorted(modules)}


def _load_weights(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as float64 numpy arrays (bf16 via torch)."""
    _check_weights_file(path)
    try:
        arrays = load_arrays(path)
    except ValueError as exc:
        if "bf16" not in str(exc).lower() and "bfloat16" not in str(exc).lower():
            raise
        try:
            import torch
            from safetensors.torch import load_file

            arrays = {k: v.to(torch.float64).numpy() for k, v in load_file(str(path)).items()}
        except Exception as exc2:  # pragma: no cover - defensive
            raise ValueError(f"{path}: not a readable safetensors file ({exc2})") from exc2
    return {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}


def task_matrices(adapter_dir: str | Path) -> dict[str, LowRank]:
    """Factored task matrices T = s·B·A of every module of a PEFT LoRA adapter.

    Parameters
    ----------
    adapter_dir : path
        Directory with ``adapter_config.json`` and ``adapter_model.safetensors``.

    Returns
    -------
    dict module name → LowRank
        B (d_out×r, float64, multiplied by s = alpha/r, or alpha/sqrt(r) with ``use_rslora``; r and
        alpha honour ``rank_pattern`` / ``alpha_pattern``) and A (r×d_in, float64). Ordered by block
        index, then module name. ``.dense()`` gives T = s·B·A (d_out×d_in), the exact merged delta
        (its transpose for a ``fan_in_fan_out`` adapter, whose Conv1D weights are stored d_in×d_out).

    Raises
    ------
    FileNotFoundError
        Missing directory, config or weights file (message names the path).
    ValueError
        Unreadable files, unsupported LoRA variants (DoRA, bias, embeddings, …), a module
        with only one factor, inconsistent ranks/shapes, or NaN/Inf (message names the module and shapes).
    """
    cfg = read_adapter_config(adapter_dir)
    wpath = Path(adapter_dir) / ADAPTER_WEIGHTS
    tensors = _load_weights(wpath)
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in tensors.items():
        m = _KEY_RE.match(key)
        if m is None:
            raise ValueError(
                f"{wpath}: unsupported tensor {key!r} (only lora_A / lora_B weights of linear layers are supported)"
            )
        pairs.setdefault(m.group("module"), {})[m.group("which")] = arr
    if not pairs:
        raise ValueError(f"{wpath}: no LoRA weights found")
    out: dict[str, LowRank] = {}
    for module in sorted(pairs, key=module_sort_key):
        ab = pairs[module]
        if set(ab) != {"A", "B"}:
            raise ValueError(
                f"module {module!r}: adapter has lora_{'A' if 'A' in ab else 'B'} "
                f"but no lora_{'B' if 'A' in ab else 'A'} ({wpath})"
            )
        A, B = ab["A"], ab["B"]
        if A.ndim != 2 or B.ndim != 2 or B.shape[1] != A.shape[0]:
            raise ValueError(
                f"module {module!r}: lora_B {B.shape} and lora_A {A.shape} are not d_out×r and r×d_in ({wpath})"
            )
        r = int(A.shape[0])
        expected = cfg.rank_for(module)
        if r != expected:
            raise ValueError(
                f"module {module!r}: lora_A has rank {r} but the config (r/rank_pattern) says {expected} ({wpath})"
            )
        s = cfg.scale_for(module, r)
        out[module] = as_lowrank((B * s, A), module)
    return out


def checkpoint_shapes(model_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of a safetensors checkpoint directory (single file or sharded), headers only.

    Reads ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``; no tensor
    data is loaded. FileNotFoundError naming the directory when it holds neither.
    """
    model_dir = Path(model_dir)
    single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        files = [model_dir / f for f in sorted(set(weight_map.values()))]
    else:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors(.index.json) checkpoint")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with open_safetensors(f) as fh:
            for key in fh.keys():
                shapes[key] = tuple(int(x) for x in fh.get_slice(key).get_shape())
    return shapes


def check_adapter_fits(adapter_dir: str | Path, factors: Mapping[str, LowRank], model_dir: str | Path) -> None:
    """Check that every adapted module exists in the checkpoint ``model_dir`` with the task matrix's shape.

    A module ``m`` fits when the checkpoint holds ``m.weight`` of shape (d_out, d_in) = T's shape, or
    (d_in, d_out) for a ``fan_in_fan_out`` adapter (Conv1D). Otherwise a one-line ValueError names the
    adapter, the model, the module and the adapter's ``base_model_name_or_path`` (the usual cause: an
    adapter trained on another base model).
    """
    cfg = read_adapter_config(adapter_dir)
    shapes = checkpoint_shapes(model_dir)
    where = (
        f"adapter {adapter_dir} (trained on {cfg.base_model_name_or_path or 'an unnamed base'}) "
        f"does not fit model {model_dir}"
    )
    for module, lr in factors.items():
        want = tuple(reversed(lr.shape)) if cfg.fan_in_fan_out else tuple(lr.shape)
        have = shapes.get(f"{module}.weight")
        if have is None:
            raise ValueError(f"{where}: module {module!r} is not in the model (no '{module}.weight')")
        if have != want:
            raise ValueError(f"{where}: module {module!r} has weight {have} in the model but {want} in the adapter")


def save_factors(path: str | Path, factors: Mapping[str, Any]) -> None:
    """Write factors as one safetensors file with keys ``<module>.B`` / ``<module>.A`` (float64), atomically.

    All factors are validated (shapes, NaN/Inf) before anything is written.
    """
    lrs = {m: as_lowrank(f, m) for m, f in factors.items()}
    if not lrs:
        raise ValueError(f"{path}: no factors to save")
    arrays: dict[str, np.ndarray] = {}
    for m, lr in lrs.items():
        arrays[f"{m}.B"] = lr.B
        arrays[f"{m}.A"] = lr.A
    save_arrays(path, arrays, metadata={"format": "qrerase-lowrank", "version": "1"})


def load_factors(path: str | Path) -> dict[str, LowRank]:
    """Read a :func:`save_factors` file; modules ordered by block index, then name."""
    arrays = load_arrays(path)
    groups: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in arrays.items():
        module, _, which = key.rpartition(".")
        if which not in ("A", "B") or not module:
            raise ValueError(f"{path}: unexpected key {key!r} (expected '<module>.A' / '<module>.B')")
        groups.setdefault(module, {})[which] = arr
    out = {}
    for module in sorted(groups, key=module_sort_key):
        g = groups[module]
        if set(g) != {"A", "B"}:
            raise ValueError(f"{path}: module {module!r} lacks factor {'A' if 'B' in g else 'B'}")
        out[module] = as_lowrank((g["B"], g["A"]), module)
    return out
