"""``qrerase results-pages``: a results tree written by the library's own table, figure and provenance
writers (in a real git checkout) rendered into docs pages."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest

from qrerase.cli import main
from qrerase.io import write_csv
from qrerase.reports import pages
from qrerase.reports.plots import energy_plot
from qrerase.reports.tables import Column, TableSpec, write_table
from qrerase.workflow import provenance as pv

SPEC = TableSpec(
    columns=(
        Column("model_utility", "Model Utility"),
        Column("forget_quality", "Forget Quality", fmt="sci", check_threshold=0.1),
    ),
    reference_rows=("base",),
)


def _git(cwd: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _record(outputs: list[str], *, workdir: Path, threads: int = 1) -> None:
    rec = pv.build_record(
        rule="table",
        wildcards={},
        params={},
        config={},
        inputs=[],
        outputs=outputs,
        seed=None,
        threads=threads,
        start=1_700_000_000.0,
        end=1_700_000_060.0,
        workflow_dir=workdir,
    )
    pv.write_records(rec, root=workdir)


@pytest.fixture
def run(tmp_path, monkeypatch) -> Path:
    """A git checkout with a finished results/: tables of two tracks, CSV-only tables, figures, records."""
    wd = tmp_path / "checkout"
    wd.mkdir()
    (wd / "Snakefile").write_text("# workflow\n")
    (wd / ".gitignore").write_text("results/\n")
    _git(wd, "init", "-q")
    _git(wd, "add", "-A")
    _git(wd, "commit", "-q", "-m", "run")
    monkeypatch.chdir(wd)
    tables, figures = Path("results/tables"), Path("results/figures")
    methods = ["base", "qr_erase_ll", "ga"]
    frame = pd.DataFrame({"method": methods, "model_utility": [0.9, 0.85, 0.8], "forget_quality": [1e-5, 2e-4, 0.3]})
    write_table(frame, SPEC, tables / "tofu.csv", tables / "tofu.md", tables / "tofu.tex")
    write_table(frame.iloc[:2], SPEC, tables / "speech.csv", tables / "speech.md", None)
    write_csv(tables / "tofu_tradeoff_selection.csv", pd.DataFrame({"method": ["qr_erase_ll"], "scale": [3.0]}))
    write_csv(tables / "tofu_cost.csv", pd.DataFrame({"method": ["ga"], "total_s": [5.6]}))
    write_csv(tables / "speech_tradeoff.csv", pd.DataFrame({"k": range(pages.MAX_CSV_ROWS + 1)}))
    energy_plot({"0": 0.2, "1": 0.8}, figures / "tofu_forget10_energy.png")
    energy_plot({"0": 0.6, "1": 0.4}, figures / "xling_en_energy.png")
    energy_plot({"0": 0.5, "1": 0.5}, figures / "unplaced.png")
    _record(["results/tables/tofu.csv", "results/tables/tofu.md", "results/tables/tofu.tex"], workdir=wd)
    _record(["results/tables/speech.csv", "results/tables/speech.md"], workdir=wd, threads=2)
    return wd


def test_page_of_matches_whole_name_prefixes():
    assert pages.page_of("tofu_wide.md") == "tofu" and pages.page_of("tofu_forget10_energy.png") == "tofu"
    assert pages.page_of("xling_hi_energy.png") == "crosslingual" == pages.page_of("crosslingual_matrix.csv")
    assert pages.page_of("task_level_wide.md") == "task_level" == pages.page_of("task_cost.csv")
    assert pages.page_of("bench_decomposition.png") == "runtime" == pages.page_of("runtime.md")
    assert pages.page_of("tofunny.md") is None and pages.page_of("speeches.csv") is None


def test_pages_embed_the_tables_figures_and_the_recorded_header(run):
    commit = _git(run, "rev-parse", "HEAD")
    written = pages.write_pages("results", "site/results")
    out = run / "site/results"
    assert [p.name for p in written] == ["tofu.md", "crosslingual.md", "speech.md", "index.md"]
    tofu = (out / "tofu.md").read_text()
    assert tofu.startswith(pages.MARKER + "\n# TOFU track: results\n")
    assert (run / "results/tables/tofu.md").read_text().strip() in tofu  # the writer's Markdown, verbatim
    assert f"- **Commit:** `{commit}`\n" in tofu and "(dirty)" not in tofu
    assert "- **Date (UTC) the jobs finished:** 2023-11-14\n" in tofu  # the records' end time, not today
    cpu = pv.machine_info()
    assert f"- **Machine:** {cpu['cpu']}, {cpu['logical_cpus']} logical cores; threads per job: 1\n" in tofu
    assert f"torch {version('torch')}, transformers {version('transformers')}" in tofu
    assert "from the provenance records of 2 of this page's table files" in tofu
    # a CSV-only table: its cells as written; the cost table says it is wall time
    assert "| method | scale |\n|---|---|\n| qr_erase_ll | 3 |" in tofu
    assert "| ga | 5.6 |" in tofu and "changes on every run" in tofu.split("## `tofu_cost`")[1]
    assert "![tofu_forget10_energy](figures/tofu_forget10_energy.png)" in tofu
    for name in ("tofu_forget10_energy.png", "xling_en_energy.png"):
        assert (out / "figures" / name).read_bytes() == (run / "results/figures" / name).read_bytes()
    assert not (out / "figures/unplaced.png").exists()
    speech = (out / "speech.md").read_text()
    assert "threads per job: 2" in speech
    assert f"{pages.MAX_CSV_ROWS + 1} rows: too long to show here; read `results/tables/speech_tradeoff.csv`" in speech
    xling = (out / "crosslingual.md").read_text()  # a figure only: no records, so the fallback header
    assert "no provenance records" in xling and f"`{commit}` (`git rev-parse HEAD`" in xling
    index = (out / "index.md").read_text()
    assert "| [TOFU track](tofu.md) |" in index and "[Speech track](speech.md)" in index
    assert "`results/figures/unplaced.png`" in index


def test_output_is_deterministic_and_replaces_earlier_pages(run):
    out = run / "site/results"
    out.mkdir(parents=True)
    (out / "task_level.md").write_text(pages.MARKER + "\nold generated page\n")
    (out / "notes.md").write_text("# hand-written\n")
    (out / "figures").mkdir()
    (out / "figures/old.png").write_bytes(b"x")
    pages.write_pages("results", out, note="Test config: numbers mean nothing.")
    first = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert not (out / "task_level.md").exists() and not (out / "figures/old.png").exists()
    assert (out / "notes.md").read_text() == "# hand-written\n"
    assert "!!! note\n\n    Test config: numbers mean nothing." in (out / "tofu.md").read_text()
    pages.write_pages("results", out, note="Test config: numbers mean nothing.")
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == first


def test_without_records_the_header_says_so_and_takes_the_overrides(run, tmp_path):
    copy = tmp_path / "copied_results"
    shutil.copytree(run / "results", copy, ignore=shutil.ignore_patterns("provenance"))
    pages.write_pages(copy, tmp_path / "out", commit="abc1234", date="2026-01-02")
    tofu = (tmp_path / "out/tofu.md").read_text()
    assert "- **Commit:** `abc1234` (given)\n" in tofu and "(UTC) the jobs finished:** 2026-01-02\n" in tofu
    assert "no provenance records" in tofu and "threads per job: not recorded" in tofu


def test_overrides_beat_the_records(run):
    pages.write_pages("results", "out", commit="feed", date="2025-05-05")
    tofu = Path("out/tofu.md").read_text()
    assert "- **Commit:** `feed` (given)\n" in tofu and "finished:** 2025-05-05\n" in tofu


def test_index_links_reach_the_docs_root_from_a_nested_folder(run):
    Path("site").mkdir()
    (Path("site") / "getting-started.md").write_text("# Getting started\n")
    pages.write_pages("results", "site/results/other-model")
    index = Path("site/results/other-model/index.md").read_text()
    assert "(../../getting-started.md)" in index and "(../../determinism.md)" in index
    pages.write_pages("results", "site/results")  # the docs/results layout
    assert "(../getting-started.md)" in Path("site/results/index.md").read_text()


def test_a_dirty_checkout_is_marked(run):
    (run / "Snakefile").write_text("# edited\n")
    _record(["results/tables/tofu.md"], workdir=run)
    rec = json.loads(pv.record_path("results/tables/tofu.md", run).read_text())
    assert rec["code"]["git_dirty"] is True
    pages.write_pages("results", "out")
    assert " (dirty)" in Path("out/tofu.md").read_text()


def test_cli(run, capsys):
    assert main(["results-pages", "results", "--out", "docs_out", "--note", "from a test"]) == 0
    assert capsys.readouterr().out.split() == [f"docs_out/{n}.md" for n in ("tofu", "crosslingual", "speech", "index")]
    assert main(["results-pages", "missing", "--out", "docs_out"]) == 2
    assert "missing: no tables/ or figures/ folder" in capsys.readouterr().err
    assert main(["results-pages", "results", "--out", "docs_out", "--date", "May 5"]) == 2
    assert "date: expected YYYY-MM-DD, got 'May 5'" in capsys.readouterr().err


def test_compare_reports_the_largest_move_per_column(tmp_path):
    from qrerase.reports.compare import compare_csv, render_comparison

    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("method,model_utility,forget_quality,note\nbase,0.9,1e-05,x\nga,0.8,0.0005,y\nonly_a,0.1,0.1,z\n")
    b.write_text("method,model_utility,forget_quality,note\nga,0.75,0.003,y\nbase,0.9,2.2e-05,x\n")
    diffs = {d.column: d for d in compare_csv(a, b)}
    assert set(diffs) == {"model_utility", "forget_quality"}  # the text column is not numeric
    mu, fq = diffs["model_utility"], diffs["forget_quality"]
    assert (mu.row, mu.this, mu.other, mu.rows) == ("ga", "0.8", "0.75", 2) and mu.max_abs == pytest.approx(0.05)
    assert (fq.row, fq.this, fq.other) == ("ga", "0.0005", "0.003") and fq.max_abs == pytest.approx(0.0025)
    assert "| model_utility | 0.05 | ga | 0.8 | 0.75 | 2 |" in render_comparison(list(diffs.values()))
    b.write_text("method,model_utility\nga,0.8\nga,0.7\n")
    with pytest.raises(ValueError, match="b.csv: first column 'method' repeats a value"):
        compare_csv(a, b)


def test_pages_compare_with_another_run(run, tmp_path):
    other = tmp_path / "other_machine"
    shutil.copytree(run / "results", other)
    frame = pd.read_csv(other / "tables/tofu.csv")
    frame.loc[frame["method"] == "ga", "forget_quality"] = 0.0031
    frame.to_csv(other / "tables/tofu.csv", index=False)
    (other / "tables/speech.csv").unlink()
    rec = json.loads((other / "provenance/records/tables/tofu.md.json").read_text())
    rec["machine"] = {"cpu": "Other CPU", "logical_cpus": 2}
    (other / "provenance/records/tables/tofu.md.json").write_text(json.dumps(rec))
    args = ["results-pages", "results", "--out", "out", "--compare", str(other), "--compare-label", "machine B"]
    assert main(args) == 0
    tofu = Path("out/tofu.md").read_text()
    commit = _git(run, "rev-parse", "HEAD")
    assert f"- **Compared with machine B:** commit `{commit}`, 2023-11-14, " in tofu and "Other CPU, 2 logical" in tofu
    section = tofu.split("## `tofu`")[1].split("## ")[0]
    assert "**Against machine B:**" in section and "| forget_quality | 0.297 | ga | 0.3 | 0.0031 | 3 |" in section
    assert "| model_utility | 0 | base |" in section
    assert "**Against machine B:**" not in tofu.split("## `tofu_cost`")[1].split("## ")[0]  # wall time
    assert "`tables/speech.csv` is not in that run." in Path("out/speech.md").read_text()


def test_reference_snippets_hold_the_reference_rows_of_the_metric_columns(tmp_path):
    from qrerase.metrics.registry import metric
    from qrerase.reports.snippets import reference_snippet, write_snippets

    frame = pd.DataFrame(
        {
            "method": ["base", "retain", "qr_erase"],
            "model_utility": [0.5, 0.49, 0.48],
            "privleak": [-41.25, 0.0, -3.0],
            "mia_min_k_plus_plus": [0.8125, 0.5, 0.6],
            "privleak_mark": ["", "best", ""],
        }
    )
    csv = tmp_path / "tofu.csv"
    frame.to_csv(csv, index=False)
    text = reference_snippet(csv)
    lines = text.splitlines()
    assert lines[2] == f"| model | {metric('privleak').label} | {metric('mia_min_k_plus_plus').label} |"
    assert lines[4] == "| *ideal* | 0 | 0.5 |"
    assert lines[5:] == ["| Base Model | -41.250 | 0.812 |", "| Retain reference | 0.000 | 0.500 |"]
    frame[["method", "model_utility"]].to_csv(tmp_path / "plain.csv", index=False)
    assert reference_snippet(tmp_path / "plain.csv") is None  # no registered metric: no snippet
    written = write_snippets({"tofu": {".csv": csv}, "plain": {".csv": tmp_path / "plain.csv"}}, tmp_path / "out")
    assert [p.name for p in written] == ["tofu.txt"] and written[0].read_text() == text
