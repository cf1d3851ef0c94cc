"""Config validation of the workflow: the JSON schema, then every cross-key check.

Called once by the workflow (``rules/common.smk``) before any rule is declared. Every error is one
line naming the config key: ``config key 'speech.top_k': 12 exceeds the number of speakers (4)``.

The schema file (``schemas/config.schema.yaml``) lists no method or track names: a node holding
``x-registry: <source>`` gets its ``enum`` from :mod:`qrerase.registry` at load time (sources:
``methods.<track>``, ``subspace``, ``tracks``), a node holding ``x-registry-settings: <section>`` one
property per method of that section (:func:`qrerase.baseline_config.section_schemas`, else
:func:`qrerase.registry.settings_of`), the shared training keys come from :func:`qrerase.baseline_config.inject`.
``x-registry-tracks: sections`` (the top level) adds the section of each track declaring its schema
(:attr:`qrerase.tracks.Track.schema`: a built-in track's ``schema.yaml``, a plug-in track's mapping),
``x-registry-tracks: methods`` a ``methods.<track>`` entry for each registered track the file does not list.
The methods and tracks of the config's ``plugins`` are registered first (:func:`validate`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from .. import baseline_config, registry
from ..tracks.base import TRACKS, TrackError

__all__ = [
    "ConfigError",
    "SCHEMA_PATH",
    "load_schema",
    "registry_enum",
    "validate",
    "load_config_plugins",
    "check_schema",
    "check_finite",
    "check_core",
    "check_baselines",
    "check_moved_keys",
    "moved_keys",
    "check_method_settings",
    "check_tradeoff",
    "check_robustness_config",
    "check_model_source",
]

#: Package data: in a checkout a symlink to the source, schemas/config.schema.yaml (the file the Snakefile
#: reads); a built wheel holds a copy, so a non-editable install finds the schema too.
SCHEMA_PATH = Path(__file__).resolve().parent / "config.schema.yaml"


class ConfigError(ValueError):
    """An invalid config: the message is one line naming the key."""


def registry_enum(source: str) -> list[str]:
    """The names a schema ``x-registry`` node allows: ``methods.<track>``, ``subspace`` or ``tracks``."""
    if source == "subspace":
        return list(registry.SUBSPACE_METHODS)
    if source == "tracks":
        return list(registry.TRACKS)
    kind, _, track = source.partition(".")
    if kind == "methods" and track in registry.TRACKS:
        return registry.methods_for(track)
    raise ValueError(f"schema: unknown x-registry source {source!r}")


#: ``methods.<track>`` of a track the schema file does not list (a plug-in's; ``x-registry-tracks: methods``).
_TRACK_METHODS = {"description": "the track's methods", "type": "array", "uniqueItems": True}


def _registered() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What the injected schema depends on: the registered method and track names (a plug-in adds some)."""
    return registry.names(), tuple(TRACKS)


def _inject(node: Any) -> Any:
    if isinstance(node, dict):
        out = baseline_config.inject(
            node, {k: _inject(v) for k, v in node.items() if not k.startswith("x-")}
        )  # markers
        if "x-registry" in node:
            out["enum"] = registry_enum(node["x-registry"])
        if node.get("x-registry-tracks") == "sections":  # a track's own section (Track.schema)
            props = out.setdefault("properties", {})
            for t in TRACKS.values():
                if t.schema is not None:
                    if t.section in props:
                        raise ValueError(f"schema: track {t.name!r}: section '{t.section}' is in the schema file")
                    node = _yaml(t.schema) if isinstance(t.schema, Path) else copy.deepcopy(dict(t.schema))
                    if not isinstance(node, dict):
                        raise ValueError(f"schema: {t.schema} holds no mapping (a track's section schema)")
                    props[t.section] = _inject(node)
        if node.get("x-registry-tracks") == "methods":  # methods.<track> of a track the file does not list
            props = out.setdefault("properties", {})
            for t in TRACKS.values():
                props.setdefault(t.name, {**_TRACK_METHODS, "items": {"enum": registry.methods_for(t.name)}})
        if "x-registry-settings" in node:
            section, props = node["x-registry-settings"], out.setdefault("properties", {})
            for name, schema in baseline_config.section_schemas(section).items():
                if name in props:
                    raise ValueError(f"schema: '{section}.{name}' is both in the schema file and registered")
                props[name] = _inject(copy.deepcopy(dict(schema)))
        return out
    if isinstance(node, list):
        return [_inject(v) for v in node]
    return node


def _yaml(path: Path) -> Any:
    """A YAML file read by :func:`qrerase.io.load_yaml` (libyaml's safe loader; a repeated key refused)."""
    from ..io import load_yaml

    return load_yaml(path)


@cache
def _load_schema(path: str, _registered: tuple) -> dict:
    """The schema file (read by every ``snakemake`` call) with the registry's settings and the tracks' sections."""
    return _inject(_yaml(Path(path)))


def _schema(path: str) -> dict:
    """The injected schema, cached per path and set of registered methods and tracks (a plug-in adds some)."""
    return _load_schema(path, _registered())


def load_schema(path: str | Path = SCHEMA_PATH) -> dict:
    """The config schema with the registry's enums and method settings injected (read once per path)."""
    return copy.deepcopy(_schema(str(path)))


def check_finite(node: Any, key: str = "") -> None:
    """No NaN or infinity anywhere in the config (every number, whatever its key).

    JSON-schema bounds cannot catch NaN (every comparison with NaN is false), so ``lr: .nan`` would
    pass ``exclusiveMinimum: 0`` and fail jobs later without naming its key.
    """
    if isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"config key '{key or '<top level>'}': {node} is not a finite number")
    if isinstance(node, Mapping):
        for k, v in node.items():
            check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            check_finite(v, f"{key}.{i}" if key else str(i))


@cache
def _validator(path: str, _registered: tuple):
    """Draft 2020-12 validator whose ``integer`` is an ``int``: JSON Schema counts 2.0 as an integer,
    but a rank, epoch count or batch size written 2.0 would reach the jobs as a float. Cached per path
    and registered method and track names (as :func:`_schema`)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    strict = jsonschema.validators.extend(base, type_checker=checker)
    return strict(_schema(path))


def check_schema(cfg: Mapping, schema_path: str | Path = SCHEMA_PATH) -> None:
    """No NaN/infinity, then the JSON schema (Draft 2020-12, integers are ints): the first error, by key
    path, naming its key. An ``unevaluatedProperties`` error of a section is only reported when no
    error lies deeper inside it (a bad value inside an ``allOf`` also leaves its key 'unevaluated')."""
    check_finite(cfg)
    errors = list(_validator(str(schema_path), _registered()).iter_errors(cfg))
    paths = [tuple(str(p) for p in e.absolute_path) for e in errors]
    kept = [
        (path, e)
        for path, e in zip(paths, errors)
        if e.validator != "unevaluatedProperties"
        or not any(len(other) > len(path) and other[: len(path)] == path for other in paths)
    ]
    if kept:
        path, err = min(kept, key=lambda pe: list(pe[0]))
        unknown = _unknown_key(err, str(schema_path))
        if unknown is not None:
            path, message = (*path, unknown[0]), unknown[1]
        else:
            message = " ".join(err.message.split())
        key = ".".join(path) or "<top level>"
        raise ConfigError(f"config key '{key}': {message} (see {Path(schema_path).name})")


def _unknown_key(err, schema_path: str) -> tuple[str, str] | None:
    """(the first unknown key, its message) of a schema error about a key the schema does not know (a
    closed object's ``additionalProperties`` / ``unevaluatedProperties``, or a ``propertyNames`` enum),
    else None. The message suggests the closest known key and lists the keys allowed there."""
    import difflib

    from .schema_keys import config_keys

    if err.validator in ("oneOf", "anyOf"):  # a closed object branch (model.template): its unknown key
        found = (_unknown_key(e, schema_path) for e in err.context if not e.path)
        return next((f for f in found if f is not None), None)
    if err.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(err.instance, Mapping):
        schema = _schema(schema_path)
        known = [k.path for k in config_keys(schema, node=err.schema) if "." not in k.path and "[" not in k.path]
        extra = [str(k) for k in err.instance if str(k) not in known]
    elif "propertyNames" in err.schema_path and isinstance(err.instance, str):
        known, extra = [str(v) for v in err.schema.get("enum", [])], [err.instance]
    else:
        return None
    if not extra:
        return None
    close = difflib.get_close_matches(extra[0], known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return extra[0], f"unknown key ({hint}keys here: {', '.join(known) or 'none'})"


def check_core(cfg: Mapping) -> None:
    """The shared sections: ranks within the LoRA rank, the tiny model's shape, the model source,
    user adapters (each track's own section: its :meth:`~qrerase.tracks.Track.run_check`)."""
    lora_r = cfg["lora"]["r"]
    for key in ("rank", "retain_rank"):
        value = cfg["unlearn"].get(key)
        if value is not None and value > lora_r and not any(cfg["lora"]["adapters"].values()):
            raise ConfigError(
                f"config key 'unlearn.{key}': {value} exceeds the LoRA rank lora.r={lora_r}; "
                "the task matrices have rank at most r"
            )
    tiny = cfg["model"]["tiny"]
    if cfg["model"]["name_or_path"] is None:
        if tiny["hidden_size"] % tiny["num_attention_heads"]:
            raise ConfigError("config key 'model.tiny.hidden_size': must be divisible by num_attention_heads")
        if tiny["num_attention_heads"] % tiny["num_key_value_heads"]:
            raise ConfigError("config key 'model.tiny.num_key_value_heads': must divide num_attention_heads")
    check_model_source("model", cfg["model"], tokenizer=True)
    for set_name, path in cfg["lora"]["adapters"].items():
        if path is not None:
            from ..method.adapters import check_adapter_dir

            try:
                adapter = check_adapter_dir(path)
            except (FileNotFoundError, ValueError) as exc:
                raise ConfigError(f"config key 'lora.adapters.{set_name}': {exc}") from None
            check_adapter_base(cfg, set_name, path, adapter.base_model_name_or_path)
            check_adapter_ranks(cfg, set_name, path)


def check_adapter_base(cfg: Mapping, set_name: str, path: str, base: str | None) -> None:
    """A user adapter's ``base_model_name_or_path`` against ``model.name_or_path`` (docs/models.md,
    "Your own adapters"): the same model by :func:`qrerase.models.checkpoint_files.same_model`; for the tiny
    model this workflow builds, or a GGUF file it imports, any local folder (the workflow's own
    checkpoints) but no hub id. An unnamed base cannot be compared and passes (the job still checks
    every module's shape). ``lora.accept_other_base: true`` accepts any base; the job that reads the
    adapter records that key in its provenance."""
    from ..models.checkpoint_files import is_local_path, same_model
    from ..models.gguf import is_gguf_source

    if not base or cfg["lora"].get("accept_other_base"):
        return
    model = cfg["model"]["name_or_path"]
    if model is None or is_gguf_source(cfg["model"]):
        if is_local_path(base):
            return
        configured = (
            "the tiny model this workflow builds" if model is None else f"{model} ({cfg['model']['gguf_file']})"
        )
    elif same_model(base, model):
        return
    else:
        configured = repr(model)
    raise ConfigError(
        f"config key 'lora.adapters.{set_name}': adapter {path} was trained on {base!r}, but model.name_or_path "
        f"is {configured}; set lora.accept_other_base: true to use it anyway"
    )


def check_adapter_ranks(cfg: Mapping, set_name: str, path: str) -> None:
    """The ranks the plan decomposes a user adapter at, against the adapter's own LoRA ranks
    (``adapter_config.json``'s ``r`` with ``rank_pattern`` applied, per module: a rank-r module's task
    matrix has rank at most r). The forget adapter is decomposed at ``unlearn.rank`` (and, for the
    control rows of ``unlearn.control``, at the retain projector's rank); the retain adapter at
    max(``unlearn.rank``, ``unlearn.retain_rank``) (rules/common.smk's ``retain_factors``)."""
    from ..method.adapters import adapter_ranks

    unlearn = cfg["unlearn"]
    keys = ["rank"]  # the key whose value the adapter must reach: the larger of the two where both apply
    if (set_name == "retain" or unlearn.get("control")) and (unlearn.get("retain_rank") or 0) > unlearn["rank"]:
        keys.append("retain_rank")
    ranks = adapter_ranks(path)
    module = min(ranks, key=ranks.get)
    for key in keys:
        if unlearn[key] > ranks[module]:
            raise ConfigError(
                f"config key 'unlearn.{key}': {unlearn[key]} exceeds the LoRA rank {ranks[module]} of module "
                f"{module!r} in lora.adapters.{set_name} ({path}); its task matrix has rank at most {ranks[module]}"
            )


def check_model_source(section: str, model_cfg: Mapping, tokenizer: bool) -> None:
    """``<section>.name_or_path`` when it is a local path: the checks the job's loader makes
    (:func:`qrerase.models.checkpoint_files.check_model_dir`). A hub id is left to :func:`check_hub_models`
    (no network here)."""
    from ..models.checkpoint_files import check_model_dir, is_local_path

    name = model_cfg.get("name_or_path")
    if name is None:
        return
    from ..models.gguf import is_gguf_source, resolve_gguf

    if is_gguf_source(model_cfg):  # a GGUF file: found (package metadata, 4 bytes), imported by a rule
        try:
            resolve_gguf(model_cfg)
        except ValueError as exc:
            raise ConfigError(f"config key '{section}.name_or_path': {exc}") from None
        return
    if not is_local_path(name):
        return
    what = " ".join([*section.split(".")[:-1], "model"])  # "speech.model" -> "speech model"
    try:
        check_model_dir(name, what, tokenizer=tokenizer)
    except ValueError as exc:
        raise ConfigError(f"config key '{section}.name_or_path': {exc}") from None


def check_hub_models(cfg: Mapping) -> None:
    """Each hub model the run's jobs load (``model``; a running track's ``<track>.model``) under
    ``local_files_only: true`` must be in the local Hugging Face cache: its ``config.json``, looked up
    with ``huggingface_hub.try_to_load_from_cache``, which reads the cache folders only (no network, no
    torch). Otherwise the first job would fail on it. :func:`validate` skips this for a plan that runs
    no job (``qrerase plan``)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.constants import HF_HUB_CACHE

    from ..models.checkpoint_files import is_local_path
    from ..models.gguf import is_gguf_source

    sections = {"model": cfg["model"]}  # and each running track's own model section (speech.model)
    for track in cfg.get("tracks", []):
        own = cfg.get(track, {}).get("model") if isinstance(cfg.get(track), Mapping) else None
        if isinstance(own, Mapping) and "name_or_path" in own:
            sections[f"{track}.model"] = own
    for section, model_cfg in sections.items():
        repo_id = model_cfg.get("name_or_path")
        if not repo_id or not model_cfg.get("local_files_only") or is_gguf_source(model_cfg):
            continue
        if is_local_path(repo_id) or isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            continue
        raise ConfigError(
            f"config key '{section}.name_or_path': {repo_id!r} is not in the Hugging Face cache ({HF_HUB_CACHE}) "
            f"and {section}.local_files_only is true; download it first (hf download {repo_id}) or set "
            f"{section}.local_files_only: false"
        )


def _section(cfg: Mapping, dotted: str) -> Mapping:
    node: Any = cfg
    for key in dotted.split("."):
        node = (node.get(key) or {}) if isinstance(node, Mapping) else {}
    return node


def check_method_settings(cfg: Mapping, track: str) -> None:
    """Every baseline in ``methods.<track>`` has its entry in the config section its track's runner
    reads (:func:`qrerase.registry.required_section`: ``tofu.baselines.<method>`` for the text tracks,
    ``task_level.baselines.<method>`` for the task-level track)."""
    section = registry.required_section(track)
    if section is None:
        return
    baselines = registry.baselines_for(track)
    for i, name in enumerate(cfg["methods"].get(track, [])):
        if name in baselines and not _section(cfg, section).get(name):
            raise ConfigError(
                f"config key 'methods.{track}.{i}': baseline '{name}' has no '{section}.{name}' settings"
                + (" (epochs, lr, batch_size, ...)" if registry.SETTINGS_SECTIONS.get(section) == "text" else "")
            )


def check_baselines(cfg: Mapping) -> None:
    """:func:`check_method_settings` of every track in ``methods`` whose baselines read a shared section
    (a track whose section lies inside its own, e.g. ``task_level.baselines``, is checked by its track's
    check)."""
    for track in cfg["methods"]:
        section = registry.required_section(track)
        if section is not None and section.split(".")[0] != track:
            check_method_settings(cfg, track)


def check_robustness_config(cfg: Mapping) -> None:
    """Config section ``robustness``: its settings (:func:`qrerase.robustness.settings.check_robustness`).
    A track of ``robustness.in_default_target`` that ``tracks`` does not configure is skipped."""
    from ..robustness.settings import check_robustness

    try:
        check_robustness(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_tradeoff(cfg: Mapping) -> None:
    """`tradeoff.scales` includes 0: the unedited model, every curve's utility reference."""
    from ..text.tradeoff import scale_name

    scales = [scale_name(s) for s in cfg.get("tradeoff", {}).get("scales", [])]
    if scales and "0" not in scales:
        raise ConfigError(
            "config key 'tradeoff.scales': must include 0 (the unedited model: the utility "
            "reference of every curve and the baseline of the lambda rule)"
        )


def load_config_plugins(cfg: Mapping) -> None:
    """Import the modules of the config key ``plugins`` (each registers its methods, metrics or tracks); a
    bad one (not importable, or a registration it makes refused) is a :class:`ConfigError` naming the key."""
    plugins = cfg.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ConfigError(f"config key 'plugins': expected a list of module names, got {plugins!r}")
    for i, module in enumerate(plugins):
        try:
            registry.load_plugins([module])
        except (registry.RegistryError, TrackError) as exc:
            raise ConfigError(f"config key 'plugins.{i}': {exc}") from None


def moved_keys() -> dict[str, str]:
    """Config keys that moved: old dotted key -> new one, as the registered tracks declare them
    (:attr:`qrerase.tracks.Track.moved_keys`)."""
    return {old: new for t in TRACKS.values() for old, new in t.moved_keys.items()}


def check_moved_keys(cfg: Mapping) -> None:
    """Refuse a config that still sets a moved key (:func:`moved_keys`), naming the new key."""
    for old, new in moved_keys().items():
        parent, _, leaf = old.rpartition(".")
        if leaf in (_section(cfg, parent) if parent else cfg):
            raise ConfigError(f"config key '{old}' moved to '{new}'")


def validate(cfg: Mapping, schema_path: str | Path = SCHEMA_PATH, jobs: bool = True) -> None:
    """Every check, in order: the plug-ins' methods registered, then the schema (so the cross-key
    checks may trust types and keys), then the cross-key checks. ``jobs=False``: no job will load the
    configured hub model (``qrerase plan``; ``qrerase smoke``, which builds a random-weight model of its
    shape), so it need not be in the cache (:func:`check_hub_models`)."""
    check_moved_keys(cfg)
    load_config_plugins(cfg)
    check_schema(cfg, schema_path)
    check_core(cfg)
    if jobs:
        check_hub_models(cfg)
    for t in TRACKS.values():
        t.run_check(cfg)
    check_baselines(cfg)
    check_tradeoff(cfg)
    check_robustness_config(cfg)
