"""The CPU split of a job (qrerase.bench.phases, the job log's CPU line) and the per-rule profile read
back from benchmark files and logs (qrerase.bench.run_profile)."""

import time

import pytest

from qrerase.bench import phases
from qrerase.bench.run_profile import PROFILE_COLUMNS, read_benchmark, read_cpu_line, run_profile, write_profile
from qrerase.workflow.job import cpu_line


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_phase_counts_its_cpu_once_when_nested():
    phases.reset()
    with phases.phase("load"):
        _spin(0.05)
        with phases.phase("load"):  # the inner block is already inside "load"
            _spin(0.05)
    total = phases.totals()["load"]
    assert 0.1 <= total < 0.2
    phases.reset()
    assert phases.totals() == {}


def test_the_decorator_counts_each_call_and_other_names_stay_apart():
    phases.reset()

    @phases.cpu_phase("load")
    def load():
        _spin(0.03)
        return 7

    assert load() == 7 and load() == 7
    with phases.phase("record"):
        _spin(0.02)
    got = phases.totals()
    assert got["load"] >= 0.06 and 0.02 <= got["record"] < got["load"]
    phases.reset()


def test_a_phase_name_must_be_a_string():
    with pytest.raises(ValueError, match="non-empty string"):
        with phases.phase(""):
            pass


def test_the_cpu_line_reads_back(tmp_path):
    log = tmp_path / "job.log"
    line = cpu_line("evaluate", 2.5, {"load": 1.25, "record": 0.125}, 9.0)
    log.write_text(f"2026-12-02 INFO rule evaluate started\n2026-12-02 INFO {line}\n", encoding="utf-8")
    assert read_cpu_line(log) == {"startup": 2.5, "load": 1.25, "record": 0.125, "total": 9.0}
    empty = tmp_path / "failed.log"
    empty.write_text("2026-12-02 ERROR rule evaluate failed\n", encoding="utf-8")
    assert read_cpu_line(empty) is None


#: Snakemake's benchmark header, and one row (wall s, CPU s to fill in)
BENCH = (
    "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    "{s}\t0:00:10\t1\t1\t1\t1\t0\t0\t90\t{cpu}\n"
)


def test_the_profile_sums_a_rule_s_jobs_and_splits_only_those_with_a_line(tmp_path):
    results = tmp_path / "results"
    for name, s, cpu in (("a", 10.0, 12.0), ("b", 4.0, 5.0)):
        f = results / "benchmarks" / "evaluate" / f"{name}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(BENCH.format(s=s, cpu=cpu), encoding="utf-8")
    (results / "benchmarks" / "lora").mkdir()
    (results / "benchmarks" / "lora" / "x.tsv").write_text(BENCH.format(s=30, cpu=50), encoding="utf-8")
    (results / "logs" / "evaluate").mkdir(parents=True)
    (results / "logs" / "evaluate" / "a.log").write_text(
        cpu_line("evaluate", 3.0, {"load": 2.0, "record": 0.5}, 11.0) + "\n", encoding="utf-8"
    )
    (results / "logs" / "report").mkdir()  # a rule with no benchmark: its logs alone
    (results / "logs" / "report" / "all.log").write_text(cpu_line("report", 1.0, {}, 1.5) + "\n", encoding="utf-8")
    rows = run_profile(results)
    assert [r["rule"] for r in rows] == ["lora", "evaluate", "report"]  # largest CPU first
    report = rows[2]
    assert (report["jobs"], report["wall_s"], report["cpu_s"], report["work_s"]) == (1, 0.0, 1.5, 0.5)
    ev = rows[1]
    assert ev["jobs"] == 2 and ev["split_jobs"] == 1
    assert ev["wall_s"] == 14.0 and ev["snakemake_cpu_s"] == 17.0
    assert ev["cpu_s"] == 11.0 + 5.0  # job a's own total, job b's Snakemake sample
    assert (ev["startup_s"], ev["load_s"], ev["record_s"], ev["work_s"]) == (3.0, 2.0, 0.5, 5.5)
    assert rows[0]["split_jobs"] == 0 and rows[0]["work_s"] == 0.0
    out = tmp_path / "profile.csv"
    write_profile(rows, out)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[0] == ",".join(PROFILE_COLUMNS)
    assert lines[-1] == "total,4,44.0,67.5,67.0,2,4.0,2.0,0.5,6.0"


def test_bad_benchmark_files_and_an_empty_folder_are_named(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("s\n1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.tsv: not a Snakemake benchmark file"):
        read_benchmark(bad)
    bad.write_text(BENCH.format(s="NA", cpu=1), encoding="utf-8")
    with pytest.raises(ValueError, match="bad.tsv: s is 'NA', not a number"):
        read_benchmark(bad)
    with pytest.raises(ValueError, match="no benchmark or log files"):
        run_profile(tmp_path)
