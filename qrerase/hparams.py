"""Hyperparameter dataclasses: each key declared once, with its description and bounds (standard library only).

A key is a dataclass field made by :func:`hparam` (default, one-line description, simple bounds or
choices); the same declaration gives

* the validation (:func:`check`, called by each class's ``__post_init__``): a one-line
  ``ValueError`` naming the key, ``"<what>: 'lr' must be a finite number > 0, got 0"``;
* the JSON schema of the key (:func:`key_schema`): type, default, description, bounds, enum, which
  :mod:`qrerase.workflow.validation` injects into the config schema (and the generated
  docs/configuration.md shows).

:class:`TrainConfig` holds the keys every training job shares (optimisation and training engine), once.
A method's own hyperparameters are an :class:`Hparams` dataclass it registers
(:func:`qrerase.registry.register_method` ``hparams=``). A baseline job's config composes both
(:class:`qrerase.baseline_config.BaselineConfig`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

__all__ = [
    "BACKENDS",
    "ENGINE_KEYS",
    "hparam",
    "check",
    "key_schema",
    "keys_schema",
    "strict",
    "Hparams",
    "NoHparams",
    "TrainConfig",
    "TRAIN_KEYS",
    "hparams_problem",
]

#: Multi-process engines of :mod:`qrerase.engine` (config key ``backend``).
BACKENDS = ("ddp", "fsdp")
#: The training-engine keys every training section accepts (schema ``definitions/engine_keys``).
ENGINE_KEYS = ("micro_batch_size", "gradient_checkpointing", "checkpoint_every", "backend", "dist_timeout_min")
_BOUNDS = {
    "ge": (">=", "minimum"),
    "gt": (">", "exclusiveMinimum"),
    "le": ("<=", "maximum"),
    "lt": ("<", "exclusiveMaximum"),
}
_SCALARS = {"int": "integer", "float": "number", "bool": "boolean", "str": "string"}


def hparam(
    default: Any = MISSING,
    description: str = "",
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple | None = None,
) -> Any:
    """A declared key: a dataclass field with its ``description`` (the schema's and the docs') and its
    bounds (``ge`` / ``gt`` / ``le`` / ``lt``: >=, >, <=, <) or ``choices``. No ``default``: required."""
    if not description:
        raise ValueError("hparam: every key needs a description")
    meta = {"description": description, "choices": tuple(choices) if choices is not None else None}
    meta.update({k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None})
    return field(default=default, metadata=meta)


def _kind(f: dataclasses.Field) -> tuple[str, bool]:
    """``(scalar kind, nullable)`` of a field from its annotation: int, float, bool, str, strs (a
    tuple of strings) or ints (a tuple of integers, each within the key's bounds), ``| None`` for a
    nullable one."""
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    parts = [p.strip() for p in text.split("|")]
    nullable = "None" in parts
    (base,) = [p for p in parts if p != "None"] or ["None"]
    if base.startswith("tuple[str"):
        return "strs", nullable
    if base.startswith("tuple[int"):
        return "ints", nullable
    if base not in _SCALARS:
        raise TypeError(
            f"hparam {f.name!r}: unsupported annotation {text!r} "
            "(int, float, bool, str, tuple[str, ...], tuple[int, ...])"
        )
    return base, nullable


def _declared(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "description" in f.metadata]


def _expected(f: dataclasses.Field) -> str:
    kind, nullable = _kind(f)
    meta = f.metadata
    if meta.get("choices"):
        text = f"one of {list(meta['choices'])}"
    else:
        text = {
            "int": "an integer",
            "float": "a finite number",
            "bool": "true or false",
            "str": "a string",
            "ints": "a non-empty list of integers, each",
        }.get(kind, "a non-empty list of strings")
        lo = next(((k, meta[k]) for k in ("ge", "gt") if k in meta), None)
        hi = next(((k, meta[k]) for k in ("le", "lt") if k in meta), None)
        if lo and hi:
            text += f" in {'[' if lo[0] == 'ge' else '('}{lo[1]}, {hi[1]}{']' if hi[0] == 'le' else ')'}"
        elif lo or hi:
            k, bound = lo or hi
            text += f" {_BOUNDS[k][0]} {bound}"
    return text + (" or null" if nullable else "")


def _valid(f: dataclasses.Field, value: Any) -> bool:
    kind, nullable = _kind(f)
    if value is None:
        return nullable
    meta = f.metadata
    if meta.get("choices"):
        return value in meta["choices"]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": number and math.isfinite(value),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "strs": isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, str) for v in value),
        "ints": isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
    }[kind]
    if ok and kind in ("int", "float", "ints"):  # a list's bounds hold for each element
        ok = all(
            {"ge": v >= b, "gt": v > b, "le": v <= b, "lt": v < b}[k]
            for v in (value if kind == "ints" else (value,))
            for k, b in meta.items()
            if k in _BOUNDS
        )
    return ok


def check(obj: Any, what: str) -> None:
    """Validate every declared key of dataclass instance ``obj`` (lists of strings / integers become tuples);
    the first bad one is a ``ValueError`` ``"<what>: '<key>' must be <expected>, got <value>"``."""
    for f in _declared(type(obj)):
        value = getattr(obj, f.name)
        if not _valid(f, value):
            raise ValueError(f"{what}: '{f.name}' must be {_expected(f)}, got {value!r}")
        if _kind(f)[0] in ("strs", "ints") and isinstance(value, list):
            setattr(obj, f.name, tuple(value))


def strict(cls, values: Mapping[str, Any] | None, what: str, allowed: tuple[str, ...] | None = None):
    """``cls(**values)``, unknown keys (not fields of ``cls``, or not in ``allowed`` when given) a
    one-line ``ValueError`` naming them and the allowed keys."""
    values = dict(values or {})
    names = list(allowed) if allowed is not None else [f.name for f in dataclasses.fields(cls)]
    if unknown := sorted(set(values) - set(names)):
        raise ValueError(f"{what}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    required = [f.name for f in dataclasses.fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    if missing := [k for k in required if k not in values]:
        raise ValueError(f"{what}: missing key(s) {missing}")
    return cls(**values)


def key_schema(cls, name: str, default: Any = MISSING) -> dict[str, Any]:
    """The JSON schema of declared key ``name`` of ``cls``: type (``null`` too for a nullable one),
    bounds or enum, description, and default (``default`` given, else the field's own)."""
    (f,) = [f for f in _declared(cls) if f.name == name] or [None]
    if f is None:
        raise KeyError(f"{cls.__name__} declares no key {name!r}")
    kind, nullable = _kind(f)
    meta = f.metadata
    if meta.get("choices"):
        node: dict[str, Any] = {"enum": list(meta["choices"])}
    elif kind == "strs":
        node = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    elif kind == "ints":
        item = {"type": "integer", **{_BOUNDS[k][1]: b for k, b in meta.items() if k in _BOUNDS}}
        node = {"type": "array", "items": item, "minItems": 1}
    else:
        node = {"type": _SCALARS[kind]}
        node.update({_BOUNDS[k][1]: b for k, b in meta.items() if k in _BOUNDS})
    if nullable and node.get("type") == "array":  # one node: a bad element is named by its index (key.0)
        node["type"] = ["array", "null"]
    elif nullable:
        node = {"oneOf": [{"type": "null"}, node]}
    node["description"] = meta["description"]
    default = f.default if default is MISSING else default
    if default is not MISSING:
        node["default"] = list(default) if isinstance(default, tuple) else default
    return node


def keys_schema(cls, defaults: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Key -> :func:`key_schema` of every declared key of ``cls``, in declaration order."""
    defaults = defaults or {}
    return {f.name: key_schema(cls, f.name, defaults.get(f.name, MISSING)) for f in _declared(cls)}


@dataclass
class Hparams:
    """Base of a method's hyperparameter dataclass: its fields are :func:`hparam` keys, validated on
    construction (:func:`check`). ``train_defaults`` (a class attribute, optional): the method's defaults
    of the training keys, over its job kind's (:attr:`BaselineConfig.train_defaults`)."""

    train_defaults: ClassVar[Mapping[str, Any]] = {}

    def __post_init__(self):
        check(self, f"{type(self).__name__}")


@dataclass
class NoHparams(Hparams):
    """A method without hyperparameters of its own (Gradient Ascent)."""


@dataclass
class TrainConfig:
    """The keys every training job shares: optimisation and training engine (the only declaration).

    ``lr`` is the peak learning rate (reached after ``warmup_ratio`` of the steps, then decayed
    linearly to 0); ``weight_decay`` applies to matrices only (not to norms/biases), as in HF
    ``Trainer``; ``max_grad_norm <= 0`` disables clipping; ``max_length`` caps the tokens per
    example (answers are truncated); ``threads`` is passed to ``torch.set_num_threads``. Engine
    (:func:`qrerase.engine.train_steps`): ``batch_size`` is the global batch of one optimiser
    step, reached with per-process micro-batches of ``micro_batch_size`` (None: ``batch_size /
    processes``) and gradient accumulation; ``gradient_checkpointing`` recomputes activations in the
    backward pass; ``checkpoint_every`` (steps, 0 = off) saves resumable state; ``backend`` (``ddp`` |
    ``fsdp``, :data:`BACKENDS`) is the multi-process engine; ``dist_timeout_min`` is how long a
    collective of a multi-process job may wait (its process group's timeout).
    """

    epochs: int = hparam(description="passes over the training data (a baseline: over its forget set)", ge=1)
    lr: float = hparam(description="peak learning rate", gt=0)
    batch_size: int = hparam(description="examples per optimiser step (the global batch)", ge=1)
    weight_decay: float = hparam(0.0, "AdamW weight decay (matrices only)", ge=0)
    warmup_ratio: float = hparam(0.0, "share of the optimiser steps with a linear learning-rate warm-up", ge=0, le=1)
    max_grad_norm: float = hparam(1.0, "gradient-norm clip; 0 = no clipping", ge=0)
    max_length: int = hparam(128, "tokens per example (longer examples are truncated)", ge=2)
    seed: int = hparam(0, "the run's seed (batches, initialisation)", ge=0)
    threads: int = hparam(2, "torch threads of the job", ge=1)
    micro_batch_size: int | None = hparam(
        None,
        "examples per process and forward/backward pass; batch_size (the global batch of one optimiser step) is "
        "reached by gradient accumulation over processes x micro-batches; null = the memory plan's pick: on a GPU "
        "the largest power of two of the per-process share batch_size / processes that fits resources.gpu_mem_gb, "
        "on the CPU the whole share (qrerase plan)",
        ge=1,
    )
    gradient_checkpointing: bool = hparam(
        False,
        "recompute activations in the backward pass (model.gradient_checkpointing_enable) to save memory; absent: "
        "the track's fine-tuning section's (false when that has none)",
    )
    checkpoint_every: int = hparam(
        0,
        "save resumable training state (Accelerate save_state: weights, optimiser, scheduler, RNG, step) every this "
        "many optimiser steps under results/.resume/<rule>/<job>; a restarted job with the same job spec, inputs and "
        "training code continues from its newest state that passes its checksums (docs/recovery.md); 0 = off",
        ge=0,
    )
    backend: str = hparam(
        "ddp",
        "multi-process engine when the job runs on several processes: ddp (Accelerate DDP), fsdp (FSDP2: "
        "parameters, gradients and optimiser states sharded); DeepSpeed was removed until it can be tested "
        "(docs/training-engine.md)",
        choices=BACKENDS,
    )
    dist_timeout_min: int = hparam(
        60,
        "minutes a collective of a multi-process job may wait for the other processes before the job fails "
        "(the NCCL / gloo process-group timeout, Accelerate InitProcessGroupKwargs); 60 covers rank 0 alone reading "
        "a 70B checkpoint (about 140 GB at 0.1-0.5 GB/s from a shared file system) while the other ranks wait in the "
        "broadcast, and the checksum check of a resume state; torch's 10-minute NCCL default does not",
        ge=1,
    )

    def __post_init__(self):
        check(self, "training config")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Strict construction: unknown keys are a ``ValueError`` naming them."""
        return strict(cls, d, "training config")


TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def hparams_problem(cls: Any) -> str | None:
    """Why ``cls`` is no method hyperparameter dataclass (None when it is one): it must derive from
    :class:`Hparams`, every field a :func:`hparam` key of a supported type, none named like a shared
    job key (:data:`TRAIN_KEYS`, a job's ``method`` / ``train`` / ``hparams``, ``mode`` and LoRA keys)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and issubclass(cls, Hparams)):
        return f"hparams {cls!r} is not a dataclass derived from qrerase.hparams.Hparams"
    shared = {*TRAIN_KEYS, "method", "train", "hparams", "mode", "lora_r", "lora_alpha", "lora_dropout"}
    for f in dataclasses.fields(cls):
        if f.name in shared or f.name.endswith("target_modules"):
            return f"hyperparameter {f.name!r} clashes with a shared job key"
        try:
            key_schema(cls, f.name)
        except (KeyError, TypeError) as exc:
            return f"hyperparameter {f.name!r} is no hparam() key ({exc})"
    return None
