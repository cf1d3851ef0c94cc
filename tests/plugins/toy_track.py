"""A plug-in for tests and docs/extending.md ("Adding a track"): registers one toy track, ``toy_count``.

A track is its module (this file: the :class:`Track` registration, its config checks and the code its
rules run), its rules file (``toy_track.smk``, named by :attr:`Track.rules` and included by the Snakefile
after the built-in rules) and its docs page (a built-in track's ``docs/tracks/<name>.md``; this toy's is
its docstring). Listing the module in the config key ``plugins`` registers it; ``tracks: [toy_count]``
then builds its table.

``toy_count`` trains nothing: its one rule reads the vendored TOFU forget set
(``<tofu.data.root>/<tofu.data.split>.jsonl``, ``source: local``) and writes
``results/tables/toy_count.csv``, one row per field (question, answer) with the number of QA pairs, the
mean and the largest length in the unit of its config section ``toy_count.unit`` (``words``: whitespace
separated tokens, ``chars``: characters). Importing this module is standard library only (the workflow
imports it at planning time).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path

from qrerase.tracks import Track, register_track

#: The table's fields: its column name -> the key of a vendored TOFU record.
FIELDS = {"question": "prompt", "answer": "response"}
#: The length units of ``toy_count.unit``.
UNITS = ("words", "chars")


def length(text: str, unit: str) -> int:
    """The length of ``text`` in ``unit``: its whitespace-separated tokens (``words``) or characters (``chars``)."""
    if unit not in UNITS:
        raise ValueError(f"toy_count.unit: expected one of {list(UNITS)}, got {unit!r}")
    return len(text.split()) if unit == "words" else len(text)


def count_table(src: str | Path, out: str | Path, unit: str) -> list[dict]:
    """Write the toy table of the JSONL file ``src`` (one ``{"prompt", "response"}`` record a line) to
    ``out`` (CSV: field, n, mean, max; mean = (1/n) Σ_i len_i, rounded to 4 decimals) and return its rows.
    ValueError naming ``src`` for an empty file or a record without a field."""
    records = [json.loads(line) for line in Path(src).read_text().splitlines() if line.strip()]
    if not records:
        raise ValueError(f"{src}: no records")
    rows = []
    for field, key in FIELDS.items():
        if any(not isinstance(r.get(key), str) for r in records):
            raise ValueError(f"{src}: a record has no string {key!r}")
        lengths = [length(r[key], unit) for r in records]
        mean = round(sum(lengths) / len(lengths), 4)
        rows.append({"field": field, "n": len(lengths), "mean": mean, "max": max(lengths)})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["field", "n", "mean", "max"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


def source(cfg: Mapping) -> Path:
    """The vendored forget-set file the toy table reads."""
    data = cfg["tofu"]["data"]
    return Path(data["root"]) / f"{data['split']}.jsonl"


def check(cfg: Mapping, runs: bool) -> None:
    """When the track runs: a local TOFU source (the toy reads the vendored file, it downloads nothing)."""
    from qrerase.workflow.validation import ConfigError

    if runs and cfg["tofu"]["data"]["source"] != "local":
        raise ConfigError("config key 'tofu.data.source': the toy_count track reads the vendored files ('local')")


class ToyTrack(Track):
    """A track without training jobs: its memory plan is empty."""

    def plan_jobs(self, cfg: Mapping) -> list:
        return []


TRACK = register_track(
    ToyTrack(  # the required fields, then what differs from the defaults (qrerase.tracks.base.Track)
        name="toy_count",
        runner="text",
        prefix="toy_count",
        experiments={"toy_count": "toy_count"},
        tables=("toy_count",),
        title="Toy count track",
        check="toy_track:check",
        rules=str(Path(__file__).with_name("toy_track.smk")),
        schema={
            "description": "the toy track's settings (tests/plugins/toy_track.py)",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "unit": {"description": "length unit of the table: words or chars", "enum": list(UNITS)},
            },
        },
    )
)
