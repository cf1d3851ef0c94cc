"""The training jobs ("stages") of a config's tracks: the recipe each one's rule passes its script,
and the engine settings it runs with, which are its memory-plan row.

One source for what a training job runs: a training rule passes its script the recipe of
:func:`stage_recipe` (the config section with the track's overrides) and, as its ``engine`` param,
:func:`engine_settings` (``backend``, ``gradient_checkpointing``, ``micro_batch_size`` of the job's
plan row), which the script lays over the recipe (:func:`job_settings`); the plan's job
(:func:`stage_job`, planned by :mod:`qrerase.workflow.plan_config`) is built from the same recipe and
the same engine keys, so the memory plan and the job spec cannot disagree. ``backend`` and
``gradient_checkpointing`` of a training section that sets neither come from its track's fine-tuning
section (``finetune``, with ``task_level.finetune`` for the task-level track; ``speech.finetune``);
``micro_batch_size`` is the section's own, else the plan's pick
(:func:`qrerase.workflow.plan.plan_job`). The processes are ``resources.train.processes``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import registry
from ..tracks import base as tracks
from .plan import REPLICATED, JobSpec, Node, plan_job
from .shapes import ModelShape, resolve_shape


def processes(cfg: Mapping, resource_class: str) -> int:
    """``resources.<class>.processes`` (default 1): the processes of a job of resource class ``resource_class``, the
    launcher's ``--num_processes`` (rules/common.smk ``launch``)."""
    n = (cfg.get("resources", {}).get(resource_class) or {}).get("processes", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"resources.{resource_class}.processes: expected an integer >= 1, got {n!r}")
    return n


def node_of(cfg: Mapping, device: str) -> Node:
    """The node a job is planned on: ``resources.gpus_per_node`` (0 GPUs for ``device: cpu``),
    ``resources.gpu_mem_gb``, ``resources.node_mem_gb``."""
    res = cfg.get("resources", {})
    gpus = 0 if device == "cpu" else int(res.get("gpus_per_node", 8))
    return Node(gpus, float(res.get("gpu_mem_gb", 80)), float(res.get("node_mem_gb", 1000)))


#: Engine keys a training section without them takes from its track's fine-tuning section.
INHERITED_ENGINE_KEYS = {"backend": REPLICATED, "gradient_checkpointing": False}


def track_section(cfg: Mapping, track: str, name: str) -> dict:
    """A text track's ``pretrain`` / ``finetune`` / ``lora`` section (``tokenizer``: ``model.tokenizer``)
    with the track's overrides (:meth:`qrerase.tracks.Track.training_section`; rules/common.smk ``exp_section``)."""
    return tracks.track(track).training_section(cfg, name)


@dataclass(frozen=True)
class Stage:
    """One training job of a track before planning (its workload: ``train`` or ``lora``).

    recipe: what its rule passes the training script, less the engine keys; chain: ``(config key,
    section)`` pairs where an engine key is looked up, most specific first (its own sections, the
    first ``own`` of them, then its track's fine-tuning section); the rest: :class:`JobSpec`'s fields.
    """

    name: str
    workload: str
    recipe: dict
    chain: tuple[tuple[str, Mapping], ...]
    own: int
    sequences: int = 1
    references: int = 0
    max_length: int = 512
    lora_rank: int = 0
    hint: str = ""
    planned: bool = True  # False: a baseline registered without a plan_shape (not in the plan)
    reference_forwards: int | None = None  # JobSpec.reference_forwards

    def lookup(self, key: str, own_only: bool = False) -> tuple[Any, str]:
        """``(value, config key)`` of an engine key: the first section of the chain that sets it
        (own sections only for ``own_only``), else ``(None, <least specific section>.<key>)``."""
        chain = self.chain[: self.own] if own_only else self.chain
        for where, section in chain:
            if isinstance(section, Mapping) and key in section:
                return section[key], f"{where}.{key}"
        return None, f"{chain[-1][0]}.{key}"


def text_stage(cfg: Mapping, t: tracks.Track, stage: str) -> Stage:
    """A text track's stage: pretrain / finetune / lora (its training sections, :meth:`Track.chain`), or a
    baseline (:meth:`Track.baseline_stage`)."""
    ft_chain = t.chain(cfg, "finetune")
    ft = t.training_section(cfg, "finetune")
    if stage not in ("pretrain", "finetune", "lora"):
        own = t.baseline_stage(cfg, stage)
        return text_baseline_stage(cfg, t, stage) if own is None else own
    section = t.training_section(cfg, stage)
    own = t.chain(cfg, stage)
    chain = own if stage == "finetune" else own + ft_chain
    workload, rank, hint = "train", 0, "use finetune.mode: lora"
    if stage == "lora":
        workload, rank, hint = "lora", int(section["r"]), ""
    elif stage == "finetune" and ft.get("mode") == "lora":
        shape = ft.get("lora") or t.training_section(cfg, "lora")
        workload, rank, hint = "lora", int(shape["r"]), ""
    return Stage(
        f"{t.name}:{stage}",
        workload,
        section,
        tuple(chain),
        len(own),
        max_length=int(section.get("max_length", 512)),
        lora_rank=rank,
        hint=hint,
    )


def text_baseline_stage(cfg: Mapping, t: tracks.Track, stage: str) -> Stage:
    """A text baseline's stage: ``<baselines_section>.<m>`` with the section's mode, max_length and LoRA
    shape (rules/tofu/common.smk), the track's fine-tuning section after it in the chain. In ``lora``
    mode a method's frozen reference is its own base with the adapter disabled, so the stage holds no
    reference copy (``references`` 0, whatever the method's ``plan_shape`` says for full mode)."""
    ft = t.training_section(cfg, "finetune")
    plan_shape = registry.method(stage).plan_shape
    seqs, refs = plan_shape or (1, 0)
    where = t.baselines_section
    bl = tracks.section_at(cfg, where)
    lora = bl.get("lora") or {}
    own = dict(bl.get(stage) or {})
    recipe = {
        "method": stage,
        **own,
        "mode": bl.get("mode", "full"),
        "max_length": bl.get("max_length", ft.get("max_length", 512)),
        "lora_r": lora.get("r"),
        "lora_alpha": lora.get("alpha"),
        "lora_dropout": lora.get("dropout", 0.0),
        "lora_target_modules": list(lora.get("target_modules") or []),
    }
    lora_mode = recipe["mode"] == "lora"
    return Stage(
        f"{t.name}:{stage}",
        "lora" if lora_mode else "train",
        recipe,
        ((f"{where}.{stage}", own), *t.chain(cfg, "finetune")),
        1,
        seqs,
        0 if lora_mode else refs,  # LoRA mode: π_ref is the trained model with its adapter disabled
        int(recipe["max_length"]),
        int(lora.get("r", 0)) if lora_mode else 0,
        "" if lora_mode else f"use {where}.mode: lora",
        plan_shape is not None,
        refs,
    )


def stage_of(cfg: Mapping, track: str, stage: str) -> Stage:
    """The training job ``stage`` (``pretrain``, ``finetune``, ``lora`` or a baseline's name) of
    ``track``, before planning."""
    t = tracks.track(track)
    own = t.stage(cfg, stage)
    return text_stage(cfg, t, stage) if own is None else own


def stage_job(cfg: Mapping, track: str, stage: str) -> JobSpec:
    """The plan's job of a training stage: its recipe's batch size, the engine keys of
    :meth:`Stage.lookup` (``backend``, ``gradient_checkpointing`` inherited from the track's
    fine-tuning section; ``micro_batch_size`` the stage's own), ``resources.train.processes``."""
    st = stage_of(cfg, track, stage)
    backend, backend_key = st.lookup("backend")
    ckpt, _ = st.lookup("gradient_checkpointing")
    micro, micro_key = st.lookup("micro_batch_size", own_only=True)
    return JobSpec(
        st.name,
        st.workload,
        batch_size=int(st.recipe["batch_size"]),
        max_length=st.max_length,
        sequences=st.sequences,
        references=st.references,
        reference_forwards=st.reference_forwards,
        lora_rank=st.lora_rank,
        checkpointing=bool(INHERITED_ENGINE_KEYS["gradient_checkpointing"] if ckpt is None else ckpt),
        micro_batch_size=micro,
        processes=processes(cfg, "train"),
        backend=str(INHERITED_ENGINE_KEYS["backend"] if backend is None else backend),
        section=micro_key.rpartition(".")[0],
        backend_key=backend_key,
        hint=st.hint,
    )


def context(cfg: Mapping, track: str) -> tuple[ModelShape, str, Node]:
    """(shape, dtype, node) a track's jobs are planned on."""
    own = tracks.track(track).planning_model(cfg)
    if own is None:
        model = cfg["model"]
        own = model, resolve_shape(model, (model.get("tokenizer") or {}).get("vocab_size"))
    model, shape = own
    return shape, model.get("dtype", "float32"), node_of(cfg, model.get("device", "cpu"))


def engine_settings(cfg: Mapping, track: str, stage: str) -> dict[str, Any]:
    """The engine keys training job ``<track>:<stage>`` runs with, as its plan row has them:
    ``backend``, ``gradient_checkpointing`` and ``micro_batch_size`` (the planned micro-batch;
    ``None`` where it is the whole per-process share ``ceil(batch_size / processes)``, which is what
    ``None`` means to the engine, :func:`qrerase.engine.micro_plan`). The processes are
    ``resources.train.processes`` (the launcher's ``--num_processes``). A baseline registered
    without a ``plan_shape`` is not planned: its own ``micro_batch_size`` (or ``None``)."""
    job = stage_job(cfg, track, stage)
    micro = job.micro_batch_size
    if stage_of(cfg, track, stage).planned:
        shape, dtype, node = context(cfg, track)
        micro = plan_job(shape, job, dtype, node).micro_batch
    share = math.ceil(job.batch_size / job.processes)
    return {
        "backend": job.backend,
        "gradient_checkpointing": job.checkpointing,
        "micro_batch_size": None if micro is None or micro >= share else int(micro),
    }


def stage_recipe(cfg: Mapping, track: str, stage: str) -> dict[str, Any]:
    """The recipe a training rule passes its script for ``<track>:<stage>`` (its ``train`` / ``lora``
    / ``baseline`` / ``cfg`` param; rules/common.smk ``exp_section`` and ``stage_params``): the
    config section with the track's overrides, a text baseline's with its method, mode,
    ``max_length`` and LoRA shape as :class:`qrerase.baselines.text.TextBaselineConfig` reads them."""
    return dict(stage_of(cfg, track, stage).recipe)


def job_settings(cfg: Mapping, track: str, stage: str) -> dict[str, Any]:
    """What the training script of ``<track>:<stage>`` trains with: its recipe param overlaid by its
    ``engine`` param, ``{**stage_recipe(...), **engine_settings(...)}`` (the scripts'
    ``{**p.<recipe>, **p.engine}``)."""
    return {**stage_recipe(cfg, track, stage), **engine_settings(cfg, track, stage)}
