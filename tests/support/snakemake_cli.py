"""Running the snakemake CLI on this checkout's workflow, and writing the small test configs for it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from support import CONFIGS, REPO


def snakemake(
    workdir: Path, *args: str, check: bool = True, repo: Path = REPO, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    """The snakemake CLI on the workflow of checkout ``repo`` (default: this one) in ``workdir``;
    ``prefix``: a command it runs under (e.g. :func:`support.rank_opens.strace_prefix`)."""
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(repo / "Snakefile"),
        "--directory",
        str(workdir),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def write_yaml_config(workdir: Path, name: str, cfg: dict, overrides: dict) -> Path:
    """Write ``cfg`` with ``overrides`` applied (key ``a__b__c`` sets cfg[a][b][c]) to workdir/name."""
    for dotted, value in overrides.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = workdir / name
    path.write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return path


def write_config(workdir: Path, name: str = "test.yaml", **overrides) -> Path:
    cfg = yaml.safe_load((CONFIGS / "test.yaml").read_text())
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    return write_yaml_config(workdir, name, cfg, overrides)


def assert_config_error(workdir: Path, cfg: Path, *messages: str) -> None:
    """A dry run with ``cfg`` fails at DAG construction, naming every message, and writes no results."""
    proc = snakemake(workdir, "-n", "--cores", "1", "--configfile", str(cfg), check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    for message in messages:
        assert message in text
    assert not (workdir / "results").exists()


def planned_rules(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """Rule -> job count from a dry run's 'Job stats' table."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    stats = text.split("Job stats:", 1)[1]
    counts = {}
    for line in stats.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def write_speech_config(workdir: Path, name: str = "test_speech.yaml", **overrides) -> Path:
    cfg = yaml.safe_load((CONFIGS / "test_speech.yaml").read_text())
    cfg["speech"]["data"]["root"] = str(REPO / "data" / "fsdd")
    cfg.setdefault("tofu", {})["data"] = {"source": "local", "root": str(REPO / "data" / "tofu"), "split": "forget10"}
    return write_yaml_config(workdir, name, cfg, overrides)


def kill_run(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGKILL a run started with ``start_new_session=True`` (snakemake and every job it started share its
    process group) and wait until every process of the group has died."""
    import os
    import signal
    import time

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout)
    gone = time.monotonic() + timeout
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < gone, "processes of the killed run are still alive"
        time.sleep(0.05)


#: a docutils system message in the output of `snakemake --report` (a caption that does not render)
DOCUTILS_MESSAGE = re.compile(r"\((?:INFO|WARNING|ERROR|SEVERE)/\d\)")


def build_report(workdir: Path, configfile: Path, *names: str) -> str:
    """`snakemake --report` on a finished run in ``workdir``: no docutils message in its output, and the
    report names each of ``names`` (tables and figures); returns the report's HTML."""
    proc = snakemake(workdir, "--report", "results/report.html", "--configfile", str(configfile))
    messages = [line for line in (proc.stdout + proc.stderr).splitlines() if DOCUTILS_MESSAGE.search(line)]
    assert not messages, "the report's captions do not render:\n" + "\n".join(messages)
    html = (workdir / "results/report.html").read_text(encoding="utf-8", errors="replace")
    missing = [name for name in names if name not in html]
    assert not missing, f"the report lacks {missing}"
    return html
