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
