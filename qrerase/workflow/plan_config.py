"""A workflow config -> the jobs it runs (:class:`qrerase.workflow.plan.JobSpec`), their plan, the
Snakemake ``resources`` of each resource class, the engine settings each training job runs with, and the
table ``qrerase plan`` prints.

The training jobs come from :mod:`qrerase.workflow.stages` (their recipes and engine settings, the
same ones their rules pass the scripts); :func:`refusal` is the one line with which ``qrerase plan``
and Snakemake's planning refuse a config whose jobs do not fit.

Resource classes (rules/common.smk ``resources_for``): ``train`` (pretrain, finetune, lora, every baseline),
``evaluate``, ``linalg`` (factors, erase_merged: CPU only), ``light``. A resource class's resources are the
largest over its jobs in the configured tracks; ``resources.<class>.<key>`` in the config overrides
any of them (mem_mb, runtime, gpu, cpus_per_task), and ``resources.<class>.processes`` (default 1) is
the processes per job, one GPU each on a GPU device.

Runtime (minutes) is a FLOP count at an assumed throughput, x3 for safety, never below a floor:
6 x active params per trained token (8 with checkpointing, 4 for LoRA), 2 per token of each frozen
reference, every example at ``max_length`` tokens, at 1e14 FLOP/s per GPU (~35 % of an A100/H100's
bf16 peak) or 5e10 per CPU thread; generation adds one weight read per new token at 2 TB/s.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import registry
from ..tracks import base as tracks
from .plan import DTYPE_BYTES, GIB, JobPlan, JobSpec, plan_job
from .shapes import ModelShape
from .stages import context, stage_job, track_section
from .stages import processes as _processes

#: The embedded default config: package data, in a checkout a link to config.yaml next to the Snakefile
#: (a built sdist / wheel holds a copy), so a non-editable install plans with it too.
DEFAULT_CONFIG = Path(__file__).resolve().parent / "config.yaml"
#: The resource classes a rule asks for (``resources_for(resource_class)``; config ``resources.<class>``).
RESOURCE_CLASSES = ("train", "evaluate", "linalg", "light")
FLOOR_MIN = {"train": (15, 60), "evaluate": (15, 30), "linalg": (10, 10), "light": (5, 5)}  # (cpu, gpu)
GPU_FLOPS, CPU_FLOPS, GPU_BANDWIDTH = 1e14, 5e10, 2e12
LIGHT_MB = 1000


def deep_update(base: dict, over: Mapping) -> dict:
    """Snakemake's --configfile merge: mappings merge key by key, anything else replaces."""
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            deep_update(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def retype_config_args(cfg: dict, entries: Iterable[str] | None) -> None:
    """Type ``--config key=VALUE`` values as a config file would. Snakemake reads a VALUE that is not a
    number or a boolean with YAML's base loader, which leaves every nested scalar a string
    (``unlearn={rank: 4}`` gives ``{'rank': '4'}``, which the schema refuses); each such VALUE is read
    again with the safe loader and merged over its key (:func:`deep_update`, Snakemake's merge), so
    ``--config`` overrides keep their precedence. A VALUE that is not valid YAML is left as Snakemake
    gave it (the schema names the key). Snakemake itself refuses a dotted key (``unlearn.scale=1``)
    before the workflow is read: nested keys are set with ``key={sub: value}`` or a ``--configfile``."""
    import yaml

    for entry in entries or ():
        key, sep, text = str(entry).partition("=")
        if not sep or not isinstance(cfg.get(key), (dict, list)):
            continue
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(value, Mapping) and isinstance(cfg[key], dict):
            deep_update(cfg[key], value)
        elif isinstance(value, list):
            cfg[key] = value


def text_jobs(cfg: Mapping, track: str) -> list[tuple[str, JobSpec, int]]:
    """(resource class, job, examples per epoch) of a text track: pretraining (:meth:`Track.pretrains`),
    fine-tuning, the task adapters, the baselines with settings in its baselines section, evaluation
    (its first non-empty evaluation section), factors and erase."""
    t = tracks.track(track)
    eval_p = _processes(cfg, "evaluate")
    ft = track_section(cfg, track, "finetune")
    n = t.examples(cfg)
    stages = ["pretrain"] if t.pretrains(cfg) else []
    stages += ["finetune", "lora"]
    configured = tracks.section_at(cfg, t.baselines_section)
    for method in cfg.get("methods", {}).get(track, []):
        if registry.method(method).plan_shape is not None and configured.get(method):
            stages.append(method)
    jobs = [("train", stage_job(cfg, track, stage), n) for stage in stages]
    ev = next((e for e in (tracks.section_at(cfg, k) for k in t.eval_sections) if e), {})
    evaluate = JobSpec(
        f"{track}:evaluate",
        "infer",
        batch_size=int(ev.get("batch_size", 32)),
        max_length=int(ev.get("max_length") or ft.get("max_length", 512)),  # null: no cap, planned at the training cap
        new_tokens=int(ev.get("max_new_tokens", 200)),
        processes=eval_p,
    )
    jobs.append(("evaluate", evaluate, 4 * int(ev.get("max_questions", 300))))
    lora_r = int(track_section(cfg, track, "lora")["r"])
    jobs.append(("linalg", JobSpec(f"{track}:factors", "linalg", lora_rank=lora_r), 0))
    jobs.append(("linalg", JobSpec(f"{track}:erase_merged", "linalg"), 0))
    return jobs


def runtime_min(
    shape: ModelShape,
    job: JobSpec,
    resource_class: str,
    examples: int,
    epochs: int,
    dtype: str,
    gpus: int,
    threads: int,
) -> int:
    """Wall minutes (module docstring): FLOPs / throughput x 3, at least the resource class's floor."""
    floor = FLOOR_MIN[resource_class][1 if gpus else 0]
    if job.workload == "linalg":
        return floor
    P = shape.count_params()
    active = P - (shape.experts - shape.experts_per_token) * 3 * shape.hidden * shape.intermediate * shape.layers
    per_token = {"train": 8 if job.checkpointing else 6, "lora": 4, "infer": 2}[job.workload] * active
    per_token += 2 * active * (job.references if job.reference_forwards is None else job.reference_forwards)
    seconds = per_token * examples * job.sequences * job.max_length * max(1, epochs)
    seconds /= GPU_FLOPS * gpus if gpus else CPU_FLOPS * max(1, threads)
    if job.workload == "infer" and job.new_tokens:
        reads = math.ceil(examples / job.batch_size) * job.new_tokens
        seconds += reads * DTYPE_BYTES[dtype] * P / (GPU_BANDWIDTH * max(1, gpus) if gpus else CPU_FLOPS)
    return max(floor, math.ceil(3 * seconds / 60))


def plan_config(cfg: Mapping) -> list[JobPlan]:
    """Every job of the config's tracks, planned."""
    return [row[1] for row in _planned(cfg)]


def _planned(cfg: Mapping) -> Iterable[tuple[str, JobPlan, int]]:
    threads = int(cfg.get("threads", 1))
    for track in cfg.get("tracks", []):
        shape, dtype, node = context(cfg, track)
        t = tracks.track(track)
        jobs, sections = t.plan_jobs(cfg), t.plan_sections(cfg)
        baselines = tracks.section_at(cfg, t.baselines_section)
        jobs = text_jobs(cfg, track) if jobs is None else jobs
        for resource_class, job, examples in jobs:
            plan = plan_job(shape, job, dtype, node)
            minutes = runtime_min(
                shape,
                job,
                resource_class,
                examples,
                _epochs(sections, baselines, job),
                dtype,
                plan.gpus,
                threads,
            )
            yield resource_class, plan, minutes


def refusal(cfg: Mapping) -> str | None:
    """The one line refusing a config with a job that does not fit (``qrerase plan`` after its table,
    rules/common.smk before any job runs): the first such job, its plan note (which names the config
    key to change) and how many more there are; ``None`` when every job fits."""
    misses = [p for p in plan_config(cfg) if not p.fits]
    if not misses:
        return None
    more = f" (and {len(misses) - 1} more job(s): qrerase plan lists each)" if len(misses) > 1 else ""
    return f"the memory plan: job {misses[0].name} does not fit: {misses[0].note}{more}"


def _epochs(sections: Mapping, baselines: Mapping, job: JobSpec) -> int:
    """A job's epochs: ``<stage>.epochs`` of its track's plan sections, else ``<stage>.epochs`` of its
    baselines section, else 1."""
    _, _, name = job.name.partition(":")
    for where in (sections.get(name), baselines.get(name)):
        if isinstance(where, Mapping) and "epochs" in where:
            return int(where["epochs"])
    return 1


def rule_resources(cfg: Mapping, resource_class: str, threads: int = 1) -> dict[str, Any]:
    """Snakemake resources of a resource class: the plan's largest job of that class, then the config's
    ``resources.<class>`` overrides. Keys as snakemake-executor-plugin-slurm reads them: mem_mb,
    runtime (min), gpu (--gpus; only when > 0), tasks_per_gpu (0 with gpu: the job is one task that
    sees all its GPUs; without it plugin versions 2.0 to 2.7.0 submit --ntasks-per-gpu=1, one task
    per GPU), nodes (for GPU / multi-process jobs: 1, or processes / gpus_per_node for a training job
    that spans nodes, :func:`qrerase.workflow.plan.nodes_of`), cpus_per_task (threads x processes per
    node for a multi-process job; mem_mb is per node too), slurm_partition, slurm_extra
    (docs/cluster.md lists the sbatch flags)."""
    if resource_class not in RESOURCE_CLASSES:
        raise ValueError(
            f"resources_for: the resource class must be one of {', '.join(RESOURCE_CLASSES)}, got {resource_class!r}"
        )
    over = (cfg.get("resources") or {}).get(resource_class) or {}
    rows = [(p, m) for k, p, m in _planned(cfg) if k == resource_class]
    procs = _processes(cfg, resource_class)
    if rows:
        mem_mb = max(math.ceil(p.host_bytes / 2**20) for p, _ in rows)
        runtime, gpu = max(m for _, m in rows), max(p.gpus for p, _ in rows)
    else:
        mem_mb, runtime, gpu = LIGHT_MB, FLOOR_MIN[resource_class][0], 0
    out: dict[str, Any] = {"mem_mb": int(over.get("mem_mb", mem_mb)), "runtime": int(over.get("runtime", runtime))}
    gpu = int(over.get("gpu", gpu))
    if gpu:
        out["gpu"] = gpu
        out["tasks_per_gpu"] = 0  # the launcher spawns the processes inside the job's one task
    nodes = max((p.nodes for p, _ in rows), default=1)
    if gpu or procs > 1:
        out["nodes"] = nodes
    if procs > 1 or "cpus_per_task" in over:  # per task: one task per node
        out["cpus_per_task"] = int(over.get("cpus_per_task", threads * procs // nodes))
    for key in ("slurm_partition", "slurm_extra"):
        if over.get(key):
            out[key] = over[key]
    return out


def format_table(cfg: Mapping) -> str:
    """The plan as a Markdown table (``qrerase plan``)."""
    lines = [
        "| job | resource class | processes | GPUs | GPUs needed | micro-batch x accum. | GiB per GPU | "
        "host GiB | runtime min | fits | note |",
        "|" + "---|" * 11,
    ]
    for resource_class, p, minutes in _planned(cfg):
        mb = f"{p.micro_batch} x {p.accumulation}" if p.micro_batch else "-"
        dev = f"{p.device_bytes / GIB:.1f}" if p.gpus else "-"
        lines.append(
            f"| {p.name} | {resource_class} | {p.processes} | {p.gpus} | {p.gpus_needed or '-'} | {mb} | {dev} | "
            f"{p.host_bytes / GIB:.1f} | {minutes} | "
            f"{'yes' if p.fits else 'NO'} | {p.note} |"
        )
    return "\n".join(lines)


def load_config(*configfiles: str | Path, jobs: bool = True) -> dict:
    """The workflow's config as Snakemake builds it: the embedded default (:data:`DEFAULT_CONFIG`, the
    Snakefile's config.yaml) updated by each ``--configfile`` in turn, then validated (one line naming
    the key; ``jobs=False`` for a plan that runs no job: :func:`qrerase.workflow.validation.validate`)."""
    from ..io import load_yaml
    from .validation import validate

    cfg = load_yaml(DEFAULT_CONFIG)
    for path in configfiles:
        over = load_yaml(path) or {}
        if not isinstance(over, Mapping):
            raise ValueError(f"{path}: expected a mapping of config keys")
        deep_update(cfg, over)
    validate(cfg, jobs=jobs)
    return cfg
