"""The audit and the manifest on a results/ folder that is a symlink to scratch, and after the
working directory moved: a small real Snakemake run whose jobs write real provenance records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from qrerase.cli import main
from qrerase.workflow import manifest as mf

SNAKEFILE = """
rule all:
    input:
        "results/provenance/manifest.json",

rule make_a:
    input:
        "data/src.txt",
    output:
        "results/a.txt",
    log:
        "results/logs/make_a.log",
    script:
        "scripts/copy.py"

rule make_b:
    input:
        "results/a.txt",
    output:
        directory("results/b"),
    log:
        "results/logs/make_b.log",
    script:
        "scripts/to_dir.py"

rule manifest:
    input:
        "results/b",
    output:
        "results/provenance/manifest.json",
    log:
        "results/logs/manifest.log",
    script:
        "scripts/manifest.py"
"""

SCRIPTS = {
    "copy.py": (
        "from pathlib import Path\n"
        "from qrerase.io import write_text\n"
        "from qrerase.workflow.job import job\n"
        "with job(snakemake):\n"
        "    write_text(snakemake.output[0], Path(snakemake.input[0]).read_text().upper())\n"
    ),
    "to_dir.py": (
        "from pathlib import Path\n"
        "from qrerase.io import atomic_dir\n"
        "from qrerase.workflow.job import job\n"
        "with job(snakemake):\n"
        "    with atomic_dir(snakemake.output[0]) as tmp:\n"
        "        (tmp / 'w.txt').write_text(Path(snakemake.input[0]).read_text() * 2)\n"
    ),
    "manifest.py": (
        "from qrerase.io import write_json\n"
        "from qrerase.workflow.job import job\n"
        "from qrerase.workflow.manifest import build_manifest\n"
        "with job(snakemake):\n"
        "    write_json(snakemake.output[0], build_manifest([str(t) for t in snakemake.input]))\n"
    ),
}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qrerase.cli", *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def linked_run(tmp_path_factory):
    """A finished run in workdir/ whose results/ is a symlink to scratch/results."""
    base = tmp_path_factory.mktemp("linked")
    wd, scratch = base / "checkout", base / "scratch" / "results"
    (wd / "data").mkdir(parents=True)
    (wd / "scripts").mkdir()
    scratch.mkdir(parents=True)
    (wd / "results").symlink_to(scratch, target_is_directory=True)
    (wd / "data" / "src.txt").write_text("source\n")
    (wd / "Snakefile").write_text(SNAKEFILE)
    for name, text in SCRIPTS.items():
        (wd / "scripts" / name).write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--nolock"],
        cwd=wd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (scratch / "provenance" / "records" / "a.txt.json").is_file()  # the records live on scratch
    return base


def _move(base: Path, tmp_path: Path) -> Path:
    """A copy of the run (the results symlink re-pointed to the copy's scratch), to tamper with."""
    shutil.copytree(base, tmp_path / "copy", symlinks=True)
    wd = tmp_path / "copy" / "checkout"
    (wd / "results").unlink()
    (wd / "results").symlink_to(tmp_path / "copy" / "scratch" / "results", target_is_directory=True)
    return wd


def test_audit_is_clean_through_the_symlink(linked_run, tmp_path):
    wd = linked_run / "checkout"
    assert (wd / "results").resolve().parent != wd  # the case the audit used to get wrong
    assert mf.workdir_of(wd / "results") == wd
    problems, counts = mf.audit(wd / "results")
    assert problems == [] and counts["records"] == 3 and counts["manifest_artifacts"] == 3
    # the old root (the symlink's resolved parent) holds no data/: every source reads as missing
    old, _ = mf.audit(wd / "results", workdir=(wd / "results").resolve().parent)
    assert "results/a.txt: produced from input data/src.txt, which is missing" in {str(p) for p in old}
    proc = _cli(wd, "audit", "results")  # relative, from the working directory
    assert proc.returncode == 0 and "qrerase audit: OK; 3 records" in proc.stdout, proc.stdout + proc.stderr
    proc = _cli(tmp_path, "audit", str(wd / "results"))  # absolute, from elsewhere
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _cli(wd, "audit", str(linked_run / "scratch" / "results"))  # the scratch path, from the working directory
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _cli(wd, "manifest", "results", "results/a.txt")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)["artifacts"]) == {"data/src.txt", "results/a.txt"}


def test_audit_is_clean_after_the_checkout_moved(linked_run, tmp_path):
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.copytree(linked_run / "checkout", moved, symlinks=True)  # results/ still points to scratch
    assert _cli(moved, "audit", "results").returncode == 0
    assert main(["audit", str(moved / "results")]) == 0
    # the scratch path itself with the working directory named
    assert main(["audit", str(linked_run / "scratch" / "results"), "--workdir", str(moved)]) == 0
    assert main(["audit", str(moved / "results"), "--workdir", str(tmp_path)]) == 2  # not its results/


def test_tampering_is_still_detected_through_the_symlink(linked_run, tmp_path):
    wd = _move(linked_run, tmp_path)
    assert _cli(wd, "audit", "results").returncode == 0
    (tmp_path / "copy" / "scratch" / "results" / "a.txt").write_text("FORGED\n")
    (wd / "data" / "src.txt").write_text("other source\n")
    proc = _cli(wd, "audit", "results")
    assert proc.returncode == 1
    assert "BROKEN results/a.txt: modified" in proc.stdout
    assert "BROKEN results/b: produced from input results/a.txt whose hash no longer matches" in proc.stdout
    assert "BROKEN results/a.txt: produced from input data/src.txt whose hash no longer matches" in proc.stdout
    (wd / "data" / "src.txt").unlink()
    proc = _cli(wd, "audit", "results")
    assert "BROKEN results/a.txt: produced from input data/src.txt, which is missing" in proc.stdout
