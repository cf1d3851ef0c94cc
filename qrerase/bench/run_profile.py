"""A finished run's cost per rule: jobs, CPU seconds and where a job's CPU goes.

Two sources, both written by every run:

- each job's Snakemake benchmark file (``results/benchmarks/<rule>/<job>.tsv``): wall seconds ``s``
  and ``cpu_time``, the CPU of the job's process and its children as Snakemake samples it (its
  polling misses much of a short job: a 36 s LoRA job on both cores recorded 7.8 CPU-s);
- each job's log (``results/logs/<rule>/<job>.log``): the CPU line (:func:`qrerase.bench.phases.cpu_line`)
  :func:`qrerase.workflow.job.job` writes at the end of a successful job, which splits the job
  process's CPU into start-up (the interpreter, Snakemake's script preamble, the script's imports),
  model loading, provenance hashing and the rest (the work).

A rule's row sums its jobs. ``cpu_s`` is a job's own CPU line total where its log has one, else
Snakemake's sample (``snakemake_cpu_s`` keeps Snakemake's for every job). The split columns sum only
the jobs whose log has a CPU line (``split_jobs`` of ``jobs``); a job without one (a rule whose script
does not run :func:`qrerase.workflow.job.job`, or a log from before the line existed) has no split. A
job's own line does not see child processes (the workers of a multi-process launch).
"""

from __future__ import annotations

import os
from pathlib import Path

from .cost import read_benchmark_columns
from .phases import CPU_LINE, parse_cpu_line

__all__ = ["PROFILE_COLUMNS", "read_benchmark", "read_cpu_line", "run_profile", "write_profile"]

#: Columns of :func:`run_profile`'s rows, in order.
PROFILE_COLUMNS = (
    "rule",
    "jobs",
    "wall_s",
    "cpu_s",
    "snakemake_cpu_s",
    "split_jobs",
    "startup_s",
    "load_s",
    "record_s",
    "work_s",
)


def read_benchmark(path: str | os.PathLike) -> tuple[float, float]:
    """(wall seconds, Snakemake's CPU seconds) of one job's benchmark TSV (columns ``s`` and
    ``cpu_time``: :func:`qrerase.bench.cost.read_benchmark_columns`, which names the file on bad input)."""
    wall, cpu = read_benchmark_columns(path, ("s", "cpu_time"))
    return wall, cpu


def read_cpu_line(path: str | os.PathLike) -> dict[str, float] | None:
    """The last CPU line (:func:`qrerase.bench.phases.cpu_line`) of a job log as ``{startup, load,
    record, total}`` seconds, or None when the log has none (the job failed, or its script does not log one)."""
    found = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if CPU_LINE in line:
                parsed = parse_cpu_line(line)
                if parsed is not None:
                    found = parsed
    return found


def run_profile(results: str | os.PathLike) -> list[dict]:
    """One row per rule (columns :data:`PROFILE_COLUMNS`, sorted by ``cpu_s``, largest first) from a
    finished run's ``results/`` folder: its ``benchmarks/`` and ``logs/``. A job is a benchmark file or a
    log file (one name under both folders); a rule without a ``benchmark:`` directive is profiled from its
    logs alone (``wall_s`` and ``snakemake_cpu_s`` count only benchmarked jobs). ``work_s`` is the split
    jobs' total CPU less their start-up, loading and hashing. A ``ValueError`` when the folder has neither
    benchmark nor log files."""
    root = Path(results)
    bench, logs = root / "benchmarks", root / "logs"
    jobs: dict[Path, dict[str, Path]] = {}
    for folder, suffix in ((bench, ".tsv"), (logs, ".log")):
        if folder.is_dir():
            for f in sorted(folder.glob(f"*/**/*{suffix}")):
                jobs.setdefault(f.relative_to(folder).with_suffix(""), {})[suffix] = f
    if not jobs:
        raise ValueError(
            f"{root}: no benchmark or log files under benchmarks/ or logs/ (is it a finished run's results/?)"
        )
    rows: dict[str, dict] = {}
    for rel, files in sorted(jobs.items()):
        rule = rel.parts[0]
        row = rows.setdefault(rule, {c: 0.0 for c in PROFILE_COLUMNS[1:]} | {"rule": rule})
        row["jobs"] += 1
        wall, cpu = read_benchmark(files[".tsv"]) if ".tsv" in files else (0.0, 0.0)
        row["wall_s"] += wall
        row["snakemake_cpu_s"] += cpu
        line = read_cpu_line(files[".log"]) if ".log" in files else None
        row["cpu_s"] += cpu if line is None else line["total"]
        if line is not None:
            row["split_jobs"] += 1
            row["startup_s"] += line["startup"]
            row["load_s"] += line["load"]
            row["record_s"] += line["record"]
            row["work_s"] += line["total"] - line["startup"] - line["load"] - line["record"]
    out = []
    for row in rows.values():
        row["jobs"] = int(row["jobs"])
        row["split_jobs"] = int(row["split_jobs"])
        out.append(row)
    return sorted(out, key=lambda r: (-r["cpu_s"], r["rule"]))


def write_profile(rows: list[dict], out: str | os.PathLike) -> None:
    """Write :func:`run_profile`'s rows, then a ``total`` row, as CSV (atomically; seconds to 0.1)."""
    from ..io import write_text

    total = {c: sum(r[c] for r in rows) for c in PROFILE_COLUMNS[1:]} | {"rule": "total"}

    def fmt(row: dict) -> list[str]:
        return [str(row[c]) if c in ("rule", "jobs", "split_jobs") else f"{row[c]:.1f}" for c in PROFILE_COLUMNS]

    lines = [",".join(PROFILE_COLUMNS)] + [",".join(fmt(r)) for r in [*rows, total]]
    write_text(out, "\n".join(lines) + "\n")
