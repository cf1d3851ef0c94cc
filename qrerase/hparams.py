"""Hyperparameter dataclasses: each key declared once, with its description and bounds (standard library only).

A key is a dataclass field made by :func:`hparam` (default, one-line description, simple bounds or
choices); the same declaration gives

* the validation (:func:`check`, called by each class's ``__post_init__``): a one-line
  ``ValueError`` naming the key, ``"<what>: 'lr' must be a finite number > 0, got 0"``;
* the JSON schema of the key (:func:`key_schema`): type, default, description, bounds, enum, which
  :mod:`qrerase.workflow.validation` injects into the config schema (and the generated
  docs/configuration.md shows).

:class:`TrainConfig` holds the keys every training job shares (optimisation and training engine), once.
A baseline job's config is a :class:`TrainingJob`: its ``method``, a :class:`TrainConfig` and the
method's own hyperparameters, an instance of the dataclass it registered
(:func:`qrerase.registry.register_method` ``hparams=``); the job classes of the runner kinds are
:class:`qrerase.baselines.settings.TextBaselineConfig`, :class:`~qrerase.baselines.settings.TaskLevelBaselineConfig`
and :class:`qrerase.speech.settings.SpeechBaselineConfig` (:data:`JOB_CLASSES`).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar

__all__ = [
    "BACKENDS",
    "ENGINE_KEYS",
    "JOB_CLASSES",
    "hparam",
    "check",
    "key_schema",
    "keys_schema",
    "strict",
    "Hparams",
    "NoHparams",
    "TrainConfig",
    "TrainingJob",
    "job_class",
]

#: Multi-process engines of :mod:`qrerase.engine` (config key ``backend``).
BACKENDS = ("ddp", "fsdp")
#: The training-engine keys every training section accepts (schema ``definitions/engine_keys``).
ENGINE_KEYS = ("micro_batch_size", "gradient_checkpointing", "checkpoint_every", "backend")
#: Runner kind (:data:`qrerase.registry.KINDS`) -> its job config class, a :class:`TrainingJob` subclass
#: (imported by name: torch-free modules).
JOB_CLASSES = {
    "text": "qrerase.baselines.settings:TextBaselineConfig",
    "task_level": "qrerase.baselines.settings:TaskLevelBaselineConfig",
    "speech": "qrerase.speech.settings:SpeechBaselineConfig",
}

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
    """``(scalar kind, nullable)`` of a field from its annotation: int, float, bool, str or strs (a
    tuple of strings), ``| None`` for a nullable one."""
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    parts = [p.strip() for p in text.split("|")]
    nullable = "None" in parts
    (base,) = [p for p in parts if p != "None"] or ["None"]
    if base.startswith("tuple[str"):
        return "strs", nullable
    if base not in _SCALARS:
        raise TypeError(f"hparam {f.name!r}: unsupported annotation {text!r} (int, float, bool, str, tuple[str, ...])")
    return base, nullable


def _declared(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "description" in f.metadata]


def _expected(f: dataclasses.Field) -> str:
    kind, nullable = _kind(f)
    meta = f.metadata
    if meta.get("choices"):
        text = f"one of {list(meta['choices'])}"
    else:
        text = {"int": "an integer", "float": "a finite number", "bool": "true or false", "str": "a string"}.get(
            kind, "a non-empty list of strings"
        )
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
    }[kind]
    if ok and kind in ("int", "float"):
        ok = all(
            {"ge": value >= b, "gt": value > b, "le": value <= b, "lt": value < b}[k]
            for k, b in meta.items()
            if k in _BOUNDS
        )
    return ok


def check(obj: Any, what: str) -> None:
    """Validate every declared key of dataclass instance ``obj`` (lists of strings become tuples);
    the first bad one is a ``ValueError`` ``"<what>: '<key>' must be <expected>, got <value>"``."""
    for f in _declared(type(obj)):
        value = getattr(obj, f.name)
        if not _valid(f, value):
            raise ValueError(f"{what}: '{f.name}' must be {_expected(f)}, got {value!r}")
        if _kind(f)[0] == "strs" and isinstance(value, list):
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
    else:
        node = {"type": _SCALARS[kind]}
        node.update({_BOUNDS[k][1]: b for k, b in meta.items() if k in _BOUNDS})
    if nullable:
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
    of the training keys, over its job kind's (:attr:`TrainingJob.train_defaults`)."""

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
    (:func:`qrerase.text.training.train_steps`): ``batch_size`` is the global batch of one optimiser
    step, reached with per-process micro-batches of ``micro_batch_size`` (None: ``batch_size /
    processes``) and gradient accumulation; ``gradient_checkpointing`` recomputes activations in the
    backward pass; ``checkpoint_every`` (steps, 0 = off) saves resumable state; ``backend`` (``ddp`` |
    ``fsdp``, :data:`BACKENDS`) is the multi-process engine.
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

    def __post_init__(self):
        check(self, "training config")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainConfig:
        """Strict construction: unknown keys are a ``ValueError`` naming them."""
        return strict(cls, d, "training config")


TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(TrainConfig))


def _build(cls, values: Mapping[str, Any] | None, label: str):
    """:func:`strict` construction whose validation error is relabelled ``label`` (the job and method)."""
    try:
        return strict(cls, values, label)
    except ValueError as exc:
        _, sep, rest = str(exc).partition(": '")
        raise ValueError(f"{label}: '{rest}" if sep else str(exc)) from None


def job_class(kind: str) -> type[TrainingJob]:
    """The :class:`TrainingJob` subclass of runner ``kind`` (:data:`JOB_CLASSES`)."""
    if kind not in JOB_CLASSES:
        raise ValueError(f"unknown runner kind {kind!r}; expected among {list(JOB_CLASSES)}")
    module, _, attr = JOB_CLASSES[kind].partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class TrainingJob:
    """One baseline job's config: ``method``, ``train`` (the shared :class:`TrainConfig`), ``hparams``
    (an instance of the method's registered dataclass, :func:`qrerase.registry.hparams_of`) and the
    job kind's own keys (a subclass's fields). A shared key reads through: ``cfg.lr`` is ``cfg.train.lr``.

    Class attributes of a subclass: ``kind`` (its runner kind), ``what`` (the error messages' name),
    ``train_defaults`` (its defaults of the required training keys), ``section_train`` (the training
    keys a method's config section may hold), ``section_own`` (its own keys a section may hold),
    ``section_required`` (keys a section must hold), ``section_nullable`` (a null section is allowed).
    A method's hyperparameter class may have ``train_defaults`` too (over the job's).
    """

    method: str
    train: TrainConfig | None = None
    hparams: Any = None

    kind: ClassVar[str] = ""
    what: ClassVar[str] = "baseline config"
    train_defaults: ClassVar[Mapping[str, Any]] = {}
    section_train: ClassVar[tuple[str, ...]] = ()
    section_own: ClassVar[tuple[str, ...]] = ()
    section_required: ClassVar[tuple[str, ...]] = ()
    section_nullable: ClassVar[bool] = False

    def __getattr__(self, name: str) -> Any:
        if name in TRAIN_KEYS and "train" in self.__dict__:
            return getattr(self.__dict__["train"], name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __post_init__(self):
        from . import registry

        known = registry.baselines_of_kind(self.kind)
        if self.method not in known:
            raise ValueError(f"{self.what}: unknown method {self.method!r}; expected one of {known}")
        label = f"{self.what} ({self.method})"
        hp_cls = registry.hparams_of(self.method, self.kind)
        if self.hparams is None or isinstance(self.hparams, Mapping):
            self.hparams = _build(hp_cls, self.hparams, label)
        elif not isinstance(self.hparams, hp_cls):
            raise ValueError(f"{label}: hparams must be a {hp_cls.__name__}, got {type(self.hparams).__name__}")
        if self.train is None or isinstance(self.train, Mapping):
            defaults = {**self.train_defaults, **getattr(hp_cls, "train_defaults", {})}
            self.train = _build(TrainConfig, {**defaults, **(self.train or {})}, label)
        check(self, label)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainingJob:
        """From one flat mapping (a job's settings: ``method``, training keys, the job's own keys and
        the method's hyperparameters); an unknown key is a one-line ``ValueError`` naming it."""
        from . import registry

        d = dict(d)
        if "method" not in d:
            raise ValueError(f"{cls.what}: no 'method' key")
        method = d.pop("method")
        known = registry.baselines_of_kind(cls.kind)
        if method not in known:
            raise ValueError(f"{cls.what}: unknown method {method!r}; expected one of {known}")
        hp_cls = registry.hparams_of(method, cls.kind)
        own = [f.name for f in dataclasses.fields(cls) if f.name not in ("method", "train", "hparams")]
        hp_keys = [f.name for f in dataclasses.fields(hp_cls)]
        allowed = (*TRAIN_KEYS, *own, *hp_keys)
        if unknown := sorted(set(d) - set(allowed)):
            raise ValueError(f"{cls.what} ({method}): unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        pick = lambda names: {k: v for k, v in d.items() if k in names}  # noqa: E731
        return cls(method=method, train=pick(TRAIN_KEYS), hparams=pick(hp_keys), **pick(own))

    @classmethod
    def of(cls, **keys: Any) -> TrainingJob:
        """:meth:`from_dict` of keyword arguments: ``TextBaselineConfig.of(method="npo", lr=1e-3, beta=0.5)``."""
        return cls.from_dict(keys)

    @classmethod
    def section_schema(cls, method: str | None, description: str) -> dict[str, Any]:
        """The JSON schema of method ``method``'s config section for this job kind: the section's
        training keys (engine keys by ``$ref`` to ``definitions/engine_keys``), the job's own section
        keys and the method's hyperparameters, nothing else. ``method`` None: the shared keys only (a
        section common to the kind's methods, ``speech.baselines.common``)."""
        from . import registry

        hp_cls = registry.hparams_of(method, cls.kind) if method is not None else NoHparams
        defaults = {**cls.train_defaults, **getattr(hp_cls, "train_defaults", {})}
        props: dict[str, Any] = {}
        for key in cls.section_train:
            props[key] = (
                {"$ref": f"#/definitions/engine_keys/{key}"}
                if key in ENGINE_KEYS
                else key_schema(
                    TrainConfig, key, MISSING if key in cls.section_required else defaults.get(key, MISSING)
                )
            )
        own = keys_schema(cls)
        props.update({k: own[k] for k in cls.section_own})
        props.update(keys_schema(hp_cls))
        node: dict[str, Any] = {"description": description, "type": "object"}
        if cls.section_nullable and method is not None:
            node["type"] = ["object", "null"]
        node.update(additionalProperties=False, properties=props)
        if cls.section_required and method is not None:
            node["required"] = list(cls.section_required)
        return node
