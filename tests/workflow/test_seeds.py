"""Seed spreads (`snakemake seeds`): the library's mean ± sd per cell, the planning of one replica of the
workflow per extra seed, and a tiny end-to-end run over two seeds."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import REPO
from support.snakemake_cli import snakemake

from qrerase.reports.seeds import measures_of, render_spread, seed_spread


def _table(utility: float, fq: float | None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "method": ["base", "retain", "qr_erase"],
            "display_label": ["Base Model", "Retain reference", "QR-Erase"],
            "reference": [1, 1, 0],
            "model_utility": [0.9, 0.8, utility],
            "forget_quality": [1e-4, math.nan, fq],
            "model_utility_mark": ["", "", "best"],
            "forget_quality_mark": ["", "", ""],
        }
    )


def test_seed_spread_gives_mean_sd_min_max_and_count_per_cell():
    tables = {0: _table(0.5, 1e-3), 1: _table(0.7, 3e-3), 2: _table(0.6, None)}
    spread = seed_spread(tables)
    assert measures_of(tables[0]) == ["model_utility", "forget_quality"]
    assert list(spread["method"]) == ["base", "retain", "qr_erase"] and set(spread["seeds"]) == {3}
    row = spread.set_index("method").loc["qr_erase"]
    assert row["model_utility_mean"] == pytest.approx(0.6) and row["model_utility_sd"] == pytest.approx(0.1)
    assert row["model_utility_min"] == 0.5 and row["model_utility_max"] == 0.7 and row["model_utility_n"] == 3
    assert row["forget_quality_mean"] == pytest.approx(2e-3) and row["forget_quality_n"] == 2
    base = spread.set_index("method").loc["base"]
    assert base["model_utility_sd"] == 0 and base["forget_quality_mean"] == pytest.approx(1e-4)
    retain = spread.set_index("method").loc["retain"]
    assert retain["forget_quality_n"] == 0 and math.isnan(retain["forget_quality_mean"])
    assert not any(c.endswith("_mark") or c.startswith("model_utility_mark") for c in spread.columns)
    md = render_spread(spread, [0, 1, 2], "tofu")
    assert "seeds 0, 1, 2 (n = 3)" in md
    assert "| QR-Erase | 0.6 ± 0.1 | 0.002 ± 0.00141 (n=2) |" in md
    assert "| Retain reference | 0.8 ± 0 | — |" in md


def test_seed_spread_rows_follow_the_first_table_and_one_seed_has_no_sd():
    shuffled = _table(0.7, 3e-3).iloc[::-1].reset_index(drop=True)
    spread = seed_spread({4: _table(0.5, 1e-3), 9: shuffled})
    assert list(spread["method"]) == ["base", "retain", "qr_erase"]
    assert spread.set_index("method").loc["qr_erase", "model_utility_mean"] == pytest.approx(0.6)
    one = seed_spread({0: _table(0.5, 1e-3)})
    assert one["model_utility_sd"].isna().all()
    assert "| QR-Erase | 0.5 | 0.001 |" in render_spread(one, [0], "tofu")


def test_seed_spread_refuses_tables_that_do_not_match():
    with pytest.raises(ValueError, match="no tables"):
        seed_spread({})
    with pytest.raises(ValueError, match=r"seed 1: methods differ .*'qr_erase'"):
        seed_spread({0: _table(0.5, 1e-3), 1: _table(0.5, 1e-3).iloc[:2]})
    with pytest.raises(ValueError, match="seed 1: measures"):
        seed_spread({0: _table(0.5, 1e-3), 1: _table(0.5, 1e-3).drop(columns="forget_quality")})
    with pytest.raises(ValueError, match="not a track table"):
        seed_spread({0: pd.DataFrame({"x": [1]})})


# ---------------------------------------------------------------------------------------------
# Workflow
# ---------------------------------------------------------------------------------------------
def seeds_config(workdir: Path, seeds) -> Path:
    """The size study's tiny TOFU configuration (tests/configs/test_size.yaml) with `seeds`."""
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "test_size.yaml").read_text())
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    cfg["seeds"] = seeds
    cfg["methods"]["tofu"] = ["qr_erase"]  # one method per seed (test time): the spread is per row
    path = workdir / "seeds.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_seeds_plans_one_replica_per_extra_seed_and_stays_out_of_the_default_run(tmp_path):
    cfg = seeds_config(tmp_path, [0, 1, 2])
    text = snakemake(tmp_path, "-n", "-p", "--cores", "1", "--configfile", str(cfg), "--", "seeds").stdout
    assert "results/tables/tofu_seeds.md" in text
    for s in (1, 2):
        assert f"results/seeds/s{s}/tables/tofu.csv" in text
        assert f"rule seed{s}_pretrain:" in text
        pretrain = next(line for line in text.splitlines() if f"seeds/s{s}/logs/pretrain/" in line and "--job" in line)
        assert f'"seed":{s}' in pretrain and f"results/seeds/s{s}/tofu_forget10/models/pretrained" in pretrain
    assert "results/seeds/s0/" not in text  # the seed of `seed` is the default run's results/
    assert "results/tables/tofu.csv" in text
    default = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg)).stdout
    assert "results/seeds/" not in default and "seed_table" not in default
    assert not (tmp_path / "results").exists()


def test_seeds_rejects_an_empty_or_repeated_list(tmp_path):
    for bad, why in (([], "seeds"), ([1, 1], "seeds")):
        cfg = seeds_config(tmp_path, bad)
        proc = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg), "--", "seeds", check=False)
        assert proc.returncode != 0 and f"config key '{why}'" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_seeds_end_to_end_on_two_seeds(tmp_path):
    cfg = seeds_config(tmp_path, [0, 1])
    snakemake(tmp_path, "--cores", "2", "--configfile", str(cfg), "--", "seeds")
    results = tmp_path / "results"
    per_seed = {
        0: pd.read_csv(results / "tables" / "tofu.csv"),
        1: pd.read_csv(results / "seeds" / "s1" / "tables" / "tofu.csv"),
    }
    # the replica ran with its own seed: another fine-tuned model, so other numbers
    full = "tofu_forget10/models/full/model.safetensors"
    assert (results / full).read_bytes() != (results / "seeds" / "s1" / full).read_bytes()
    assert not per_seed[0]["forget_quality"].equals(per_seed[1]["forget_quality"])
    spread = pd.read_csv(results / "tables" / "tofu_seeds.csv").set_index("method")
    assert list(spread.index) == ["base", "retain", "qr_erase"] and set(spread["seeds"]) == {2}
    for method in ("base", "qr_erase"):
        vals = [t.set_index("method").at[method, "forget_quality"] for t in per_seed.values()]
        assert spread.at[method, "forget_quality_mean"] == pytest.approx(sum(vals) / 2)
        assert spread.at[method, "forget_quality_sd"] == pytest.approx(abs(vals[0] - vals[1]) / math.sqrt(2))
        assert spread.at[method, "forget_quality_n"] == 2
    assert spread.at["retain", "forget_quality_n"] == 0
    assert "over seeds 0, 1 (n = 2)" in (results / "tables" / "tofu_seeds.md").read_text()
    # the seed-1 artifacts carry provenance records like every other output
    assert (results / "provenance" / "records" / "seeds" / "s1" / "tables" / "tofu.csv.json").is_file()
