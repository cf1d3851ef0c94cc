"""The task-level track: unlearning one skill (arithmetic) of a model that keeps the others.

Its one experiment is ``task_level`` (it owns its data, models and baselines); its settings are
``task_level`` (its ``pretrain`` / ``finetune`` / ``lora``, ``scale``, ``rank``, ``baselines`` and
``evaluate`` override or replace the shared ones); its rules are ``rules/task_level/rules.smk`` with
``rules/task_level/common.smk``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import Runner, Track, register_track, section_at

#: Training examples per epoch its plan assumes when ``task_level.data.sizes`` gives none.
DEFAULT_EXAMPLES = 1000


def check(cfg: Mapping, runs: bool) -> None:
    """The task_level section (when the track runs): skills, split sizes, operand ranges, data files;
    rank; the LoRA base against the init; the sweep's ranks and scales."""
    from ...workflow.validation import ConfigError, check_method_settings

    if not runs:
        return
    if TRACK.section not in cfg or TRACK.name not in cfg["methods"]:
        raise ConfigError(
            "config key 'task_level': the task-level track needs a 'task_level' section and 'methods.task_level'"
        )
    from .data import TaskLevelDataConfig, check_task_level_config

    try:
        check_task_level_config(TaskLevelDataConfig.from_dict(cfg["task_level"]["data"]))
    except (ValueError, TypeError) as exc:
        key, _, message = str(exc).partition(": ")
        raise ConfigError(f"config key '{key}': {message}") from None
    rank = cfg["task_level"].get("rank", cfg["unlearn"]["rank"])
    lora_r = cfg["lora"]["r"]
    if rank > lora_r and not any(cfg["lora"]["adapters"].values()):
        raise ConfigError(f"config key 'task_level.rank': {rank} exceeds the LoRA rank lora.r={lora_r}")
    check_method_settings(cfg, TRACK.name)
    section = cfg["task_level"]
    base = (section.get("lora") or {}).get("base", cfg["lora"].get("base", "finetuned"))
    tiny = cfg["model"].get("name_or_path") is None
    if base == "pretrained" and tiny and section.get("init", "pretrained") != "pretrained":
        raise ConfigError(
            "config key 'task_level.lora.base': pretrained needs a pretrained checkpoint "
            "(task_level.init: pretrained), got task_level.init: scratch"
        )
    sweep = section.get("tradeoff")
    if sweep:
        too_big = [k for k in sweep["ranks"] if k > lora_r]
        if too_big and not any(cfg["lora"]["adapters"].values()):
            raise ConfigError(f"config key 'task_level.tradeoff.ranks': {too_big} exceed the LoRA rank lora.r={lora_r}")
        if rank not in sweep["ranks"]:
            raise ConfigError(
                f"config key 'task_level.tradeoff.ranks': needs task_level.rank={rank} (the picked table's rank)"
            )
        if 0 not in sweep["scales"]:
            raise ConfigError(
                "config key 'task_level.tradeoff.scales': needs 0 (the unedited model the lambda rule compares with)"
            )


@dataclass(frozen=True)
class TaskLevelTrack(Track):
    def baseline_stage(self, cfg: Mapping, stage: str) -> Any:
        """A task-level baseline: ``task_level.baselines.<m>``, full weights, the fine-tuning ``max_length``
        (rules/task_level/rules.smk: the fine-tuning cap)."""
        from ... import registry
        from ...workflow.stages import Stage

        ft = self.training_section(cfg, "finetune")
        section = dict(section_at(cfg, self.baselines_section).get(stage) or {})
        chain = ((f"{self.baselines_section}.{stage}", section), *self.chain(cfg, "finetune"))
        plan_shape = registry.method(stage).plan_shape
        seqs, refs = plan_shape or (1, 0)
        return Stage(
            f"{self.name}:{stage}",
            "train",
            section,
            chain,
            1,
            seqs,
            refs,
            int(ft.get("max_length", 128)),
            hint=f"task-level baselines have no LoRA mode: remove {stage} from methods.{self.name}",
            planned=plan_shape is not None,
        )

    def pretrains(self, cfg: Mapping) -> bool:
        """The tiny model is pretrained unless ``task_level.init: scratch``."""
        return super().pretrains(cfg) and section_at(cfg, self.section).get("init", "pretrained") == "pretrained"

    def examples(self, cfg: Mapping) -> int:
        """The training split sizes of every skill (``task_level.data.sizes.<skill>.train``)."""
        sizes = (section_at(cfg, self.section).get("data") or {}).get("sizes") or {}
        return sum(int(s.get("train", 0)) for s in sizes.values()) or DEFAULT_EXAMPLES

    def erase_scale(self, cfg: Mapping) -> float:
        """``task_level.scale``, else ``unlearn.scale``."""
        return cfg[self.section].get("scale", cfg["unlearn"]["scale"])


TRACK = register_track(
    TaskLevelTrack(
        name="task_level",
        runner="task_level",
        overrides=("task_level",),
        eval_sections=("task_level.evaluate",),
        prefix="task_level",
        experiments={"task_level": "task_level"},
        tables=("task_level",),
        paths={  # its artifacts (qrerase.workflow.paths)
            "task_level_eval": "results/{exp}/task_level_eval/{model}.csv",
            "task_level_metrics": "results/task_level/metrics.csv",
            "task_level_tradeoff_points": "results/{exp}/tradeoff/points/{method}.csv",
        },
        title="Task-level track",
        page_prefixes=("task_level", "task"),
        check="qrerase.tracks.task_level:check",
        rules="rules/task_level/rules.smk",
        schema=Path(__file__).with_name("schema.yaml"),
        runner_spec=Runner(
            description=(
                "f(job) -> (model, curve), job a TaskLevelBaselineJob "
                "(qrerase.tracks.task_level.runners.run_task_level_baseline)"
            ),
            job_class="qrerase.tracks.task_level.settings:TaskLevelBaselineConfig",
            section="task_level.baselines",
            inputs={"initial": "the checkpoint the fine-tuned model was trained from (task-level track)"},
        ),
        methods="qrerase.tracks.task_level.methods",
    )
)
