"""Per-method cost from Snakemake benchmark files (the companion of every track table).

The table itself is :func:`qrerase.reports.cost.cost_table`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["COST_COLUMNS", "read_benchmark_columns", "read_snakemake_benchmark", "method_costs", "grouped_method_costs"]

#: Cost components (seconds of wall time) of :func:`method_costs`, then the derived columns.
COST_COLUMNS = ("lora_s", "task_matrices_s", "erase_s", "baseline_s", "unlearn_s", "total_s")


def read_benchmark_columns(path: str | os.PathLike, columns: tuple[str, ...] = ("s",)) -> tuple[float, ...]:
    """The mean of each of ``columns`` over the rows of one Snakemake ``benchmark:`` TSV (one row per
    benchmarked run; ``s``: wall-clock seconds, ``cpu_time``: Snakemake's sample of the CPU seconds). A
    clear ``ValueError`` naming the file when it is missing, lacks a column, or a value is not a finite
    number >= 0."""
    import csv

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: benchmark file not found")
    with open(p, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    if not rows or any(c not in rows[0] for c in columns):
        expected = " and ".join(repr(c) for c in columns)
        raise ValueError(f"{path}: not a Snakemake benchmark file (expected tab-separated {expected} columns)")
    means = []
    for c in columns:
        values = []
        for row in rows:
            try:
                value = float(row[c])
            except (TypeError, ValueError):
                raise ValueError(f"{path}: {c} is {row[c]!r}, not a number") from None
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{path}: {c} is {value}, expected a finite number >= 0")
            values.append(value)
        means.append(sum(values) / len(values))
    return tuple(means)


def read_snakemake_benchmark(path: str | os.PathLike) -> float:
    """Wall-clock seconds of one job from its Snakemake ``benchmark:`` TSV (column ``s``; the mean
    when the job was benchmarked repeatedly; :func:`read_benchmark_columns`). It covers the whole job:
    interpreter start-up, imports, loading inputs, the work and writing outputs."""
    return read_benchmark_columns(path, ("s",))[0]


def method_costs(components: dict[str, dict[str, list]]):
    """Per-method wall time from benchmark files: one row per method, columns :data:`COST_COLUMNS`.

    ``components`` maps method -> component -> list of benchmark files, components among
    ``lora_s`` (LoRA task-adapter training), ``task_matrices_s`` (T = s·B·A extraction),
    ``erase_s`` (the closed-form subspace steps: factors, energy, forget update, erase) and
    ``baseline_s`` (a baseline's training job). A component is the sum of its files' seconds; absent
    or empty components are NaN. Derived: ``unlearn_s`` = the unlearning step given the fine-tuned
    model (``erase_s`` for subspace methods, ``baseline_s`` for baselines); ``total_s`` = the sum of
    all components (a job shared by several methods counts fully for each).
    """
    import pandas as pd

    known = set(COST_COLUMNS[:4])
    rows = []
    for method, parts in components.items():
        unknown = sorted(set(parts) - known)
        if unknown:
            raise ValueError(f"method_costs: {method}: unknown component(s) {unknown}; expected {sorted(known)}")
        row = {"method": method}
        for col in COST_COLUMNS[:4]:
            files = parts.get(col) or []
            row[col] = sum(read_snakemake_benchmark(f) for f in files) if files else float("nan")
        unlearn = row["baseline_s"] if "baseline_s" in parts else row["erase_s"]
        row["unlearn_s"] = unlearn
        present = [row[c] for c in COST_COLUMNS[:4] if math.isfinite(row[c])]
        row["total_s"] = sum(present) if present else float("nan")
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", *COST_COLUMNS])


def grouped_method_costs(groups: dict[str, dict[str, dict[str, list]]], group_column: str):
    """:func:`method_costs` of several experiments of one track, stacked: ``groups`` maps a group
    (the cross-lingual unlearning language, the speech setting) to that experiment's ``components``;
    the frame gets a ``group_column`` after ``method``, rows grouped in the order of ``groups``."""
    import pandas as pd

    if not groups:
        raise ValueError("grouped_method_costs: no groups")
    frames = []
    for group, components in groups.items():
        frame = method_costs(components)
        frame.insert(1, group_column, str(group))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
