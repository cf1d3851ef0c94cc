"""Seed spread of a track's headline table: the same table from several seeds as mean and sd per cell.

Every track table (``results/tables/<track>.csv``) has the key columns :data:`KEY` (``method``,
``display_label``, ``reference``), one column per measure and a ``<measure>_mark`` column per
measure (the best / second marks of one run, which do not average and are dropped).
:func:`seed_spread` stacks the tables of ``n`` seeds and gives, per method and measure, the mean,
the sample standard deviation (ddof 1; empty with one number), the minimum and maximum and the number
of seeds with a number; :func:`render_spread` renders that as Markdown (``mean ± sd``). The rows keep
the order of the first table; every table must hold the same methods and measures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from qrerase.reports.tables import format_value

__all__ = ["KEY", "STATS", "measures_of", "render_spread", "seed_spread"]

#: The columns that name a row of a track table.
KEY = ("method", "display_label", "reference")
#: The statistics of each measure in the spread table, as ``<measure>_<stat>`` columns.
STATS = ("mean", "sd", "min", "max", "n")


def measures_of(table: pd.DataFrame) -> list[str]:
    """The measure columns of a track table: every column but :data:`KEY` and the ``*_mark`` columns."""
    missing = [k for k in KEY if k not in table.columns]
    if missing:
        raise ValueError(f"not a track table: no column(s) {missing} (expected {list(KEY)} and measures)")
    return [c for c in table.columns if c not in KEY and not c.endswith("_mark")]


def seed_spread(tables: Mapping[int, pd.DataFrame]) -> pd.DataFrame:
    """Mean, sd, min, max and count per method and measure over the tables of several seeds.

    ``tables`` maps seed -> the track table of that seed (as read from its CSV). Returns one row per
    method (the first table's order) with :data:`KEY`, ``seeds`` (how many tables) and
    ``<measure>_<stat>`` for each measure and stat of :data:`STATS`. A cell missing in a seed's table
    (e.g. Forget Quality of the retain reference) is left out of that cell's statistics; a cell with no
    number in any seed has mean NaN and n 0.

    Raises ``ValueError`` when ``tables`` is empty or a seed's table has other methods or measures
    than the first one (naming the seed and the difference).
    """
    if not tables:
        raise ValueError("seed_spread: no tables (expected one per seed)")
    seeds = list(tables)
    first = tables[seeds[0]]
    measures = measures_of(first)
    methods = list(first["method"])
    if len(set(methods)) != len(methods):
        raise ValueError(f"seed {seeds[0]}: duplicate methods in the table: {methods}")
    for seed in seeds[1:]:
        other = tables[seed]
        if measures_of(other) != measures:
            raise ValueError(f"seed {seed}: measures {measures_of(other)} differ from seed {seeds[0]}'s {measures}")
        if sorted(other["method"]) != sorted(methods):
            diff = sorted(set(methods) ^ set(other["method"]))
            raise ValueError(f"seed {seed}: methods differ from seed {seeds[0]}'s: {diff}")
    by_seed = {s: t.set_index("method") for s, t in tables.items()}
    rows = []
    for _, base in first.iterrows():
        row = {k: base[k] for k in KEY}
        row["seeds"] = len(seeds)
        for m in measures:
            vals = pd.to_numeric(pd.Series([by_seed[s].at[base["method"], m] for s in seeds]), errors="coerce")
            vals = vals.dropna().astype(float)
            n = len(vals)
            row[f"{m}_mean"] = float(vals.mean()) if n else math.nan
            # equal numbers give sd 0 exactly (the summation of std can leave ~1e-16)
            sd = 0.0 if n > 1 and vals.min() == vals.max() else float(vals.std(ddof=1)) if n > 1 else math.nan
            row[f"{m}_sd"] = sd
            row[f"{m}_min"] = float(vals.min()) if n else math.nan
            row[f"{m}_max"] = float(vals.max()) if n else math.nan
            row[f"{m}_n"] = n
        rows.append(row)
    return pd.DataFrame(rows)


def _cell(row: pd.Series, measure: str, fmt: str) -> str:
    mean, sd, n = row[f"{measure}_mean"], row[f"{measure}_sd"], int(row[f"{measure}_n"])
    if n == 0:
        return "—"
    text = format_value(mean, fmt)
    if n > 1:
        text += f" ± {format_value(sd, fmt)}"
    if n < int(row["seeds"]):
        text += f" (n={n})"
    return text


def render_spread(spread: pd.DataFrame, seeds: list[int], title: str, fmt: str = "sci") -> str:
    """Markdown: one row per method, one ``mean ± sd`` cell per measure (``(n=k)`` when only k of the
    seeds had a number; ``—`` for none), under a heading naming the seeds. ``fmt`` is a
    :func:`qrerase.reports.tables.format_value` format (``'sci'``: 3 significant digits, scientific
    below 1e-3)."""
    measures = [c.removesuffix("_mean") for c in spread.columns if c.endswith("_mean")]
    head = [
        f"**{title}**: mean ± sample sd over seeds {', '.join(str(s) for s in seeds)} (n = {len(seeds)}).",
        "",
        "| **Method** | " + " | ".join(f"**{m}**" for m in measures) + " |",
        "|:---|" + "---:|" * len(measures),
    ]
    body = []
    for _, r in spread.iterrows():
        label = str(r["display_label"]).replace("|", "\\|")
        body.append(f"| {label} | " + " | ".join(_cell(r, m, fmt) for m in measures) + " |")
    return "\n".join(head + body) + "\n"
