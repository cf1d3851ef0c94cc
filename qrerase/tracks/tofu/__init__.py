"""The TOFU track: fictitious-author QA (TOFU), forget / retain splits, the text baselines.

Its experiments are ``tofu_<split>`` (and the size study's ``size_h<W>_s<S>``); its settings are the
``tofu`` section (its schema: ``schema.yaml`` here; its text baselines: ``tofu.baselines``, read by the
cross-lingual track too) and the shared top-level ``unlearn`` / ``lora`` / ``tradeoff`` sections; its
rules are ``rules/tofu/rules.smk`` with ``rules/tofu/common.smk``, its scripts ``workflow_scripts/tofu/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..base import Runner, Track, register_track


def check(cfg: Mapping, runs: bool) -> None:
    """The ``tofu`` section. Where the track runs: the author counts, the vendored data files of a local
    source, imported models' names and files. Whether it runs or not (the cross-lingual track reads its
    evaluation settings and baselines): a ``tofu.baselines.<m>`` entry for every baseline of
    ``methods.tofu``, the refusals file."""
    from ...workflow.validation import ConfigError, check_method_settings

    if runs:
        _check_run(cfg)
    check_method_settings(cfg, TRACK.name)
    refusals = cfg["tofu"]["baselines"].get("refusals")
    if refusals is not None and not Path(refusals).is_file():
        raise ConfigError(f"config key 'tofu.baselines.refusals': {refusals} not found")


def _check_run(cfg: Mapping) -> None:
    """The checks of a configured TOFU track: its data, its imported models."""
    from ...workflow.validation import ConfigError
    from .data import TofuDataConfig, author_counts, holdout_split, required_splits

    data = cfg["tofu"]["data"]
    try:
        author_counts(TofuDataConfig.from_dict(data))
    except ValueError as exc:
        key, _, why = str(exc).partition(": ")
        raise ConfigError(f"config key 'tofu.{key}': {why}") from None
    if data["source"] == "local":
        root = Path(data["root"])
        for name in [*required_splits(data["split"], data.get("knowledge", [])), holdout_split(data["split"])]:
            if not (root / f"{name}.jsonl").is_file():
                raise ConfigError(f"config key 'tofu.data.root': data file {root / f'{name}.jsonl'} not found")
    _check_imported_names(cfg["tofu"].get("imported_models", []))
    for item in cfg["tofu"].get("imported_models", []):
        for key in ("log", "reference"):
            if item.get(key) and not Path(item[key]).exists():
                raise ConfigError(f"config key 'tofu.imported_models[{item['name']}].{key}': {item[key]} not found")


def _check_imported_names(items) -> None:
    """An imported model's name names its eval log, metrics file and table row: one that equals a
    reference (``base``, ``retain``), a registered method (or a method's model, ``<method>_k<rank>``) or
    another imported model would overwrite that model's metrics, so it is refused, naming the key."""
    from ... import registry
    from ...workflow.naming import method_of
    from ...workflow.validation import ConfigError

    seen: set[str] = set()
    for i, item in enumerate(items):
        name = item["name"]
        key = f"config key 'tofu.imported_models[{i}].name'"
        if name in seen:
            raise ConfigError(f"{key}: {name!r} is the name of another imported model; each needs its own")
        seen.add(name)
        if name in ("base", "retain"):
            raise ConfigError(f"{key}: {name!r} is a reference model's name; choose another")
        if method_of(name).removesuffix(registry.CONTROL_SUFFIX) in registry.names():
            raise ConfigError(f"{key}: {name!r} is a method's name (its metrics would be overwritten); choose another")


TRACK = register_track(
    Track(
        name="tofu",
        runner="text",
        eval_sections=("tofu.evaluate",),
        prefix="tofu",
        experiments={"tofu_<split>": r"tofu_forget\d\d", "size_<shape>": r"size_h\d+_s\d+"},
        template_prefixes={"size_<shape>": "size"},
        pretrain_text=True,
        smoke=True,
        tables=("tofu",),
        title="TOFU track",
        check="qrerase.tracks.tofu:check",
        metrics=True,
        rules="rules/tofu/rules.smk",
        schema=Path(__file__).with_name("schema.yaml"),
        moved_keys={"baselines": "tofu.baselines"},  # the text baselines' section was top-level
        runner_spec=Runner(
            description="a TextObjective subclass (qrerase.baselines.objective), trained by "
            "qrerase.baselines.text.train_baseline",
            job_class="qrerase.baselines.settings:TextBaselineConfig",
            section="tofu.baselines",
            inputs={"refusals": "template (refusal) answers, tofu.baselines.refusals (text tracks)"},
        ),
    )
)
