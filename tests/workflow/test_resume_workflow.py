"""End-to-end: resumable training states through the real snakemake CLI (issue 34).

One working directory holds the tiny test run up to the pretrained model; the fine-tune of the full
model (``finetune.checkpoint_every: 1``: a state after every optimiser step) is killed (SIGKILL of the
snakemake process group) once states are on disk, and the rerun with ``--rerun-incomplete`` must:

* not resume a state saved with other settings (``finetune.lr`` changed), and write the weights of
  a clean run at the new lr;
* detect a bit-flipped state by its checksum (one log line naming the file), fall back to the
  previous state, and write the weights of a clean run;

and a fine-tune whose update overflows must fail the job with one line, writing no model. The clean
run (no checkpoints, never killed) is made in a copy of the working directory.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support import REPO
from support.snakemake_cli import kill_run, snakemake, write_config

pytestmark = pytest.mark.workflow

EXP = "tofu_forget10"
MODEL = f"results/{EXP}/models/full"
CURVE = f"results/{EXP}/models/full_loss.csv"
LOG = "results/logs/finetune/tofu_forget10_full.log"
RESUME = "results/.resume/finetune"
LR = 0.002  # the settings of the compared runs (test.yaml: 0.003)
SMALL = {"pretrain__epochs": 1, "finetune__epochs": 1}  # 27 fine-tuning steps


def config(wd: Path, name: str, **overrides) -> Path:
    return write_config(wd, name, **{**SMALL, **overrides})


def run(wd: Path, cfg: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return snakemake(wd, MODEL, "--cores", "1", "--configfile", str(cfg), *args, check=check)


def states(wd: Path) -> list[Path]:
    """The complete ``step-N`` states under results/.resume/finetune (renamed from their temporaries
    once written), newest first."""
    found = [p for p in (wd / RESUME).rglob("step-*") if p.is_dir() and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]), reverse=True)


def newest_step(wd: Path) -> int:
    found = states(wd)
    return int(found[0].name[5:]) if found else 0


def run_killed(wd: Path, cfg: Path, *args: str, min_step: int = 1, timeout: float = 240) -> list[Path]:
    """Start the fine-tune, SIGKILL the snakemake process group (snakemake and its job) as soon as the
    state of step ``min_step`` or later is on disk, remove the stale lock; returns the states left,
    newest first."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(wd)]
    cmd += [MODEL, "--cores", "1", "--configfile", str(cfg), *args]
    out = wd / "killed-run.txt"
    with open(out, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while newest_step(wd) < min_step:
            if proc.poll() is not None:
                tail = out.read_text()[-3000:]
                raise AssertionError(f"the run ended (rc {proc.returncode}) before a state of step {min_step}:\n{tail}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no resume state of step {min_step} or later under {RESUME} after {timeout} s")
            time.sleep(0.02)
    finally:
        kill_run(proc)  # the job's processes share the group: every one has died
    assert not (wd / MODEL).exists(), "the killed run wrote its model"
    snakemake(wd, "--unlock", "--configfile", str(cfg))
    return states(wd)


def assert_same_model(wd: Path, clean: Path) -> None:
    """The model and loss curve in ``wd`` equal the clean run's: every tensor bit for bit."""
    got, want = load_file(wd / MODEL / "model.safetensors"), load_file(clean / MODEL / "model.safetensors")
    assert sorted(got) == sorted(want)
    differ = [
        k
        for k in want
        if not (got[k].dtype == want[k].dtype and got[k].shape == want[k].shape and got[k].equal(want[k]))
    ]
    assert not differ, f"weights differ from the clean run's: {differ[:5]} ..."
    assert (wd / CURVE).read_text() == (clean / CURVE).read_text(), "loss curve differs from the clean run's"


def job_log(wd: Path) -> str:
    return (wd / LOG).read_text(encoding="utf-8", errors="replace")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A working directory with the test run up to the pretrained model (the fine-tune's input)."""
    wd = tmp_path_factory.mktemp("resume")
    cfg = config(wd, "base.yaml")
    snakemake(wd, f"results/{EXP}/models/pretrained", "--cores", "1", "--configfile", str(cfg))
    return wd


@pytest.fixture(scope="module")
def clean(base, tmp_path_factory) -> Path:
    """The fine-tune at lr ``LR`` in a copy of ``base``: never killed, no checkpoints."""
    wd = tmp_path_factory.mktemp("clean")
    shutil.copytree(base / "results", wd / "results")
    shutil.copytree(base / ".snakemake", wd / ".snakemake", ignore=shutil.ignore_patterns("locks", "log"))
    run(wd, config(wd, "clean.yaml", finetune__lr=LR))
    assert not (wd / "results/.resume").exists()
    return wd


def test_a_state_of_other_settings_is_not_resumed(base, clean):
    old = run_killed(base, config(base, "other.yaml", finetune__lr=0.005, finetune__checkpoint_every=1))
    assert old, "no state was left by the killed run"
    (base / LOG).unlink(missing_ok=True)
    run(base, config(base, "rerun.yaml", finetune__lr=LR, finetune__checkpoint_every=1), "--rerun-incomplete")
    log = job_log(base)
    assert "resumed training from" not in log, f"a state of lr 0.005 was resumed at lr {LR}:\n{log}"
    assert_same_model(base, clean)
    key = old[0].parents[1]  # results/.resume/finetune/<wildcards>/<key>/<run>/step-N
    assert re.search(
        rf"removing resume state {re.escape(str(key.relative_to(base)))}: saved by a different job spec", log
    ), log
    assert not key.exists() and not (base / "results/.resume").exists()


def test_a_corrupt_state_is_named_and_skipped(base, clean):
    cfg = config(base, "rerun.yaml", finetune__lr=LR, finetune__checkpoint_every=1)
    left = run_killed(base, cfg, "--forcerun", "finetune", min_step=2)
    newest, previous = left[0], (left[1] if len(left) > 1 else None)
    manifests = {state.name: (state / "checksums.sha256").is_file() for state in left}
    weights = newest / "trained_0" / "__0_0.distcp"  # the trained weights and their optimiser state
    data = bytearray(weights.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):  # bytes inside the file: still a readable file
        data[i] ^= 0xFF
    weights.write_bytes(bytes(data))
    (base / LOG).unlink(missing_ok=True)
    run(base, cfg, "--rerun-incomplete")
    log = job_log(base)
    corrupt = [line for line in log.splitlines() if "is corrupt" in line]
    assert len(corrupt) == 1, f"expected one line naming the corrupt state:\n{log}"
    assert f"{newest.relative_to(base)} is corrupt: trained_0/__0_0.distcp fails its checksum" in corrupt[0], corrupt[0]
    then = f"falling back to {previous.name}" if previous else "starting over"
    assert corrupt[0].endswith(f"removed, {then}"), corrupt[0]
    if previous:
        assert f"resumed training from {previous.relative_to(base)}" in log, log
    assert_same_model(base, clean)
    # the killed run's states: each with its checksum manifest, the two newest kept (one to fall back on;
    # a third only for the moment between a new state's rename and the oldest one's removal)
    assert len(left) in (2, 3) and all(manifests.values()), manifests
    assert not (base / "results/.resume").exists()


def test_an_overflowing_update_fails_the_job_and_writes_no_model(base):
    """One optimiser step (1 epoch, a batch of 512 >= the 417 QA pairs) at lr 1e39: its loss and gradient
    are finite, the update overflows float32. The job fails with one line naming the weight, and no
    model (nor a temporary of it, nor a record) is written."""
    (base / LOG).unlink(missing_ok=True)
    cfg = config(base, "diverge.yaml", finetune__lr=1.0e39, finetune__epochs=1, finetune__batch_size=512)
    proc = run(base, cfg, check=False)
    assert proc.returncode != 0, f"the overflowing fine-tune succeeded:\n{job_log(base)[-2000:]}"
    models = base / MODEL
    assert not models.exists() and not list(models.parent.glob(".full*")), "a model (or its temporary) was written"
    assert not (base / "results/provenance/records" / f"{EXP}/models/full.json").exists()
    failed = [line for line in job_log(base).splitlines() if "rule finetune failed" in line]
    assert len(failed) == 1 and re.search(
        r"FloatingPointError: full: trained weight [\w.]+ is not finite \(lower the learning rate\)$", failed[0]
    ), failed
    assert "FloatingPointError: full: trained weight" in proc.stderr
