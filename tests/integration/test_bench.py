"""Benchmark library and scripts at tiny sizes: sane tables and files (no timing assertions)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from qrerase.bench import decomposition as decomp_bench
from qrerase.bench import whole_model_erase as erase_bench
from qrerase.bench.whole_model_erase import ModelShape
from qrerase.reports import runtime as runtime_report

TINY = ModelShape("tiny", n_blocks=3, hidden=48, intermediate=96, kv_dim=16)


@pytest.fixture(scope="module")
def decomp():
    return decomp_bench.bench_decomposition([24, 40], lora_rank=4, repeats=1, seed=0, max_dense_svd=30, fast_repeats=1)


def test_bench_decomposition_table(decomp):
    df = decomp
    assert list(df.columns) == decomp_bench.DECOMP_COLUMNS
    assert df["n"].tolist() == [24, 40]
    assert df["pivots_identical_first_r"].all()
    assert (df["pivots_common_prefix"] >= 4).all()
    assert (df["max_sin_theta"] < 1e-10).all() and (df["rel_diff_tk"] < 1e-10).all()
    secs = ["cpqr_dense_s", "lora_cpqr_dense_s", "lora_cpqr_factored_s", "lora_svd_factored_s"]
    assert (df[secs] > 0).all().all()
    assert df.loc[0, "svd_dense_s"] > 0 and math.isnan(df.loc[1, "svd_dense_s"])  # skipped above max_dense_svd
    assert math.isnan(df.loc[1, "svd_reduction_pct"])
    assert np.allclose(df["factored_speedup"], df["lora_cpqr_dense_s"] / df["lora_cpqr_factored_s"])


def test_runtime_table_and_writers(decomp, tmp_path):
    table = runtime_report.runtime_table(decomp)
    assert list(table.columns[:4]) == ["Matrix size", "SVD (s)", "Pivoted QR (s)", "Reduction"]
    assert table["Matrix size"].tolist() == ["24 × 24", "40 × 40"]
    assert set(table["Pivots identical"]) <= {"all", "first r"}
    paths = [tmp_path / f"t.{ext}" for ext in ("csv", "md", "tex")]
    runtime_report.write_runtime_tables(table, *paths)
    assert pd.read_csv(paths[0]).shape == table.shape
    md = paths[1].read_text()
    assert md.startswith("| Matrix size | SVD (s) | Pivoted QR (s) | Reduction |") and "| 40 × 40 | n/a |" in md
    tex = paths[2].read_text()
    assert "\\toprule" in tex and "$24 \\times 24$" in tex and "\\%" in tex
    runtime_report.plot_decomposition(decomp, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "t.csv", "t.md", "t.tex"]  # no temp files left


def test_model_shapes():
    mods = erase_bench.MODEL_SHAPES["llama3-8b"].modules()
    assert len(mods) == 32 * 7
    shapes = {name.split(".", 3)[3]: (o, i) for name, o, i in mods[:7]}
    assert shapes["self_attn.k_proj"] == (1024, 4096) and shapes["mlp.down_proj"] == (4096, 14336)
    assert len(erase_bench.MODEL_SHAPES["llama3-70b"].modules()) == 80 * 7


@pytest.mark.parametrize("isolate", [False, True])
def test_whole_model_erase_tiny(isolate):
    res = erase_bench.bench_whole_model_erase(TINY, lora_rank=8, rank=4, seed=0, isolate=isolate, localized=True)
    assert set(erase_bench.ERASE_COLUMNS) <= set(res)
    assert res["n_modules"] == 21 and 1 <= res["n_layers_selected"] <= 3
    assert res["n_modules_written"] == 7 * res["n_layers_selected"]
    assert res["wall_s"] > 0 and res["adapter_mb"] > 0
    if isolate:
        assert res["peak_rss_mb"] >= res["baseline_rss_mb"] > 10
    with pytest.raises(ValueError, match="unknown model shape"):
        erase_bench.bench_whole_model_erase("gpt-5")


def test_cli_standalone(tmp_path):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "qrerase.cli", "bench", "--sizes", "20", "36", "--lora-rank", "4", "--repeats", "1"]
    cmd += ["--out-dir", str(tmp_path / "out"), "--threads", "1"]
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["decomposition.csv", "decomposition.png", "runtime.csv", "runtime.md", "runtime.tex"]
    df = pd.read_csv(tmp_path / "out" / "decomposition.csv")
    assert df["n"].tolist() == [20, 36] and df["pivots_identical_first_r"].all() and (df["threads"] == 1).all()


def test_erase_benchmark_writes_one_row_per_shape(tmp_path, monkeypatch):
    # the parent resolves the shape name and hands the child process the ModelShape itself
    monkeypatch.setattr(erase_bench, "MODEL_SHAPES", {**erase_bench.MODEL_SHAPES, "tiny": TINY})
    frame = erase_bench.run_erase_benchmark(["tiny"], tmp_path / "erase.csv", lora_rank=4, seed=0, threads=1)
    erase = pd.read_csv(tmp_path / "erase.csv")
    assert list(erase.columns) == erase_bench.ERASE_COLUMNS and erase["shape"].tolist() == ["tiny"]
    assert erase["n_modules"].tolist() == [21] and len(frame) == 1


def _benchmark_tsv(path, seconds):
    """A Snakemake benchmark file as its `benchmark:` directive writes it (header + one row per run)."""
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    rows = "".join(f"{s:.4f}\t0:00:{int(s):02d}\t100.1\t200.2\t50.0\t60.0\t0.0\t1.0\t50.0\t{s:.2f}\n" for s in seconds)
    path.write_text(header + rows)
    return path


def test_method_costs_sum_benchmarks_per_component(tmp_path):
    from qrerase.bench.cost import method_costs, read_snakemake_benchmark
    from qrerase.reports.cost import cost_table
    from qrerase.reports.tables import write_table

    f = {
        name: _benchmark_tsv(tmp_path / f"{name}.tsv", [s])
        for name, s in [
            ("lora_f", 10.0),
            ("lora_r", 30.0),
            ("tm_f", 1.5),
            ("tm_r", 1.5),
            ("fac_f", 0.5),
            ("fac_r", 0.75),
            ("upd", 0.25),
            ("erase", 2.0),
            ("ga", 42.0),
        ]
    }
    assert read_snakemake_benchmark(_benchmark_tsv(tmp_path / "twice.tsv", [1.0, 3.0])) == 2.0  # repeated runs: mean
    costs = method_costs(
        {
            "qr_erase": {
                "lora_s": [f["lora_f"], f["lora_r"]],
                "task_matrices_s": [f["tm_f"], f["tm_r"]],
                "erase_s": [f["fac_f"], f["fac_r"], f["upd"], f["erase"]],
            },
            "ga": {"baseline_s": [f["ga"]]},
        }
    ).set_index("method")
    assert costs.loc["qr_erase", ["lora_s", "task_matrices_s", "erase_s"]].tolist() == [40.0, 3.0, 3.5]
    assert costs.loc["qr_erase", "unlearn_s"] == 3.5 and costs.loc["qr_erase", "total_s"] == 46.5
    assert costs.loc["ga", "baseline_s"] == 42.0 == costs.loc["ga", "unlearn_s"] == costs.loc["ga", "total_s"]
    assert pd.isna(costs.loc["ga", "erase_s"]) and pd.isna(costs.loc["qr_erase", "baseline_s"])
    df, spec = cost_table(costs.reset_index())
    write_table(df, spec, tmp_path / "cost.csv", tmp_path / "cost.md", None)
    md = (tmp_path / "cost.md").read_text()
    assert "| Gradient Ascent | — | — | — | 42.0 | 42.0 | 42.0 |" in md and "QR-Erase" in md


def test_grouped_costs_one_column_group_per_experiment(tmp_path):
    from qrerase.bench.cost import grouped_method_costs
    from qrerase.reports.cost import cost_table
    from qrerase.reports.tables import write_table

    f = {
        name: _benchmark_tsv(tmp_path / f"{name}.tsv", [s])
        for name, s in [
            ("lora_en", 10.0),
            ("erase_en", 1.0),
            ("ga_en", 30.0),
            ("lora_hi", 20.0),
            ("erase_hi", 2.0),
            ("ga_hi", 50.0),
        ]
    }
    groups = {
        lang: {
            "qr_erase": {"lora_s": [f[f"lora_{lang}"]], "erase_s": [f[f"erase_{lang}"]]},
            "ga": {"baseline_s": [f[f"ga_{lang}"]]},
        }
        for lang in ("en", "hi")
    }
    costs = grouped_method_costs(groups, "unlearn")
    assert list(costs.columns[:2]) == ["method", "unlearn"] and costs["unlearn"].tolist() == ["en", "en", "hi", "hi"]
    df, spec = cost_table(costs, "unlearn", "Unlearn in")
    assert df["method"].tolist() == ["qr_erase", "ga"]  # one row per method, in the experiments' order
    wide = df.set_index("method")
    assert wide.loc["qr_erase", ["en_lora_s", "en_erase_s", "en_total_s"]].tolist() == [10.0, 1.0, 11.0]
    assert wide.loc["ga", ["hi_baseline_s", "hi_unlearn_s"]].tolist() == [50.0, 50.0]
    assert pd.isna(wide.loc["ga", "hi_erase_s"]) and pd.isna(wide.loc["qr_erase", "hi_baseline_s"])
    assert [c.group for c in spec.columns][::6] == ["Unlearn in en", "Unlearn in hi"]
    write_table(df, spec, tmp_path / "cost.csv", tmp_path / "cost.md", None)
    md = (tmp_path / "cost.md").read_text()
    assert "Unlearn in en" in md and "Unlearn in hi" in md and "| QR-Erase | 10.0 |" in md
    assert pd.read_csv(tmp_path / "cost.csv").loc[1, "hi_total_s"] == 50.0


def test_method_costs_bad_input(tmp_path):
    from qrerase.bench.cost import method_costs, read_snakemake_benchmark

    with pytest.raises(ValueError, match="benchmark file not found"):
        read_snakemake_benchmark(tmp_path / "missing.tsv")
    (tmp_path / "bad.tsv").write_text("seconds\n1.0\n")
    with pytest.raises(ValueError, match="not a Snakemake benchmark file"):
        read_snakemake_benchmark(tmp_path / "bad.tsv")
    with pytest.raises(ValueError, match="unknown component"):
        method_costs({"ga": {"train_s": []}})
    from qrerase.bench.cost import COST_COLUMNS
    from qrerase.reports.cost import cost_table

    with pytest.raises(ValueError, match=r"missing column\(s\) \['unlearn'\]"):
        cost_table(method_costs({}), "unlearn")
    row = {"method": "ga", "unlearn": "en", **{c: 1.0 for c in COST_COLUMNS}}
    with pytest.raises(ValueError, match=r"duplicate \(method, unlearn\)"):
        cost_table(pd.DataFrame([row, row]), "unlearn")
