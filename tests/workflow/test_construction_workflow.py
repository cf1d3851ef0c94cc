"""The construction study (rules/studies/construction.smk, docs/real-model.md) end to end on the tiny
model, and its planning-time refusals."""

from __future__ import annotations

import pandas as pd
import pytest
from support.snakemake_cli import snakemake, write_config

STUDY = {
    "starts": ["finetuned", "pretrained"],
    "projectors": ["k", "full"],
    "ranks": [2, 4],
    "methods": ["qr_erase_ll"],  # CPQR and the LL layers (the SVD path: tests/unit/test_construction.py)
    "scales": [1, 4, 16, 64],
    "stop_rise": 0.5,
    "protocol_ranks": [4],
    "baselines": ["npo"],
    "epochs": [1],
}


def _config(workdir, **study):
    return write_config(
        workdir,
        threads=2,
        methods={"tofu": ["npo", "qr_erase_ll"]},
        tradeoff={
            "scales": [0, 1],
            "ranks": [2],
            "epochs": [1],
            "baselines": ["npo"],
            "max_retain_nll_rise": 0.1,
            "protocol": "nll",
        },
        construction={**STUDY, **study},
    )


@pytest.mark.workflow
def test_a_config_without_the_study_or_with_a_bad_rank_is_refused_at_planning(tmp_path):
    plain = write_config(tmp_path)
    proc = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(plain), "--", "construction", check=False)
    assert proc.returncode != 0 and "has no `construction` section" in proc.stderr + proc.stdout
    bad = _config(tmp_path, ranks=[2, 8])  # the test config's lora.r is 4
    proc = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(bad), "--", "construction", check=False)
    assert proc.returncode != 0 and "construction.ranks': [8] exceed lora.r = 4" in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_the_construction_study_end_to_end_on_the_tiny_model(tmp_path):
    cfg = _config(tmp_path)
    sweep_point = "results/tofu_forget10/tradeoff/k2/qr_erase_ll/lambda1.csv"  # the main sweep's lambda = 1 point
    snakemake(tmp_path, "--cores", "2", "--configfile", str(cfg), "--", "construction", sweep_point)
    root = tmp_path / "results" / "tofu_forget10" / "construction"
    table = pd.read_csv(tmp_path / "results" / "tables" / "tofu_construction.csv")
    variants = table[table["family"] == "subspace"]
    # 2 starts x (k = 2: both projectors; k = 4 = lora.r: one) x 1 method
    assert len(variants) == 6 and set(variants["projector"]) == {"k", "full"}
    assert set(variants.loc[variants["rank"] == 4, "projector"]) == {"k"}
    # the TOFU-protocol points exist exactly at protocol_ranks
    assert variants.loc[variants["rank"] == 4, "forget_quality"].between(0, 1).all()
    assert variants.loc[variants["rank"] == 2, "forget_quality"].isna().all()
    # the finetuned / k / k = 2 sweep rebuilds the main run's edit: its lambda = 1 point is the main sweep's
    ours = pd.read_csv(root / "finetuned" / "k" / "k2" / "qr_erase_ll.csv").set_index("scale").loc[1.0]
    main = pd.read_csv(tmp_path / sweep_point).iloc[0]
    for col in ("forget_nll", "retain_nll", "tune_retain_nll"):
        assert ours[col] == pytest.approx(main[col], rel=1e-6), col
    # every sweep stops at the first lambda past the bound, or runs the whole grid
    for f in root.glob("*/*/k*/*.csv"):
        if f.name.endswith(("_modules.csv", "_pick.csv")):
            continue
        sweep = pd.read_csv(f)
        unedited = pd.read_csv(root / "unedited.csv").iloc[0]
        past = sweep["tune_retain_nll"] - unedited["tune_retain_nll"] > 0.5
        assert not past.iloc[:-1].any() and (past.iloc[-1] or len(sweep) == 4), f
        assert list(sweep["stopped"]) == [False] * (len(sweep) - 1) + [bool(past.iloc[-1])], f
    # the explaining quantities: a share of the energy and of the norm, the full projector's columns
    modules = pd.read_csv(tmp_path / "results" / "tables" / "tofu_construction_modules.csv")
    assert modules["kept_energy"].between(0, 1 + 1e-9).all() and modules["survives"].between(0, 1 + 1e-9).all()
    assert set(modules.loc[modules["projector"] == "full", "retain_columns"]) == {4}
    effect = pd.read_csv(root / "pretrained" / "adapter_effect.csv").set_index("adapter")
    assert effect.loc["forget", "forget_nll"] < effect.loc["none", "forget_nll"]  # the adapter learned its set
    baselines = table[table["family"] == "baseline"]
    assert list(baselines["epochs"]) == [1] and baselines["picked"].sum() <= 1
    assert baselines.loc[baselines["epochs"] == 1, "forget_quality"].between(0, 1).all()
    md = (tmp_path / "results" / "tables" / "tofu_construction.md").read_text()
    assert "## The adapters on their own checkpoint" in md and "The fine-tuned (unedited) model" in md
    assert (tmp_path / "results" / "figures" / "tofu_construction.png").stat().st_size > 10_000
