"""The task-level track's baseline runners: each method's ``task_level`` implementation in :mod:`qrerase.registry`.

A runner takes one :class:`TaskLevelBaselineJob` (the fine-tuned model, the forget / retain / new sets, the
prompt template, the method's ``task_level.baselines.<method>`` settings) and returns ``(model, curve)``;
:func:`run_task_level_baseline` looks the runner up (rule ``task_level_baseline``). Gradient Ascent (and any text
baseline registered for the task-level track) runs its text objective (:func:`run_text_objective`); KGA and
KU run :func:`qrerase.tracks.task_level.baselines.train_kga` / :func:`~qrerase.tracks.task_level.baselines.train_ku`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import registry

__all__ = [
    "TaskLevelBaselineJob",
    "run_task_level_baseline",
    "loads_sharded",
    "run_text_objective",
    "run_kga",
    "run_ku",
]


@dataclass
class TaskLevelBaselineJob:
    """One task-level baseline job.

    ``method``: the registered method name; ``model`` the fine-tuned model (trained in place);
    ``tokenizer``; ``forget`` / ``retain`` / ``new``: QA records (D_f, D_r and the never-trained D_n);
    ``template``: the prompt template; ``settings``: ``task_level.baselines.<method>`` with ``max_length``,
    ``seed`` and ``threads`` added; ``initial``: loads the checkpoint the fine-tuned model was trained
    from (called only by a runner that needs it: KGA's auxiliary models); ``desc``: progress and log name.
    """

    method: str
    model: Any
    tokenizer: Any
    forget: Sequence[Mapping[str, Any]]
    retain: Sequence[Mapping[str, Any]]
    new: Sequence[Mapping[str, Any]]
    template: Any
    settings: Mapping[str, Any]
    initial: Callable[[], Any]
    desc: str
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("qrerase"))


def run_task_level_baseline(job: TaskLevelBaselineJob):
    """Run ``job.method``'s registered ``task_level`` implementation; ``ValueError`` naming the method when it
    is no task-level baseline. Returns ``(model, curve)`` (curve: one dict per optimiser step)."""
    known = registry.baselines_of_runner("task_level")
    if job.method not in known:
        raise ValueError(f"task-level baseline must be one of {known}, got {job.method!r}")
    return registry.implementation(job.method, "task_level")(job)


def loads_sharded(method: str, backend: str) -> bool:
    """Whether the job of task-level baseline ``method`` loads its models with rank 0 alone reading the
    weights (:func:`qrerase.text.models.load_model` ``sharded``): under FSDP2 over several processes
    (:func:`qrerase.engine.sharded`), for a runner that declares ``loads_sharded = True``, i.e. one
    that uses no model before the engine's preparation broadcasts rank 0's weights. KU does not: its
    stopping threshold and starting memorisation accuracy evaluate the fine-tuned model first, on
    every rank. A runner that declares nothing loads whole on every rank."""
    from ...engine import sharded

    return sharded(backend) and bool(getattr(registry.implementation(method, "task_level"), "loads_sharded", False))


def run_text_objective(job: TaskLevelBaselineJob):
    """A text baseline's objective (:func:`qrerase.baselines.text.train_baseline`) on the task sets,
    without a reference model (Gradient Ascent)."""
    from ...baselines.text import TextBaselineConfig, train_baseline

    cfg = TextBaselineConfig.from_dict({**job.settings, "method": job.method})
    return train_baseline(job.model, None, job.tokenizer, job.forget, job.retain, job.template, cfg, desc=job.desc)


run_text_objective.loads_sharded = True  # as the TOFU baselines (qrerase.baselines.text.loads_sharded)


def run_kga(job: TaskLevelBaselineJob):
    """KGA (:func:`qrerase.tracks.task_level.baselines.train_kga`) with auxiliary models from ``job.initial()``."""
    from .baselines import train_kga
    from .settings import TaskLevelBaselineConfig

    cfg = TaskLevelBaselineConfig.from_dict({**job.settings, "method": job.method})
    initial = job.initial()
    return train_kga(
        job.model, initial, job.tokenizer, job.forget, job.retain, job.new, job.template, cfg, desc=job.desc
    )


run_kga.loads_sharded = True  # its auxiliary models train (and its references are prepared) before any use


def run_ku(job: TaskLevelBaselineJob):
    """KU (:func:`qrerase.tracks.task_level.baselines.train_ku`); its memorisation criterion is logged."""
    from .baselines import train_ku
    from .settings import TaskLevelBaselineConfig

    cfg = TaskLevelBaselineConfig.from_dict({**job.settings, "method": job.method})
    model, curve, info = train_ku(job.model, job.tokenizer, job.forget, job.new, job.template, cfg, desc=job.desc)
    job.log.info("KU memorisation criterion: %s", info)
    return model, curve


run_ku.loads_sharded = False  # the threshold and the starting accuracy evaluate the model before training
