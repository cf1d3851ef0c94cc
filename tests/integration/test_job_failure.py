"""A failed job on the terminal: one line with its cause and the log's path, the traceback in the log
(qrerase.workflow.job.job), through a small real Snakemake workflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

SNAKEFILE = """
rule boom:
    output:
        "results/out.txt",
    log:
        "results/logs/boom.log",
    script:
        "boom.py"
"""

SCRIPT = """
from qrerase.workflow.job import job

with job(snakemake):
    raise ValueError("data/x.jsonl:3: field 'answer' missing")
"""


@pytest.mark.parametrize("debug", [False, True])
def test_a_failed_job_prints_one_line_and_logs_the_traceback(tmp_path: Path, debug: bool):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "boom.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("QRERASE_DEBUG", None)
    if debug:
        env["QRERASE_DEBUG"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "-d", str(tmp_path), "-s", str(tmp_path / "Snakefile")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode != 0 and not (tmp_path / "results/out.txt").exists()
    cause = "rule boom failed: ValueError: data/x.jsonl:3: field 'answer' missing"
    log = (tmp_path / "results/logs/boom.log").read_text().rstrip().splitlines()
    assert log[-1].endswith(cause)  # the log ends with the one line, the traceback above it
    assert any("Traceback (most recent call last)" in line for line in log)
    terminal = proc.stdout + proc.stderr
    if debug:
        assert "Traceback (most recent call last)" in terminal
    else:
        assert f"{cause} (traceback in results/logs/boom.log)" in terminal
        assert "Traceback (most recent call last)" not in terminal


PREEMPTED = """
rule train:
    output:
        "results/model.txt",
    log:
        "results/logs/train.log",
    script:
        "train.py"
"""

TRAIN = """
import os, time
from pathlib import Path
from qrerase.engine import resuming
from qrerase.workflow.job import job, resume_dir

with job(snakemake), resuming(resume_dir(snakemake)):
    state = resume_dir(snakemake) / "run" / "step-3"  # what the engine's save_state leaves
    state.mkdir(parents=True)
    Path("pid").write_text(str(os.getpid()))
    time.sleep(120)
"""


def test_a_sigterm_ends_a_job_with_one_line_naming_its_resume_state(tmp_path: Path):
    """Issue 62: a Slurm pre-emption (SIGTERM) ended a job with no line of the project's."""
    import signal
    import time

    (tmp_path / "Snakefile").write_text(PREEMPTED)
    (tmp_path / "train.py").write_text(TRAIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("QRERASE_DEBUG", None)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "-d", str(tmp_path), "-s", str(tmp_path / "Snakefile")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (tmp_path / "pid").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)
    time.sleep(0.2)
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and not (tmp_path / "results/model.txt").exists()
    line = (
        "rule train stopped by SIGTERM (a pre-emption, scancel or kill): resume state kept in "
        "results/.resume/train/_; the same snakemake command resumes from it"
    )
    assert line in out and "Traceback" not in out, out
    assert (tmp_path / "results/logs/train.log").read_text().rstrip().endswith(line)
    assert list((tmp_path / "results/.resume/train/_").rglob("step-3"))  # kept for the rerun
