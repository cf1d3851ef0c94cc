"""A baseline job's config: the shared training keys plus the method's own hyperparameters (torch-free).

:class:`BaselineConfig` composes :class:`qrerase.hparams.TrainConfig` (every training key, declared
once) and an instance of the hyperparameter dataclass its method registered
(:func:`qrerase.registry.hparams_of`). One subclass per runner (:data:`qrerase.registry.JOB_CLASSES`):
:class:`qrerase.baselines.settings.TextBaselineConfig`, :class:`qrerase.tracks.speech.settings.SpeechBaselineConfig`
and those of the runners tracks bring (:class:`qrerase.tracks.base.Runner`). Its
:meth:`BaselineConfig.section_schema` is the JSON schema of a method's config section, and :func:`inject`
expands the schema file's markers for the shared keys (:func:`qrerase.workflow.validation.load_schema`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from typing import Any, ClassVar

from .hparams import ENGINE_KEYS, TRAIN_KEYS, NoHparams, TrainConfig, check, key_schema, keys_schema, strict

__all__ = ["BaselineConfig", "job_class", "section_schemas", "inject", "MARKERS"]

# The functions import qrerase.registry where they use it: the registry imports the method modules, whose
# hyperparameter and job-config modules import this one (a module-level import would be circular).

#: Schema-file markers :func:`inject` expands.
MARKERS = ("x-train-keys", "x-train-properties", "x-job-section")


def _build(cls, values: Mapping[str, Any] | None, label: str):
    """:func:`strict` construction whose validation error is relabelled ``label`` (the job and method)."""
    try:
        return strict(cls, values, label)
    except ValueError as exc:
        _, sep, rest = str(exc).partition(": '")
        raise ValueError(f"{label}: '{rest}" if sep else str(exc)) from None


def job_class(runner: str) -> type[BaselineConfig]:
    """The :class:`BaselineConfig` subclass of runner ``runner`` (:data:`qrerase.registry.JOB_CLASSES`)."""
    from . import registry

    if runner not in registry.JOB_CLASSES:
        raise ValueError(f"unknown runner {runner!r}; expected among {list(registry.JOB_CLASSES)}")
    module, _, attr = registry.JOB_CLASSES[runner].partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class BaselineConfig:
    """One baseline job's config: ``method``, ``train`` (the shared :class:`TrainConfig`), ``hparams``
    (an instance of the method's registered dataclass, :func:`qrerase.registry.hparams_of`) and the
    runner's own keys (a subclass's fields). A shared key reads through: ``cfg.lr`` is ``cfg.train.lr``.

    Class attributes of a subclass: ``runner`` (its runner), ``what`` (the error messages' name),
    ``train_defaults`` (its defaults of the required training keys), ``section_train`` (the training
    keys a method's config section may hold), ``section_own`` (its own keys a section may hold),
    ``section_required`` (keys a section must hold), ``section_nullable`` (a null section is allowed).
    A method's hyperparameter class may have ``train_defaults`` too (over the job's).
    """

    method: str
    train: TrainConfig | None = None
    hparams: Any = None

    runner: ClassVar[str] = ""
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

        known = registry.baselines_of_runner(self.runner)
        if self.method not in known:
            raise ValueError(f"{self.what}: unknown method {self.method!r}; expected one of {known}")
        label = f"{self.what} ({self.method})"
        hp_cls = registry.hparams_of(self.method, self.runner)
        if self.hparams is None or isinstance(self.hparams, Mapping):
            self.hparams = _build(hp_cls, self.hparams, label)
        elif not isinstance(self.hparams, hp_cls):
            raise ValueError(f"{label}: hparams must be a {hp_cls.__name__}, got {type(self.hparams).__name__}")
        if self.train is None or isinstance(self.train, Mapping):
            defaults = {**self.train_defaults, **getattr(hp_cls, "train_defaults", {})}
            self.train = _build(TrainConfig, {**defaults, **(self.train or {})}, label)
        check(self, label)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BaselineConfig:
        """From one flat mapping (a job's settings: ``method``, training keys, the job's own keys and
        the method's hyperparameters); an unknown key is a one-line ``ValueError`` naming it."""
        from . import registry

        d = dict(d)
        if "method" not in d:
            raise ValueError(f"{cls.what}: no 'method' key")
        method = d.pop("method")
        known = registry.baselines_of_runner(cls.runner)
        if method not in known:
            raise ValueError(f"{cls.what}: unknown method {method!r}; expected one of {known}")
        hp_cls = registry.hparams_of(method, cls.runner)
        own = [f.name for f in dataclasses.fields(cls) if f.name not in ("method", "train", "hparams")]
        hp_keys = [f.name for f in dataclasses.fields(hp_cls)]
        allowed = (*TRAIN_KEYS, *own, *hp_keys)
        if unknown := sorted(set(d) - set(allowed)):
            raise ValueError(f"{cls.what} ({method}): unknown key(s) {unknown}; allowed: {sorted(allowed)}")
        pick = lambda names: {k: v for k, v in d.items() if k in names}  # noqa: E731
        return cls(method=method, train=pick(TRAIN_KEYS), hparams=pick(hp_keys), **pick(own))

    @classmethod
    def of(cls, **keys: Any) -> BaselineConfig:
        """:meth:`from_dict` of keyword arguments: ``TextBaselineConfig.of(method="npo", lr=1e-3, beta=0.5)``."""
        return cls.from_dict(keys)

    @classmethod
    def section_schema(cls, method: str | None, description: str) -> dict[str, Any]:
        """The JSON schema of method ``method``'s config section for this runner: the section's
        training keys (engine keys by ``$ref`` to ``definitions/engine_keys``), the job's own section
        keys and the method's hyperparameters, nothing else. ``method`` None: the shared keys only (a
        section common to the runner's methods, ``speech.baselines.common``)."""
        from . import registry

        hp_cls = registry.hparams_of(method, cls.runner) if method is not None else NoHparams
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


def section_schemas(section: str) -> dict[str, dict[str, Any]]:
    """Method name -> the schema of its ``<section>.<method>`` entry, in registry order: generated for a
    section of :data:`qrerase.registry.HPARAM_SECTIONS`, else as registered (:func:`qrerase.registry.settings_of`)."""
    from . import registry

    if section not in registry.HPARAM_SECTIONS:
        return dict(registry.settings_of(section))
    runner = registry.HPARAM_SECTIONS[section]
    job = job_class(runner)
    return {m: job.section_schema(m, registry.method(m).description) for m in registry.baselines_of_runner(runner)}


def _train_key(key: str, ref: bool) -> dict:
    """A shared training key's schema (no default: a training section inherits); an engine key as a
    ``$ref`` to ``definitions/engine_keys`` when ``ref``."""
    if ref and key in ENGINE_KEYS:
        return {"$ref": f"#/definitions/engine_keys/{key}"}
    node = key_schema(TrainConfig, key)
    node.pop("default", None)
    return node


def inject(node: Mapping[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """``out`` (schema node ``node`` without its markers) with the shared keys of ``node``'s markers:
    ``x-train-keys: [...]`` as children, ``x-train-properties: [...]`` as properties (engine keys by
    ``$ref``), ``x-job-section: <runner>`` as a runner's shared job section (no method's keys)."""
    for key in node.get("x-train-keys", ()):
        out[key] = _train_key(key, ref=False)
    if "x-train-properties" in node:
        out.setdefault("properties", {}).update({k: _train_key(k, ref=True) for k in node["x-train-properties"]})
    if "x-job-section" in node:
        out = {**job_class(node["x-job-section"]).section_schema(None, out.get("description", "")), **out}
    return out
