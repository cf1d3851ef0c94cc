"""End-to-end: training jobs with resources.train.processes 2 (`accelerate launch`, gloo workers on the
CPU) against the same jobs with 1 process, through the real snakemake CLI on the test configs: the text
jobs under FSDP2 (fine-tune, LoRA, the reference-model baselines NPO and KL), the speech fine-tune under
DDP.

The processes-1 run trains everything up to the compared models; the processes-2 run starts from a copy
of it and re-runs only the training rules under test (`--forcerun`), so both runs' updates start from
the same checkpoints. The text pair's 2-process snakemake commands run under strace: only rank 0 opens
weight files (support.rank_opens).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from support import REPO
from support.rank_opens import opens_by_rank, strace_missing, strace_prefix
from support.snakemake_cli import snakemake, write_config, write_speech_config

pytestmark = pytest.mark.workflow

EXP = "tofu_forget10"
TEXT = {  # rule -> (trained output, the checkpoint its update is measured from)
    "finetune": (f"results/{EXP}/models/full", f"results/{EXP}/models/pretrained"),
    "lora": (f"results/{EXP}/lora/forget", None),  # the adapter is the update (B starts at zero)
    "baseline": (f"results/{EXP}/baselines/npo/model", f"results/{EXP}/models/full"),  # reference-model baseline
    # the reference kept through training (KL on the retain batches), sharded like the model
    "baseline:kl": (f"results/{EXP}/baselines/kl/model", f"results/{EXP}/models/full"),
}
KL = {"epochs": 2, "lr": 1.0e-3, "batch_size": 8, "retain_weight": 1.0}  # as the test config's NPO
SPEECH = {"speech_finetune": ("results/speech/models/full", "results/speech/models/pretrained")}
LAUNCH = "launch --num_processes 2"  # after accelerate: "$QRERASE_ACCELERATE" (rules/common.smk)


def processes(n: int) -> dict:
    return {"resources__train__processes": n}


def weights(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    assert files, f"{directory}: no safetensors weights"
    out = {}
    for f in files:
        out.update({k: v.double() for k, v in load_file(f).items()})
    return out


def update(wd: Path, trained: str, start: str | None) -> torch.Tensor:
    """The trained weights minus the start checkpoint's, flattened (the adapter's tensors for LoRA; a
    tensor the start lacks in that shape, such as a new classification head, counts whole)."""
    after = weights(wd / trained)
    before = weights(wd / start) if start else {}
    parts = []
    for k in sorted(after):
        same = k in before and before[k].shape == after[k].shape
        parts.append((after[k] - before[k] if same else after[k]).flatten())
    return torch.cat(parts)


def record(wd: Path, output: str) -> dict:
    rel = output.removeprefix("results/")
    return json.loads((wd / "results/provenance/records" / f"{rel}.json").read_text())


def run_pair(
    tmp_path_factory, name: str, write, targets: dict, trace: bool = False, **two_overrides
) -> tuple[Path, Path]:
    """The 1-process run, then the 2-process re-run of the rules under test; ``trace``: the 2-process
    snakemake commands run under strace (logs ``<two>/trace/<i>.log``; :mod:`support.rank_opens`)."""
    one = tmp_path_factory.mktemp(f"{name}_p1")
    snakemake(one, *[t for t, _ in targets.values()], "--cores", "2", "--configfile", str(write(one, **processes(1))))
    two = tmp_path_factory.mktemp(f"{name}_p2")
    shutil.copytree(one / "results", two / "results")
    shutil.copytree(one / ".snakemake", two / ".snakemake", ignore=shutil.ignore_patterns("locks", "log"))
    cfg = write(two, **processes(2), **two_overrides)
    # the downstream rules first, then the upstream ones: each 2-process job starts from the checkpoint
    # its 1-process counterpart started from (a re-run fine-tune would move the baselines' start)
    upstream = [k for k in targets if k.split(":")[0] == "finetune"]
    (two / "trace").mkdir()
    for i, rules in enumerate(([k for k in targets if k not in upstream], upstream)):
        if not rules:
            continue
        prefix = (strace_prefix(two / "trace" / f"{i}.log") if trace else None) or ()
        snakemake(
            two,
            *[targets[k][0] for k in rules],
            "--cores",
            "2",
            "--configfile",
            str(cfg),
            "--rerun-triggers",
            "mtime",
            "--forcerun",
            *dict.fromkeys(label.split(":")[0] for label in rules),  # the rules
            prefix=prefix,
        )
    return one, two


def tofu_config(workdir: Path, **overrides) -> Path:
    return write_config(workdir, **overrides)


@pytest.fixture(scope="module")
def text_runs(tmp_path_factory):
    """The text rules with 2 processes under FSDP2 (`finetune.backend: fsdp`, which the LoRA and baseline
    jobs inherit): sharded parameters, gradients and optimiser states, rank 0 alone reading the weights."""
    return run_pair(tmp_path_factory, "text", text_config, TEXT, trace=True, finetune__backend="fsdp")


#: shorter training than the test config's (12 fine-tuning epochs): the comparison needs a few steps of
#: each job, not a model that learned its data
SHORT = {"pretrain__epochs": 1, "finetune__epochs": 3, "lora__epochs": 2}


def text_config(workdir: Path, **overrides) -> Path:
    """The test config with a KL baseline section (KL is not in its methods: built as a target only)."""
    return tofu_config(workdir, tofu__baselines__kl=KL, **{**SHORT, **overrides})


def speech_config_without_dropout(workdir: Path, **overrides) -> Path:
    """Dropout draws its masks per forward pass, so a batch split over 2 processes gets other masks
    than the whole batch in 1 (measured: 0.28 relative difference of the update at the test config's
    hidden_dropout 0.1); the comparison of the engine's data parallelism needs a deterministic forward."""
    return write_speech_config(workdir, **{"speech__model__tiny__hidden_dropout": 0.0, **overrides})


@pytest.fixture(scope="module")
def speech_runs(tmp_path_factory):
    return run_pair(tmp_path_factory, "speech", speech_config_without_dropout, SPEECH)


def assert_same_training(one: Path, two: Path, targets: dict) -> None:
    for label, (trained, start) in targets.items():
        rule = label.split(":")[0]  # "<rule>:<what>" for a second job of one rule
        rec = record(two, trained)
        assert rec["rule"] == rule and rec["world_size"] == 2, (rule, rec["world_size"])
        assert record(one, trained)["world_size"] == 1
        assert rec["end"] > record(one, trained)["end"], f"{rule}: not re-run with 2 processes"
        d1, d2 = update(one, trained, start), update(two, trained, start)
        assert d1.norm() > 0, f"{rule}: training did not move the weights"
        rel = ((d2 - d1).norm() / d1.norm()).item()
        assert rel < 1e-2, f"{rule}: 2 processes moved the weights {rel:.3g} (relative) away from 1 process"
        log = (two / "results/logs" / rule).glob("*.log")
        assert any("finished" in f.read_text() for f in log)


def test_only_rank_0_opens_the_weight_files_of_the_two_process_jobs(text_runs):
    """Every 2-process text job above (FSDP2: fine-tune, LoRA, NPO, KL) through the CLI, traced with
    strace: rank 0 opens the weights each job starts from, rank 1 opens no weight file at all (it
    builds the model from config.json, and the job's resume key takes weight files by size and mtime).
    The defect this caught: every rank hashed its inputs' weight files for the resume key."""
    _, two = text_runs
    logs = sorted((two / "trace").glob("*.log"))
    if not logs:
        pytest.skip(strace_missing() or "strace wrote no trace")
    opened = sum((opens_by_rank(log, two) for log in logs), Counter())
    by_rank = {r: {p for (rank, p), n in opened.items() if rank == r and n} for r in (0, 1)}
    starts = {str((two / start / "model.safetensors").resolve()) for _, start in TEXT.values() if start}
    starts.add(str((two / f"results/{EXP}/models/full/model.safetensors").resolve()))  # LoRA's base
    assert starts <= by_rank[0], sorted(starts - by_rank[0])
    assert not [p for p in by_rank[1] if p.endswith((".safetensors", ".bin"))], sorted(by_rank[1])
    # the trace does see rank 1: it read the job's data and the checkpoint's config and tokenizer
    assert str((two / f"results/{EXP}/data/forget.jsonl").resolve()) in by_rank[1]
    assert str((two / f"results/{EXP}/models/full/config.json").resolve()) in by_rank[1]


def test_text_training_with_two_processes_matches_one(text_runs):
    one, two = text_runs
    for label, (trained, _) in TEXT.items():  # the 2-process jobs ran sharded, as their plan row says
        assert record(two, trained)["params"]["engine"]["backend"] == "fsdp", label
    assert_same_training(one, two, TEXT)


def test_speech_training_with_two_processes_matches_one(speech_runs):
    assert_same_training(*speech_runs, SPEECH)


def test_dry_run_shows_the_launcher_for_training_jobs_only(tmp_path):
    cfg = tofu_config(tmp_path, **processes(2))
    proc = snakemake(tmp_path, "-n", "-p", "all", "tradeoff", "--cores", "2", "--configfile", str(cfg))
    commands = [line for line in proc.stdout.splitlines() if line.startswith("Shell command:")]
    launched = {line.split('"rule":"', 1)[1].split('"')[0] for line in commands if LAUNCH in line}
    assert {"pretrain", "finetune", "lora", "baseline", "tradeoff_baseline"} <= launched
    assert all(line.startswith("Shell command: ACCELERATE_USE_CPU=true ") for line in commands if LAUNCH in line)
    assert "rule evaluate:" in proc.stdout  # evaluation and the others still run as scripts, unlaunched
    one = snakemake(tmp_path, "-n", "-p", "--cores", "2", "--configfile", str(tofu_config(tmp_path, **processes(1))))
    assert "--num_processes" not in one.stdout
    assert '"$QRERASE_PYTHON" "$QRERASE_WORKFLOW/workflow_scripts/core/finetune.py" --threads' in one.stdout


def test_finetune_mode_lora_trains_an_adapter_and_saves_the_merged_checkpoint(text_runs, tmp_path):
    one, _ = text_runs
    shutil.copytree(one / "results", tmp_path / "results")
    cfg = tofu_config(tmp_path, finetune__mode="lora")
    full = f"results/{EXP}/models/full"
    snakemake(
        tmp_path, full, "--cores", "2", "--configfile", str(cfg), "--rerun-triggers", "mtime", "--forcerun", "finetune"
    )
    model = tmp_path / full
    assert (model / "config.json").is_file() and not (model / "adapter_config.json").exists()
    after, before = weights(model), weights(tmp_path / f"results/{EXP}/models/pretrained")
    assert set(after) == set(before)  # a plain full checkpoint: no lora_A / lora_B left
    lora_cfg = {
        **yaml.safe_load((REPO / "config.yaml").read_text())["lora"],
        **yaml.safe_load((REPO / "tests/configs/test.yaml").read_text()).get("lora", {}),
    }
    rec = record(tmp_path, full)
    assert rec["params"]["train"]["mode"] == "lora" and rec["world_size"] == 1
    assert rec["params"]["adapter"] == {k: lora_cfg[k] for k in ("r", "alpha", "dropout", "target_modules")}
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed, "the merged adapter changed no weight"
    assert all(k.endswith(".weight") and ".layers." in k for k in changed)  # only adapted projections
    assert not any("embed" in k or "norm" in k for k in changed)
    if isinstance(lora_cfg["target_modules"], list):
        assert all(any(f".{t}." in k for t in lora_cfg["target_modules"]) for k in changed)
    full_run = update(one, full, f"results/{EXP}/models/pretrained")
    lora_run = update(tmp_path, full, f"results/{EXP}/models/pretrained")
    assert (lora_run != 0).sum() < (full_run != 0).sum()  # low-rank: fewer weights moved than a full fine-tune
