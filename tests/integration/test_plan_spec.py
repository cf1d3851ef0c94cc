"""One source for what a training job runs: for every shipped config, each training job's spec (what
its rule passes the script: processes, backend, micro-batch, accumulation, gradient checkpointing) is
the memory plan's row; the plan refuses a job that does not fit its GPUs (DDP's full replica) with one
line naming the job and the config key, in `qrerase plan` and in Snakemake's planning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import REPO as ROOT
from support.shipped import shipped_config
from support.snakemake_cli import snakemake, write_yaml_config

from qrerase import engine
from qrerase.baselines.text import TextBaselineConfig
from qrerase.cli import main
from qrerase.text.training import ENGINE_KEYS, TrainConfig
from qrerase.tracks.speech.baselines import SpeechBaselineConfig
from qrerase.tracks.task_level.baselines import TaskLevelBaselineConfig
from qrerase.workflow.launch import launcher
from qrerase.workflow.plan import GIB, JobSpec, device_bytes
from qrerase.workflow.plan_config import load_config, plan_config, refusal
from qrerase.workflow.shapes import KNOWN_SHAPES, ModelShape
from qrerase.workflow.stages import engine_settings, job_settings, stage_job, stage_recipe

CONFIGS = [
    "config.yaml",
    *(shipped_config(str(p.relative_to(ROOT)), ROOT) for p in sorted((ROOT / "config").glob("*.yaml"))),
]
#: keys of a `train` / `lora` section the scripts drop before building TrainConfig
NOT_TRAINING = ("mode", "lora", "freeze_feature_encoder", "r", "alpha", "dropout", "target_modules", "base", "adapters")


def script_config(track: str, stage: str, settings: dict):
    """The config object the stage's workflow script builds from `{**recipe, **engine}` (the same
    constructors: workflow_scripts/*.py and qrerase.tracks.task_level.runners)."""
    if stage in ("pretrain", "finetune", "lora"):
        return TrainConfig.from_dict({k: v for k, v in settings.items() if k not in NOT_TRAINING})
    if track == "speech":
        return SpeechBaselineConfig.from_dict({**settings, "method": stage})
    if track == "task_level":
        if stage in ("kga", "ku"):
            return TaskLevelBaselineConfig.from_dict({**settings, "method": stage, "max_length": 128})
        return TextBaselineConfig.from_dict({**settings, "method": stage})
    return TextBaselineConfig.from_dict(settings)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_training_job_runs_what_its_plan_row_planned(name):
    cfg = load_config(ROOT / name)
    procs = cfg["resources"]["train"].get("processes", 1)  # what rules/common.smk launch() starts
    prefix = launcher(procs, cfg["model"].get("device", "cpu"), "python", "accelerate", "launch.yaml")
    rows = [p for p in plan_config(cfg) if p.name.split(":")[1] not in ("evaluate", "factors", "erase_merged")]
    assert rows, name
    for row in rows:
        track, stage = row.name.split(":")
        engine_param = engine_settings(cfg, track, stage)  # the rule's `engine` param
        assert set(engine_param) == {"backend", "gradient_checkpointing", "micro_batch_size"} <= set(ENGINE_KEYS)
        job = script_config(track, stage, {**stage_recipe(cfg, track, stage), **engine_param})
        assert job_settings(cfg, track, stage) == {**stage_recipe(cfg, track, stage), **engine_param}
        # what the engine does with it (qrerase.engine.train_steps) is the plan's row
        assert row.processes == procs and (f"--num_processes {procs} " in prefix) == (procs > 1), row.name
        assert engine.micro_plan(job.batch_size, job.micro_batch_size, procs) == (row.micro_batch, row.accumulation)
        assert (job.backend, job.gradient_checkpointing) == (row.backend, row.checkpointing), row.name
        if procs > 1 and cfg["model"].get("device", "cpu") != "cpu":  # a GPU preset: sharded, and it fits
            assert row.backend == "fsdp" and row.fits, row


def test_the_8b_baselines_run_with_the_planned_micro_batches_and_checkpointing():
    """The defect this fixes: the plan gave GA micro-batches of 2 with checkpointing, the job ran
    400 / 8 = 50 sequences per pass without it (196 GiB per GPU as run)."""
    cfg = load_config(ROOT / "config" / "llama3-8b.yaml")
    ga = next(p for p in plan_config(cfg) if p.name == "tofu:ga")
    assert (ga.micro_batch, ga.accumulation, ga.checkpointing, ga.backend) == (2, 25, True, "fsdp")
    job = TextBaselineConfig.from_dict(job_settings(cfg, "tofu", "ga"))
    assert engine.micro_plan(job.batch_size, job.micro_batch_size, 8) == (2, 25) and job.gradient_checkpointing
    assert ga.fits and ga.device_bytes < 80 * GIB
    shape = KNOWN_SHAPES["meta-llama/Meta-Llama-3-8B"]
    as_run_before = JobSpec("tofu:ga", "train", 400, 500, processes=8)  # ddp, no checkpointing, micro 50
    assert device_bytes(shape, as_run_before, "bfloat16", 50, 8) > 190 * GIB


def test_ddp_keeps_a_full_replica_and_fsdp2_shards_it():
    """DDP's per-GPU bytes do not fall with the process count (only activations do); FSDP2's fall
    towards the gathered units; accumulation adds FSDP2's unsharded gradients (a x P)."""
    shape = KNOWN_SHAPES["meta-llama/Meta-Llama-3-8B"]
    P = shape.count_params()
    job = JobSpec("finetune", "train", 32, 500, checkpointing=True)
    ddp = [device_bytes(shape, job, "bfloat16", 4, n, "ddp") for n in (2, 4, 8)]
    fsdp = [device_bytes(shape, job, "bfloat16", 4, n, "fsdp") for n in (2, 4, 8)]
    assert ddp[0] == ddp[1] == ddp[2] >= 16 * P  # fp32 masters, gradients and AdamW moments on every GPU
    assert fsdp[0] > fsdp[1] > fsdp[2] and fsdp[2] < 16 * P / 8 + 2 * P
    one = device_bytes(shape, job, "bfloat16", 4, 8, "fsdp")  # 4 x 8 = 32: no accumulation
    accumulating = device_bytes(shape, JobSpec("ga", "train", 400, 500, checkpointing=True), "bfloat16", 4, 8, "fsdp")
    assert accumulating - one == 2 * P - 2 * (shape.layer_params() + shape.root_params())


def test_a_lora_mode_baseline_holds_no_reference_copy_but_still_runs_its_forwards(tmp_path):
    """In LoRA mode a baseline's π_ref is the trained model with its adapter disabled
    (qrerase.baselines.text.AdapterDisabled): no second copy of the weights on the GPU or the host.
    The defect: the plan counted a·P more for KL / NPO / DPO (8B on one H100: 57.2 GiB planned,
    34.6 / 37.6 measured by `qrerase smoke`). The reference forwards still count in the run time."""
    from dataclasses import replace

    from qrerase.workflow.plan_config import runtime_min

    over = tmp_path / "lora.yaml"
    over.write_text("tofu:\n  baselines:\n    mode: lora\n")
    lora_cfg = load_config(ROOT / "config/llama3-8b.yaml", over)
    full_cfg = load_config(ROOT / "config/llama3-8b.yaml")
    lora = {p.name: p for p in plan_config(lora_cfg)}
    full = {p.name: p for p in plan_config(full_cfg)}
    shape = KNOWN_SHAPES["meta-llama/Meta-Llama-3-8B"]
    for name in ("tofu:kl", "tofu:npo", "tofu:dpo"):
        spec = stage_job(lora_cfg, "tofu", name.split(":")[1])
        assert (spec.workload, spec.references, spec.reference_forwards) == ("lora", 0, 1), name
        assert stage_job(full_cfg, "tofu", name.split(":")[1]).references == 1, name
        copy = replace(spec, references=1, reference_forwards=None)  # what was planned before
        micro, n = lora[name].micro_batch, lora[name].processes
        assert device_bytes(shape, copy, "bfloat16", micro, n) - device_bytes(shape, spec, "bfloat16", micro, n) >= (
            2 * shape.count_params() // n
        )
        assert runtime_min(shape, spec, "train", 4000, 5, "bfloat16", 8, 8) == runtime_min(
            shape, copy, "train", 4000, 5, "bfloat16", 8, 8
        )
    assert lora["tofu:kl"].host_bytes == lora["tofu:graddiff"].host_bytes < full["tofu:kl"].host_bytes


def test_the_root_group_is_every_parameter_outside_the_decoder_layers():
    from transformers import LlamaConfig, LlamaForCausalLM

    for tied in (False, True):
        shape = ModelShape("t", 2, 64, 160, 300, 4, 2, tied_embeddings=tied)
        model = LlamaForCausalLM(
            LlamaConfig(
                hidden_size=64,
                intermediate_size=160,
                num_hidden_layers=2,
                vocab_size=300,
                num_attention_heads=4,
                num_key_value_heads=2,
                tie_word_embeddings=tied,
            )
        )
        layer = sum(p.numel() for p in model.model.layers[0].parameters())
        outside = sum(p.numel() for n, p in model.named_parameters() if ".layers." not in n)
        assert (shape.layer_params(), shape.root_params()) == (layer, outside)


def _preset(tmp_path: Path, name: str = "8b.yaml", **overrides) -> Path:
    """config/llama3-8b.yaml with ``overrides`` (``a__b``: key a.b) and the absolute TOFU root, as tmp_path/name."""
    cfg = yaml.safe_load((ROOT / "config" / "llama3-8b.yaml").read_text())
    cfg["tofu"]["data"]["root"] = str(ROOT / "data" / "tofu")
    return write_yaml_config(tmp_path, name, cfg, overrides)


@pytest.mark.parametrize(
    "overrides, job, key",
    [
        ({"finetune__backend": "ddp"}, "tofu:finetune", "finetune.backend: fsdp"),
        (
            {"tofu__baselines__ga": {"epochs": 5, "lr": 5e-5, "batch_size": 400, "backend": "ddp"}},
            "tofu:ga",
            "tofu.baselines.ga.backend: fsdp",
        ),
    ],
)
def test_the_plan_refuses_ddp_whose_full_replica_does_not_fit(tmp_path, capsys, overrides, job, key):
    path = _preset(tmp_path, **overrides)
    line = refusal(load_config(path))
    assert line is not None and "\n" not in line and f"job {job} does not fit" in line and key in line, line
    assert "backend ddp keeps a full replica" in line
    assert main(["plan", "--configfile", str(path)]) == 2
    out, err = capsys.readouterr()
    assert f"| {job} |" in out  # the table first, then the one line
    assert err.strip().splitlines() == [f"qrerase plan: error: {line}"]


def test_snakemake_planning_refuses_it_and_passes_every_training_job_its_plan(tmp_path):
    """Through the CLI: the dry run of the 8B preset shows each training job's engine param (in its
    --job spec) equal to the plan's settings, launched on 8 processes; with DDP it stops before any job."""
    cfg = load_config(ROOT / "config" / "llama3-8b.yaml")
    proc = snakemake(tmp_path, "-n", "-p", "--configfile", str(_preset(tmp_path)))
    commands = [line for line in proc.stdout.splitlines() if line.startswith("Shell command:") and "--job" in line]
    seen = set()
    for line in commands:
        assert " launch --num_processes 8 " in line, line[:200]
        spec = json.loads(line.rsplit("--job ", 1)[1].strip().strip("'").replace("'\"'\"'", "'"))
        stage = spec["wildcards"].get("method") or spec["rule"]
        assert spec["params"]["engine"] == engine_settings(cfg, "tofu", stage), stage
        seen.add(stage)
    assert seen == {"finetune", "lora", "ga", "graddiff", "kl", "npo", "dpo", "flat"}
    refused = snakemake(
        tmp_path, "-n", "--configfile", str(_preset(tmp_path, "ddp.yaml", finetune__backend="ddp")), check=False
    )
    assert refused.returncode != 0 and "job tofu:finetune does not fit" in refused.stdout + refused.stderr
    assert not (tmp_path / "results").exists()
