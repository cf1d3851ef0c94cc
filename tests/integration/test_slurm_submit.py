"""The sbatch command of a planned job, built by the installed snakemake-executor-plugin-slurm itself.

No Slurm is needed: the plugin's ``get_submit_command`` and ``set_gres_string`` are what its executor
calls to build a job's ``sbatch`` line (``Executor.run_job``), from the job's resources as Snakemake
evaluates them (a ``ResourceList``) and its threads. The resources are the plan's
(``rule_resources``, as rules/common.smk ``resources_for`` gives them to every rule), merged over the
profile's default resources as Snakemake does. A GPU job must be one task that sees all its GPUs:
``--gpus=N``, ``--cpus-per-task`` as planned, no ``--ntasks-per-gpu`` (docs/cluster.md).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pytest
import yaml
from support import REPO

slurm = pytest.importorskip("snakemake_executor_plugin_slurm", reason="the `cluster` extra is not installed")
from snakemake.iocontainers import ResourceList  # noqa: E402
from snakemake_executor_plugin_slurm import ExecutorSettings  # noqa: E402
from snakemake_executor_plugin_slurm.submit_string import get_submit_command  # noqa: E402
from snakemake_executor_plugin_slurm.utils import set_gres_string  # noqa: E402
from snakemake_executor_plugin_slurm.validation import validate_slurm_extra  # noqa: E402

from qrerase.workflow.plan_config import load_config, rule_resources  # noqa: E402

PROFILE = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
PRESETS = sorted(p.name for p in (REPO / "config").glob("*.yaml"))


@dataclass
class SubmittedJob:
    """What the plugin reads of the Snakemake job it submits: the evaluated resources (Snakemake's
    own ResourceList, as ``Job.resources`` returns them) and the rule's threads."""

    resources: ResourceList
    threads: int


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # the presets' data paths are relative to the checkout


def job_of(cfg: dict, kind: str) -> SubmittedJob:
    resources = {**PROFILE["default-resources"], **rule_resources(cfg, kind, threads=cfg["threads"])}
    return SubmittedJob(ResourceList(fromdict=resources), cfg["threads"])


def sbatch(job: SubmittedJob) -> list[str]:
    """The plugin's sbatch command for ``job`` (Executor.run_job's steps), split into words."""
    validate_slurm_extra(job)
    params = {
        "run_uuid": "run-id",
        "slurm_logfile": ".snakemake/slurm_logs/rule_finetune/%j.log",
        "comment_str": "rule_finetune",
        "account": f" -A {shlex.quote(job.resources.slurm_account)}",
        "partition": f" -p {shlex.quote(str(job.resources.slurm_partition))}",
        "workdir": str(REPO),
    }
    call = get_submit_command(job, params, settings=ExecutorSettings(), failed_nodes=set())
    return shlex.split(call + set_gres_string(job))


def test_the_llama3_8b_finetune_is_one_task_with_8_gpus_and_64_cpus():
    cfg = load_config(REPO / "config" / "llama3-8b.yaml")
    words = sbatch(job_of(cfg, "train"))
    assert words[:2] == ["sbatch", "--parsable"]
    assert "--gpus=8" in words and "--cpus-per-task=64" in words and "--nodes=1" in words
    assert not [w for w in words if w.startswith(("--ntasks", "-n", "--cpus-per-gpu", "--gres"))], words


def test_every_planned_gpu_job_of_every_preset_is_one_task_that_sees_all_its_gpus():
    checked = set()
    for name in PRESETS:
        cfg = load_config(REPO / "config" / name)
        for kind in ("train", "evaluate"):
            planned = rule_resources(cfg, kind, cfg["threads"])
            if "gpu" not in planned:
                continue
            checked.add((name, kind))
            words = sbatch(job_of(cfg, kind))
            assert [w for w in words if w.startswith("--gpus")] == [f"--gpus={planned['gpu']}"], (name, kind, words)
            # no task flag at all: Slurm's default of one task, in which the launcher starts the processes
            assert not [w for w in words if w.startswith(("--ntasks", "-n", "--cpus-per-gpu"))], (name, kind, words)
            cpus = [w for w in words if w.startswith("--cpus-per-task=")]
            assert cpus == [f"--cpus-per-task={planned.get('cpus_per_task', cfg['threads'])}"], (name, kind, words)
            assert words[words.index("--mem") + 1] == str(planned["mem_mb"])
            partition = planned.get("slurm_partition", PROFILE["default-resources"]["slurm_partition"])
            assert words[words.index("-p") + 1] == partition
    trained_on_gpus = {name for name, kind in checked if kind == "train"}
    assert {"llama3-8b.yaml", "llama3-70b.yaml", "mixtral-8x7b.yaml"} <= trained_on_gpus, checked


def test_the_plugin_reads_the_task_settings_so_the_checks_above_can_fail():
    """Without ``tasks_per_gpu: 0`` a task count asks for one task per GPU (and plugin versions 2.0
    to 2.7.0 add ``--ntasks-per-gpu=1`` even with none): 8 tasks of 64 CPUs for an 8-GPU job."""
    cfg = load_config(REPO / "config" / "llama3-8b.yaml")
    job = job_of(cfg, "train")
    assert job.resources.get("tasks_per_gpu") == 0
    resources = {k: v for k, v in job.resources.items() if k != "tasks_per_gpu"}
    words = sbatch(SubmittedJob(ResourceList(fromdict={**resources, "tasks": 1}), job.threads))
    assert "--ntasks-per-gpu=1" in words


def test_a_cpu_job_is_one_task():
    cfg = load_config(REPO / "tests" / "configs" / "test.yaml")
    words = sbatch(job_of(cfg, "train"))
    assert "--ntasks=1" in words and not [w for w in words if w.startswith("--gpus")]
    assert "tasks_per_gpu" not in rule_resources(cfg, "train", cfg["threads"])
