"""A track is its module, its rules file and its docs page (issue 35): the toy plug-in track of
tests/plugins (``toy_track.py`` + ``toy_track.smk``), listed in the test config's ``plugins`` and
``tracks``, is planned by ``snakemake -n`` and its table built by a real run, with no file of the
repository changed. It trains nothing (a few CPU-seconds)."""

from __future__ import annotations

import csv
import json
import os
import re
import statistics

import pytest
from support import PLUGINS, REPO
from support.snakemake_cli import planned_rules, snakemake, write_config

pytestmark = pytest.mark.workflow


def test_snakemake_plans_and_runs_a_plugin_track(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]))
    cfg = write_config(tmp_path, plugins=["toy_track"], tracks=["toy_count"], toy_count={"unit": "words"})
    plan = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg))
    # the default target is the toy track's table (and the run's manifest): no training job
    assert planned_rules(plan) == {"toy_count_table": 1, "provenance_manifest": 1, "all": 1, "total": 3}
    snakemake(tmp_path, "results/tables/toy_count.csv", "--cores", "1", "--configfile", str(cfg))
    with open(tmp_path / "results" / "tables" / "toy_count.csv") as f:
        table = list(csv.DictReader(f))
    # by hand: the vendored forget set of the test config's split, words as runs of non-space characters
    lines = (REPO / "data" / "tofu" / "forget10.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    expected = []
    for field, key in (("question", "prompt"), ("answer", "response")):
        words = [len(re.findall(r"\S+", r[key])) for r in records]
        expected.append([field, len(words), statistics.fmean(words), max(words)])
    assert [[r["field"], int(r["n"]), float(r["mean"]), int(r["max"])] for r in table] == [
        [f, n, pytest.approx(m, abs=5e-5), x] for f, n, m, x in expected
    ]
    assert expected[0][1] == 400  # TOFU forget10: 10% of 4000 QA pairs
