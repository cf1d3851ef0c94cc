"""The :class:`Track` class and the track registry (:data:`TRACKS`, :func:`register_track`, :func:`track`).

Standard library only, and no import of the planning code (``qrerase.workflow`` imports this module;
a track module's method that needs planning code imports it when called). The package
(:mod:`qrerase.tracks`) imports the built-in track modules, which register their tracks.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = [
    "ROLES",
    "Runner",
    "REQUIRED_ROLES",
    "Track",
    "TrackError",
    "TRACKS",
    "WORKFLOW_DIR",
    "register_track",
    "rules_path",
    "track",
    "track_rules",
    "section_at",
]


class TrackError(ValueError):
    """A bad track registration or an unknown track name: the message is one line naming it."""


def section_at(cfg: Mapping, dotted: str) -> Mapping:
    """The config mapping at a dotted key (``'task_level.baselines'``); ``{}`` where a level is missing or null."""
    node: Any = cfg
    for part in dotted.split("."):
        node = (node.get(part) if isinstance(node, Mapping) else None) or {}
    return node


@dataclass(frozen=True)
class Runner:
    """A baseline runner that a track brings (:attr:`Track.runner_spec`; the shared ``text`` and ``speech``
    runners are the registry's, :data:`qrerase.registry.RUNNERS`).

    description: what its implementation of a method is called with. job_class: ``"module:Class"``, its
    job config (a :class:`qrerase.baseline_config.BaselineConfig` subclass in a torch-free module). section: the dotted
    config key holding one entry per method (``<section>.<method>``, its schema generated from the job
    config and the method's hyperparameters). required: a baseline listed in a track of this runner must
    have its entry there. inputs: input name -> description, the extra inputs its baseline jobs may read
    (a method declares those it reads, ``register_method(inputs=...)``). sweep_sections: dotted config keys
    holding one entry per method that is not a job (a trade-off sweep's parameter and values; a method
    gives its entry's schema, ``register_method(settings=...)``).
    """

    description: str
    job_class: str
    section: str
    required: bool = True
    inputs: Mapping[str, str] = field(default_factory=dict)
    sweep_sections: tuple[str, ...] = ()


@dataclass(frozen=True)
class Track:
    """One experiment track. Required fields: ``name``, ``runner``, ``prefix``, ``experiments``, ``tables``,
    ``title``, ``check``; the others have defaults (the common case), some derived from ``name``
    (:meth:`__post_init__`). The fields:

    name: the config name (``tracks: [...]``, ``methods.<name>``). runner: the runner of its
    baselines (a key of :data:`qrerase.registry.RUNNERS`: the :attr:`Method.run` entry a baseline job looks
    up). section: its config section. overrides: config sections whose
    ``pretrain`` / ``finetune`` / ``lora`` / ``tokenizer`` entries override the shared top-level ones,
    most specific first. baselines_section: the dotted config key of its baselines' settings (default: the
    section of the runner it shares with a registered track that brings it, else ``<section>.baselines``).
    eval_sections: dotted keys of its evaluation settings, the first non-empty one wins.
    prefix: the prefix of its experiment names. experiments: experiment template (``tofu_<split>``)
    -> regex of its names (:data:`qrerase.workflow.naming.EXP_PATTERNS`). template_prefixes: templates whose
    names start with another prefix (the size study's ``size_``). shared_models: its experiments
    ``<prefix>_<arg>`` unlearn from the models of experiment ``<prefix>``. pretrain_text: its
    tokenizer is also trained on the pretraining text. language_model: its models are causal language
    models built by the shared text chain (tokenizer, pretrain, finetune, LoRA rules); ``False``: its
    rules build its own kind of model (the speech track). smoke: ``qrerase smoke`` runs its training
    jobs. sweep_language: a trade-off point is evaluated in its experiment's language (the name's arg).
    cost_group_header: the header of its cost table's column groups (``None``: one group).
    tables: its headline tables (``results/tables/<table>.csv``, repeated over seeds).
    title / page_prefixes: its results page (:mod:`qrerase.reports.pages`): title and the file-name
    prefixes of its tables and figures. check: ``"module:function"``, ``f(cfg, runs)`` raising
    ``ConfigError`` (one line) for a bad config section, ``runs`` whether the track is configured.
    metrics: its evaluation jobs compute the registered metrics (:mod:`qrerase.metrics.registry`; a
    metric may name only such a track). rules: its rules file, which the Snakefile includes after the
    shared stages' rules (absolute, or relative to the workflow directory: ``rules/<name>/rules.smk``
    for a built-in track in its folder; ``None``: the Snakefile includes it by name). schema: the JSON
    schema of its config section ``section``, added to the config schema: a mapping, or the path of a
    YAML file holding it (a built-in track's ``schema.yaml`` beside its ``__init__.py``, package data;
    ``None``: the section is in ``schemas/config.schema.yaml``). Its ``$ref`` s resolve against the
    whole config schema (``#/definitions/posint``).
    paths: its own artifact path patterns, key -> pattern (:mod:`qrerase.workflow.paths`; the shared ones
    are :data:`qrerase.workflow.paths.SHARED`). runner_spec: the runner ``runner`` when the track brings
    its own (:class:`Runner`). methods: the torch-free module registering the methods only this track
    has, and its runner's implementations of shared ones (:func:`qrerase.registry.extend_method`).
    metric_fns: built-in metric -> ``"module:function"``, its own per-example score of a metric the
    shared rules compute (the speech classifier's MIA loss); the metric then lists this track. moved_keys:
    old dotted config key -> the key of its section it moved to (a config still setting the old key is
    refused in one line naming the new one, :func:`qrerase.workflow.validation.check_moved_keys`).
    ``runner_spec``, ``methods`` and ``metric_fns`` are read when :mod:`qrerase.registry` and
    :mod:`qrerase.metrics.registry` are imported: a built-in track's (a plug-in module registers its
    methods and metrics itself). Its rules file binds the functions the generic rules
    call (:meth:`bind`, :data:`ROLES`).
    """

    # required: what only the track can say
    name: str
    runner: str
    prefix: str
    experiments: Mapping[str, str]
    tables: tuple[str, ...]
    title: str
    check: str
    # defaults: the common case; "" means derived from ``name`` (:meth:`__post_init__`)
    section: str = ""
    baselines_section: str = ""
    page_prefixes: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    eval_sections: tuple[str, ...] = ()
    template_prefixes: Mapping[str, str] = field(default_factory=dict)
    shared_models: bool = False
    pretrain_text: bool = False
    smoke: bool = False
    language_model: bool = True
    sweep_language: bool = False
    cost_group_header: str | None = None
    metrics: bool = False
    rules: str | None = None
    schema: Mapping[str, Any] | Path | None = None
    paths: Mapping[str, str] = field(default_factory=dict)
    runner_spec: Runner | None = None
    methods: str | None = None
    metric_fns: Mapping[str, str] = field(default_factory=dict)
    moved_keys: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Fill the derived defaults: ``section`` = ``name``; ``baselines_section`` = the section of its runner
        when a registered track brings that runner and this one does not (the cross-lingual track's baselines
        are the text runner's), else ``<section>.baselines``; ``page_prefixes`` = ``(name,)``."""
        home = next((t.runner_spec for t in TRACKS.values() if t.runner == self.runner and t.runner_spec), None)
        shared = home.section if home and self.runner_spec is None else None
        derived = {
            "section": self.name,
            "baselines_section": shared or f"{self.section or self.name}.baselines",
            "page_prefixes": (self.name,),
        }
        for key, value in derived.items():
            if not getattr(self, key):
                object.__setattr__(self, key, value)

    # ----- the functions of its rules file (rules/<name>/common.smk) -----
    def bind(self, **functions: Callable) -> None:
        """Bind the functions of its rules file that the generic rules call, by role (:data:`ROLES`):
        ``targets()`` its default targets, ``costs()`` its cost groups ``{group: {method: components}}``,
        ``tradeoff_targets()`` its trade-off targets (the three required), ``sweep()`` the
        ``(experiments, methods)`` of a text sweep, ``finetune_start(wildcards)`` its own fine-tuning start
        inputs, ``robustness()`` its robustness plan (rules/studies/robustness.smk), ``runner_inputs()`` the
        files of the extra inputs of the runner it brings (:attr:`Runner.inputs`: ``{input: path}``). A track
        without an optional role has none (its sweep is its own rules', the shared fine-tuning start, no
        robustness stage, no runner inputs).
        :class:`TrackError` for an unknown role, a function that is not callable or a required one missing."""
        unknown = sorted(set(functions) - set(ROLES))
        if unknown:
            raise TrackError(f"track {self.name!r}: bind() got unknown role(s) {unknown}; roles: {list(ROLES)}")
        bad = sorted(role for role, fn in functions.items() if not callable(fn))
        if bad:
            raise TrackError(f"track {self.name!r}: bind() role(s) {bad} must be functions")
        missing = [role for role in REQUIRED_ROLES if role not in functions]
        if missing:
            raise TrackError(f"track {self.name!r}: bind() lacks the required role(s) {missing}")
        _BOUND[self.name] = dict(functions)

    def function(self, role: str) -> Callable | None:
        """The function bound for ``role`` (:meth:`bind`); ``None`` for an optional role it has none for.
        :class:`TrackError` when its rules file bound nothing."""
        if role not in ROLES:
            raise TrackError(f"unknown track function role {role!r}; roles: {list(ROLES)}")
        if self.name not in _BOUND:
            raise TrackError(f"track {self.name!r}: its rules file binds no functions (Track.bind)")
        return _BOUND[self.name].get(role)

    # ----- how its training sections compose (qrerase.workflow.stages) -----
    def chain(self, cfg: Mapping, name: str) -> list[tuple[str, Mapping]]:
        """``(config key, section)`` pairs a training section ``name`` merges, most specific first:
        ``<override>.<name>`` for each of :attr:`overrides`, then the top-level ``name``."""
        own = [(f"{o}.{name}", section_at(cfg, o).get(name) or {}) for o in self.overrides]
        return [*own, (name, cfg.get(name) or {})]

    def training_section(self, cfg: Mapping, name: str) -> dict:
        """A ``pretrain`` / ``finetune`` / ``lora`` section (``tokenizer``: ``model.tokenizer``) with this
        track's overrides laid over it (rules/common.smk ``exp_section``)."""
        base = dict(cfg["model"]["tokenizer"] if name == "tokenizer" else cfg[name])
        for over in reversed(self.overrides):
            base.update(section_at(cfg, over).get(name) or {})
        return base

    def stage(self, cfg: Mapping, stage: str) -> Any:
        """The training job ``stage`` (``pretrain``, ``finetune``, ``lora`` or a baseline's name)
        before planning, a :class:`qrerase.workflow.stages.Stage`; ``None`` (here): the text track's
        (:func:`qrerase.workflow.stages.stage_of`)."""
        return None

    def baseline_stage(self, cfg: Mapping, stage: str) -> Any:
        """A baseline's :class:`~qrerase.workflow.stages.Stage`; ``None`` (here): a text baseline's
        (``<baselines_section>.<m>``, :func:`qrerase.workflow.stages.text_baseline_stage`)."""
        return None

    # ----- its memory plan (qrerase.workflow.plan_config) -----
    def pretrains(self, cfg: Mapping) -> bool:
        """Whether its jobs include pretraining (the embedded tiny model is built from scratch)."""
        return cfg["model"].get("name_or_path") is None

    def examples(self, cfg: Mapping) -> int:
        """Training examples per epoch its plan assumes: 20 per author."""
        return 20 * int((section_at(cfg, self.section).get("data") or {}).get("n_authors") or 200)

    def plan_jobs(self, cfg: Mapping) -> list | None:
        """(resource class, job, examples per epoch) of its jobs; ``None`` (here): a text track's
        (:func:`qrerase.workflow.plan_config.text_jobs`)."""
        return None

    def plan_sections(self, cfg: Mapping) -> Mapping:
        """The config mapping whose ``<stage>.epochs`` its plan reads (then ``<baselines_section>.<stage>.epochs``)."""
        return cfg

    def planning_model(self, cfg: Mapping) -> tuple[Mapping, Any] | None:
        """(model section, :class:`~qrerase.workflow.shapes.ModelShape`) its jobs are planned on;
        ``None`` (here): the text model's (:func:`qrerase.workflow.stages.context`)."""
        return None

    def erase_scale(self, cfg: Mapping) -> float:
        """λ of W' = W - λ T~_f for its experiments (``unlearn.scale``)."""
        return cfg["unlearn"]["scale"]

    def run_check(self, cfg: Mapping) -> None:
        """Its config checks (:attr:`check`), told whether the track is configured."""
        module, _, attr = self.check.partition(":")
        getattr(importlib.import_module(module), attr)(cfg, self.name in cfg.get("tracks", []))


#: The roles of the functions a track's rules file binds (:meth:`Track.bind`), the required ones first.
REQUIRED_ROLES = ("targets", "costs", "tradeoff_targets")
ROLES = (*REQUIRED_ROLES, "sweep", "sweep_eval", "finetune_start", "robustness", "runner_inputs")
#: track name -> role -> its function (filled as the Snakefile includes the tracks' rules files).
_BOUND: dict[str, dict[str, Callable]] = {}
#: The fields a track may leave empty (``None`` or ``()``).
_MAY_BE_EMPTY = (
    "overrides",
    "template_prefixes",
    "eval_sections",
    "cost_group_header",
    "rules",
    "schema",
    "paths",
    "runner_spec",
    "methods",
    "metric_fns",
    "moved_keys",
)
#: The fields a track must not leave empty (the others may be empty, ``None`` or ``False``).
_NON_EMPTY = tuple(f.name for f in fields(Track) if f.name not in _MAY_BE_EMPTY and f.type not in ("bool",))
#: The workflow directory of this checkout (its Snakefile, ``rules/``): where a relative :attr:`Track.rules` lies.
WORKFLOW_DIR = Path(__file__).resolve().parents[2]
#: Every registered track, in registration order (the built-in ones in config order).
TRACKS: dict[str, Track] = {}


def register_track(t: Track) -> Track:
    """Register a track (a track module calls this once at import); :class:`TrackError` for a
    duplicate name, a non-:class:`Track` or a field left empty."""
    if not isinstance(t, Track):
        raise TrackError(f"register_track: expected a Track, got {type(t).__name__}")
    if t.name in TRACKS:
        raise TrackError(f"track {t.name!r} is already registered")
    missing = [f for f in _NON_EMPTY if not getattr(t, f)]
    if missing:
        raise TrackError(f"track {t.name!r}: empty field(s) {missing}")
    if t.rules is not None and _checkable(t.rules):
        _existing_rules(t, t.rules)
    if t.schema is not None and not isinstance(t.schema, (Mapping, Path)):
        raise TrackError(
            f"track {t.name!r}: schema must be a mapping (a JSON schema) or the Path of a YAML file holding one, "
            f"got {type(t.schema).__name__}"
        )
    if isinstance(t.schema, Path) and not t.schema.is_file():
        raise TrackError(f"track {t.name!r}: schema file {t.schema} not found (Track.schema)")
    TRACKS[t.name] = t
    return t


def _checkable(rules: str) -> bool:
    """Whether a rules file can be checked at registration: an absolute path always; a relative one in a
    checkout (the workflow directory holds the Snakefile). An installed package (a wheel) has no rules
    folder: ``qrerase plan`` and the config checks work without it, and :func:`track_rules` (the
    Snakefile's call) checks every file."""
    return Path(rules).is_absolute() or (WORKFLOW_DIR / "Snakefile").is_file()


def _existing_rules(t: Track, rules: str) -> Path:
    """A track's rules file resolved against the workflow directory; :class:`TrackError` when it does not exist."""
    path = WORKFLOW_DIR / rules
    if not path.is_file():
        raise TrackError(f"track {t.name!r}: rules file {path} not found (Track.rules)")
    return path


def rules_path(t: Track) -> Path | None:
    """A track's rules file (:attr:`Track.rules`), a relative one resolved against the workflow
    directory (the checkout holding ``qrerase/``); ``None`` for a track without one."""
    return None if t.rules is None else WORKFLOW_DIR / t.rules


def track_rules() -> list[str]:
    """The rules files of the registered tracks that name one (:attr:`Track.rules`), in registration
    order: the Snakefile includes each after the shared stages' rules. :class:`TrackError` for a file
    that does not exist."""
    return [str(_existing_rules(t, t.rules)) for t in TRACKS.values() if t.rules is not None]


def track(name: str) -> Track:
    """The registered track ``name``; :class:`TrackError` (one line) for an unknown one."""
    try:
        return TRACKS[name]
    except (KeyError, TypeError):
        raise TrackError(f"unknown track {name!r}; registered: {list(TRACKS)}") from None
