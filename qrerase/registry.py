"""The method and track registry: every unlearning method and experiment track, with its implementation.

Each method is registered once (:func:`register_method`, duplicate names rejected) with its
implementation per runner, the tracks it serves and its own hyperparameters (``hparams=``).
Everything else is derived from it: the config schema's method and track enums and the methods'
config sections (from the shared training keys and its hyperparameters:
:func:`qrerase.baseline_config.section_schemas`), the job configs
(:class:`qrerase.baseline_config.BaselineConfig`), the workflow's ``DECOMP`` and localised-method logic
(``rules/common.smk``), the table labels (:data:`qrerase.reports.tables.METHOD_LABELS`), each track's
target function (``all_targets`` in ``rules/common.smk``) and the dispatch of every baseline job
(:func:`implementation`, called by :func:`qrerase.baselines.text.train_baseline` and by the runners the
tracks bring, :attr:`qrerase.tracks.Track.runner_spec`).

Standard library only, so planning code (``rules/common.smk``, the schema) never imports torch. A
method's module registers it when imported (the built-in text baselines: :data:`qrerase.baselines.MODULES`;
a track's: :attr:`qrerase.tracks.Track.methods`) and is torch-free at import: an implementation is a
class or function whose torch imports are inside it, or a ``"module:attribute"`` string imported on
first use. A plug-in module registers its own methods when imported; the workflow imports the modules
of the config key ``plugins`` (:func:`load_plugins`). docs/extending.md: adding a method, adding a track.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .hparams import NoHparams, hparams_problem
from .tracks.base import TRACKS, Runner, Track  # the tracks, one module or folder each (qrerase/tracks/<name>)

__all__ = [
    "Method",
    "Track",
    "RegistryError",
    "METHODS",
    "TRACKS",
    "RUNNERS",
    "JOB_CLASSES",
    "INPUTS",
    "SETTINGS_SECTIONS",
    "runner_track",
    "HPARAM_SECTIONS",
    "DECOMPOSITIONS",
    "DECOMP",
    "SUBSPACE_METHODS",
    "REFERENCE_LABELS",
    "RANK_PAIRS",
    "CONTROL_SUFFIX",
    "register_method",
    "extend_method",
    "load_plugins",
    "names",
    "method",
    "implementation",
    "methods_for",
    "baselines_for",
    "baselines_of_runner",
    "required_section",
    "settings_of",
    "hparams_of",
    "is_localised",
    "global_method",
    "method_labels",
    "tex_method_labels",
]

Impl = str | Callable[..., Any]


class RegistryError(ValueError):
    """A bad registration or an unknown method / track: the message is one line naming it."""


#: Runners: what a baseline's implementation of that runner is called with. Each is brought by a track
#: (:attr:`Track.runner_spec`: the text runner by the TOFU track, the speech runner by the speech track, ...)
#: and added here with its tables below when the registry is imported.
RUNNERS: dict[str, str] = {}
#: Config sections holding one entry per method (``<section>.<method>``), by the runner of the tracks whose
#: methods need one (schema: generated for :data:`HPARAM_SECTIONS`, else the method's :attr:`Method.settings`).
SETTINGS_SECTIONS: dict[str, str] = {}
#: The sections whose entry is a job of that runner (schema: :func:`qrerase.baseline_config.section_schemas`); the
#: others hold what a method registers (``settings=``), e.g. a trade-off sweep's parameter and values.
HPARAM_SECTIONS: dict[str, str] = {}
#: Runner -> its job config class, a :class:`qrerase.baseline_config.BaselineConfig` subclass (``"module:Class"``:
#: torch-free).
JOB_CLASSES: dict[str, str] = {}
#: Extra inputs a baseline job may read, beyond its track's data and fine-tuned model.
INPUTS: dict[str, str] = {}
#: Sections whose entry a method listed in a track of that runner must have (the others are optional).
_REQUIRED_SECTIONS: dict[str, str] = {}
#: Runner -> the track that brings it: the default track of a method registered for that runner.
_HOME: dict[str, str] = {}


def _add_runner(name: str, spec: Runner, track: str) -> None:
    """Add the runner that ``track`` brings (:attr:`Track.runner_spec`) to the tables above."""
    if name in RUNNERS:
        raise RegistryError(f"runner {name!r} is already registered")
    RUNNERS[name] = spec.description
    _HOME[name] = track
    JOB_CLASSES[name] = spec.job_class
    SETTINGS_SECTIONS[spec.section] = HPARAM_SECTIONS[spec.section] = name
    SETTINGS_SECTIONS.update({s: name for s in spec.sweep_sections})
    if spec.required:
        _REQUIRED_SECTIONS[name] = spec.section
    if clash := [i for i in spec.inputs if i in INPUTS]:
        raise RegistryError(f"runner {name!r}: input(s) {clash} are already registered")
    INPUTS.update(spec.inputs)


for _track in TRACKS.values():
    if _track.runner_spec is not None:
        _add_runner(_track.runner, _track.runner_spec, _track.name)


@dataclass(frozen=True)
class Method:
    """One unlearning method.

    name: the config and path name. decomp: ``'svd'`` (UNLEARN) or ``'cpqr'`` (QR-Erase) for a
    closed-form subspace method (eqs. 1-6), ``None`` for an optimisation baseline. localised: the
    edit touches only the layers selected by task energy (eqs. 14-16, the ``(LL)`` variants).
    label / tex_label: the table row label (Markdown, CSV, plots) and the LaTeX one (``None``: the
    escaped ``label``). tracks: the tracks whose ``methods.<track>`` may list it. run: runner
    (:data:`RUNNERS`) -> implementation, a callable or a lazily imported ``"module:attribute"``; a
    baseline has one for the runner of each of its tracks. hparams: runner -> its own hyperparameters'
    dataclass (or ``"module:Class"``, :func:`hparams_of`). description: its config sections'. settings:
    section outside :data:`HPARAM_SECTIONS` -> the JSON schema of its ``<section>.<name>`` entry.
    inputs: extra inputs its baseline jobs read (:data:`INPUTS`). plan_shape: ``(sequences per
    example, frozen model copies)`` of its training job for the memory plan
    (:mod:`qrerase.workflow.plan_config`); ``None``: the plan leaves it out.
    """

    name: str
    decomp: str | None
    localised: bool
    label: str
    tex_label: str | None
    tracks: tuple[str, ...]
    run: Mapping[str, Impl] = field(default_factory=dict)
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()
    plan_shape: tuple[int, int] | None = None
    hparams: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def subspace(self) -> bool:
        return self.decomp is not None


#: The decompositions, in report order: column-pivoted QR (QR-Erase) and SVD (UNLEARN).
DECOMPOSITIONS: tuple[str, ...] = ("cpqr", "svd")
#: '<method>_control': the same edit built with the adapters' roles swapped (selectivity control).
CONTROL_SUFFIX = "_control"
#: Rows that are no method: the fine-tuned model and the retain-only reference.
REFERENCE_LABELS: dict[str, str] = {"base": "Base Model", "retain": "Retain reference"}

_METHODS: dict[str, Method] = {}
_BUILTIN_DONE = False


def register_method(
    name: str,
    *,
    label: str,
    run: Impl | Mapping[str, Impl],
    tracks: Iterable[str] | None = None,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    inputs: Iterable[str] = (),
    plan_shape: tuple[int, int] | None = None,
    decomp: str | None = None,
    localised: bool = False,
    tex_label: str | None = None,
    hparams: type | str | Mapping[str, type | str] | None = None,
    description: str | None = None,
) -> Method:
    """Register one method (in table order: registration order) and return its record.

    ``run``: its implementation per runner (:data:`RUNNERS`); a single callable or string serves
    every runner of its tracks. ``tracks``: the tracks whose ``methods.<track>`` may list it; default: the
    track that brings each runner of ``run`` (``{"text": ...}``: the TOFU track; the cross-lingual track
    adds the built-in text baselines to itself). ``hparams``: the :class:`qrerase.hparams.Hparams` dataclass of its own
    hyperparameters (default none), for every runner or per runner; its config sections
    (:data:`HPARAM_SECTIONS`, described by ``description``) and job configs derive from it. Rejected
    with a :class:`RegistryError` naming the problem: a name already registered, an unknown track,
    runner or settings section, a baseline without an implementation for one of its tracks' runners, a
    settings schema for a generated section, a bad hyperparameter dataclass, a subspace method
    registered after the built-in ones (a new decomposition is not a plug-in).
    """
    if not name.isidentifier() or name.endswith(CONTROL_SUFFIX) or name in REFERENCE_LABELS:
        raise RegistryError(f"method name {name!r}: expected an identifier, not a reference row or '*{CONTROL_SUFFIX}'")
    if name in _METHODS:
        raise RegistryError(f"method {name!r} is already registered (label {_METHODS[name].label!r})")
    if tracks is None:
        if not isinstance(run, Mapping) or (bad := [k for k in run if k not in _HOME]):
            raise RegistryError(
                f"method {name!r}: give its tracks, or run={{runner: implementation}} with runners among {list(_HOME)}"
            )
        tracks = dict.fromkeys(_HOME[k] for k in run)
    tracks = tuple(tracks)
    unknown = [t for t in tracks if t not in TRACKS]
    if not tracks or unknown:
        raise RegistryError(f"method {name!r}: tracks must be among {list(TRACKS)}, got {list(tracks)}")
    runners = list(dict.fromkeys(TRACKS[t].runner for t in tracks))
    run_map = dict(run) if isinstance(run, Mapping) else {k: run for k in runners}
    if decomp is not None:
        if _BUILTIN_DONE or decomp not in DECOMPOSITIONS:
            raise RegistryError(f"method {name!r}: only the built-in subspace methods have a decomposition")
    elif missing := [k for k in runners if k not in run_map]:
        raise RegistryError(f"method {name!r}: no implementation for the {missing} runner of its tracks {list(tracks)}")
    if bad := [k for k in run_map if k not in RUNNERS]:
        raise RegistryError(f"method {name!r}: unknown runner(s) {bad}; expected among {list(RUNNERS)}")
    settings = dict(settings or {})
    if bad := [s for s in settings if s not in SETTINGS_SECTIONS]:
        raise RegistryError(
            f"method {name!r}: unknown settings section(s) {bad}; expected among {list(SETTINGS_SECTIONS)}"
        )
    if generated := [s for s in settings if s in HPARAM_SECTIONS]:
        raise RegistryError(f"method {name!r}: section(s) {generated} are generated from its hparams, not settings=")
    hp_map: dict[str, Any] = {}
    if decomp is None:
        given: dict[str, Any] = dict(hparams) if isinstance(hparams, Mapping) else {k: hparams for k in run_map}
        if bad := [k for k in given if k not in run_map]:
            raise RegistryError(f"method {name!r}: hparams for runner(s) {bad} it has no implementation of")
        hp_map = {k: given.get(k) or NoHparams for k in run_map}
        for hp in hp_map.values():
            if not isinstance(hp, str) and (problem := hparams_problem(hp)):
                raise RegistryError(f"method {name!r}: {problem}")
    elif hparams is not None:
        raise RegistryError(f"method {name!r}: a subspace method has no hparams")
    inputs = tuple(inputs)
    if bad := [i for i in inputs if i not in INPUTS]:
        raise RegistryError(f"method {name!r}: unknown input(s) {bad}; expected among {list(INPUTS)}")
    m = Method(
        name,
        decomp,
        localised,
        label,
        tex_label,
        tracks,
        MappingProxyType(run_map),
        MappingProxyType({k: MappingProxyType(dict(v)) for k, v in settings.items()}),
        inputs,
        None if plan_shape is None else (int(plan_shape[0]), int(plan_shape[1])),
        MappingProxyType(hp_map),
        description or label,
    )
    _METHODS[name] = m
    return m


def extend_method(
    name: str,
    *,
    tracks: Iterable[str],
    run: Mapping[str, Impl],
    settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> Method:
    """Add tracks to a registered baseline, with its implementation for each runner they bring (a track's
    ``methods`` module: its runner's Gradient Ascent); the method keeps its place in the table order and
    takes no hyperparameters for the new runners; ``settings`` as in :func:`register_method`.
    :class:`RegistryError` for an unknown method or track, a subspace method, a track it serves
    already or a runner without an implementation."""
    m = method(name)
    tracks = tuple(tracks)
    if m.subspace:
        raise RegistryError(f"method {name!r}: a subspace method serves every track")
    if bad := [t for t in tracks if t not in TRACKS or t in m.tracks]:
        raise RegistryError(f"method {name!r}: cannot add track(s) {bad} (it has {list(m.tracks)})")
    runners = {TRACKS[t].runner for t in tracks} - set(m.run)
    if missing := sorted(runners - set(run)):
        raise RegistryError(f"method {name!r}: no implementation for the {missing} runner of tracks {list(tracks)}")
    if bad := [k for k in run if k not in RUNNERS or k in m.run]:
        raise RegistryError(f"method {name!r}: runner(s) {bad} unknown or implemented already")
    settings = dict(settings or {})
    if bad := [s for s in settings if s not in SETTINGS_SECTIONS or s in HPARAM_SECTIONS or s in m.settings]:
        raise RegistryError(f"method {name!r}: settings section(s) {bad} unknown, generated or given already")
    _METHODS[name] = replace(
        m,
        tracks=(*m.tracks, *tracks),
        run=MappingProxyType({**m.run, **run}),
        settings=MappingProxyType({**m.settings, **{k: MappingProxyType(dict(v)) for k, v in settings.items()}}),
        hparams=MappingProxyType({**m.hparams, **{k: NoHparams for k in run}}),
    )
    return _METHODS[name]


def hparams_of(name: str, runner: str) -> type:
    """The hyperparameter dataclass method ``name`` registered for runner ``runner`` (a ``"module:Class"``
    string is imported and checked now); :class:`RegistryError` for an unknown method or runner."""
    m = method(name)
    if runner not in m.hparams:
        raise RegistryError(f"method {name!r} has no {runner!r} hyperparameters (it has: {list(m.hparams)})")
    hp = _load(name, "hparams", m.hparams[runner])
    if problem := hparams_problem(hp):
        raise RegistryError(f"method {name!r}: {problem}")
    return hp


def _load(name: str, what: str, ref: Any) -> Any:
    """``ref`` itself, or the attribute a ``"module:attribute"`` string names (imported now)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"method {name!r}: {what} {ref!r} cannot be loaded ({exc})") from None


def load_plugins(modules: Iterable[str]) -> None:
    """Import each plug-in module (the config key ``plugins``); importing one registers its methods.
    A module imported before is not run again; one that cannot be imported is a :class:`RegistryError`."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise RegistryError(f"plugin {module!r}: cannot be imported ({exc})") from None


def names() -> tuple[str, ...]:
    """Every registered method name (built-in and plug-in), in registry order."""
    return tuple(_METHODS)


def method(name: str) -> Method:
    """The registry entry of a method name; :class:`RegistryError` (a KeyError too) for an unknown one."""
    try:
        return _METHODS[name]
    except KeyError:
        raise _Unknown(f"unknown method {name!r}; registered: {list(_METHODS)}") from None


class _Unknown(RegistryError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def implementation(name: str, runner: str) -> Callable[..., Any]:
    """The implementation of method ``name`` for runner ``runner`` (a ``"module:attribute"`` string is
    imported now); :class:`RegistryError` for an unknown method or one without that runner."""
    m = method(name)
    if runner not in m.run:
        raise RegistryError(f"method {name!r} has no {runner!r} implementation (it has: {list(m.run)})")
    return _load(name, "implementation", m.run[runner])


def methods_for(track: str) -> list[str]:
    """The method names a track's ``methods.<track>`` may list, in registry order."""
    if track not in TRACKS:
        raise KeyError(f"unknown track {track!r}")
    return [m.name for m in _METHODS.values() if track in m.tracks]


def baselines_for(track: str) -> list[str]:
    """A track's optimisation baselines (its methods without a decomposition)."""
    return [m for m in methods_for(track) if _METHODS[m].decomp is None]


def runner_track(runner: str) -> str:
    """The track that brings ``runner`` (:attr:`qrerase.tracks.Track.runner_spec`); :class:`RegistryError` for
    an unknown runner."""
    if runner not in _HOME:
        raise RegistryError(f"unknown runner {runner!r}; expected among {list(_HOME)}")
    return _HOME[runner]


def baselines_of_runner(runner: str) -> list[str]:
    """The baselines with an implementation for runner ``runner`` (:data:`RUNNERS`), in registry order."""
    if runner not in RUNNERS:
        raise RegistryError(f"unknown runner {runner!r}; expected among {list(RUNNERS)}")
    return [m.name for m in _METHODS.values() if m.decomp is None and runner in m.run]


def settings_of(section: str) -> dict[str, Mapping[str, Any]]:
    """Method name -> the JSON schema of its ``<section>.<name>`` config entry, in registry order, as
    registered (``settings=``); the entries of :data:`HPARAM_SECTIONS` are generated instead
    (:func:`qrerase.baseline_config.section_schemas`)."""
    if section not in SETTINGS_SECTIONS:
        raise RegistryError(f"unknown settings section {section!r}; expected among {list(SETTINGS_SECTIONS)}")
    return {m.name: m.settings[section] for m in _METHODS.values() if section in m.settings}


def required_section(track: str) -> str | None:
    """The config section where a baseline listed in ``methods.<track>`` must have its entry."""
    return _REQUIRED_SECTIONS.get(TRACKS[track].runner)


def is_localised(name: str) -> bool:
    """True for a layer-localised subspace method (or its control): eq. 16 on the selected layers."""
    return method(name.removesuffix(CONTROL_SUFFIX)).localised


def global_method(decomp: str) -> str:
    """The all-layer subspace method of a decomposition: 'cpqr' -> 'qr_erase', 'svd' -> 'unlearn'."""
    (name,) = [m.name for m in _METHODS.values() if m.decomp == decomp and not m.localised]
    return name


def method_labels() -> dict[str, str]:
    """Raw key -> display label: every method, the reference rows, each subspace method's control."""
    ms = list(_METHODS.values())
    labels = {m.name: m.label for m in ms if m.subspace}
    labels.update(REFERENCE_LABELS)
    labels.update({m.name: m.label for m in ms if not m.subspace})
    labels.update({f"{m.name}{CONTROL_SUFFIX}": f"{m.label}, retain-adapter control" for m in ms if m.subspace})
    return labels


def tex_method_labels() -> dict[str, str]:
    """Raw key -> LaTeX label, for the methods typeset specially in the paper (others: escaped label)."""
    return {m.name: m.tex_label for m in _METHODS.values() if m.tex_label is not None}


# ---------------------------------------------------------------------------------------------------
# The built-in methods, in table order: the subspace methods, then the baselines of each track.
# ---------------------------------------------------------------------------------------------------
_ALL = tuple(TRACKS)
_SUBSPACE = "qrerase.method.discriminate:forget_updates"  # T_f, T_r -> the forget update (eqs. 1-6)

for _name, _decomp, _ll, _label, _tex in (
    ("unlearn", "svd", False, "UNLEARN", r"\textsc{UNLEARN}"),
    ("unlearn_ll", "svd", True, "UNLEARN (LL)", r"\textsc{UNLEARN (LL)}"),
    ("qr_erase", "cpqr", False, "QR-Erase", r"\textsc{QR-Erase}"),
    ("qr_erase_ll", "cpqr", True, "QR-Erase (LL)", r"\textsc{QR-Erase} (LL)"),
):
    register_method(_name, label=_label, tex_label=_tex, tracks=_ALL, run=_SUBSPACE, decomp=_decomp, localised=_ll)
# The baselines, each registered by keyword next to its implementation, in table order: the text
# baselines, the speech ones, then those of the tracks that bring their own (Track.methods: KGA, KU).
for _module in importlib.import_module("qrerase.baselines").MODULES:
    importlib.import_module(f"qrerase.baselines.{_module}")
for _track in tuple(TRACKS.values()):
    if _track.methods is not None:
        importlib.import_module(_track.methods)
_BUILTIN_DONE = True

#: The built-in methods, in table order (plug-ins: :func:`method`, :func:`methods_for`).
METHODS: tuple[Method, ...] = tuple(_METHODS.values())
#: subspace method -> its decomposition.
DECOMP: dict[str, str] = {m.name: m.decomp for m in METHODS if m.decomp is not None}
SUBSPACE_METHODS: tuple[str, ...] = tuple(DECOMP)
#: (decomposition, its all-layer method) in report order: the rank sweep's two curves (speech track).
RANK_PAIRS: tuple[tuple[str, str], ...] = tuple((d, global_method(d)) for d in DECOMPOSITIONS)
