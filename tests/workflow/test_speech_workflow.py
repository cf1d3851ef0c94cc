"""End-to-end: the speech track of the workflow on tests/configs/test_speech.yaml, through the real snakemake CLI."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import REPO
from support.snakemake_cli import assert_config_error, build_report, planned_rules, snakemake, write_speech_config

pytestmark = pytest.mark.workflow

SCALE = yaml.safe_load((REPO / "tests/configs/test_speech.yaml").read_text())["speech"]["scale"]  # the table's λ
ROWS = ["base", "ga", "scrub", "bad_teaching", "unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("speech")
    cfg = write_speech_config(wd)
    snakemake(wd, "--cores", "2", "--configfile", str(cfg))
    return wd


def test_speech_table_rows_and_columns(workdir):
    table = pd.read_csv(workdir / "results/tables/speech.csv")
    assert list(table["method"]) == ROWS
    cols = [f"{s}_{d}" for s in ("sample", "class") for d in ("D_t", "D_f", "D_r")]
    assert cols == [c for c in table.columns if c in cols]
    assert table[cols].apply(lambda c: c.between(0, 100)).all().all()
    assert {"sample_D_f_mark", "class_D_r_mark"} <= set(table.columns)
    assert (table.loc[table["method"] == "base", "reference"] == 1).all()
    md = (workdir / "results/tables/speech.md").read_text()
    tex = (workdir / "results/tables/speech.tex").read_text()
    for text in ("**Sample**", "**Class**", "Fine-Tuned Model", "SCRUB", "Bad Teaching", "QR-Erase (LL)"):
        assert text in md
    assert "\\multicolumn{3}{c}{\\textbf{Sample}}" in tex and "$D_f$ $\\downarrow$" in tex


def test_table_numbers_are_the_evaluations(workdir):
    table = pd.read_csv(workdir / "results/tables/speech.csv").set_index("method")
    for setting in ("sample", "class"):
        ev = pd.read_csv(workdir / f"results/speech_{setting}/speech_eval/qr_erase_k2.csv").set_index("set")
        assert ev.loc["D_f", "k"] == 2  # top-2 in the test config
        assert table.loc["qr_erase", f"{setting}_D_f"] == pytest.approx(100 * ev.loc["D_f", "accuracy"])
        sizes = pd.read_csv(workdir / f"results/speech_{setting}/speech_eval/base.csv").set_index("set")["n"]
        index = pd.read_csv(workdir / "results/speech/data/index.csv")
        assert sizes["D_f"] == (index[f"{setting}_partition"] == "forget").sum()
    index = pd.read_csv(workdir / "results/speech/data/index.csv")
    assert (index.loc[index["class_partition"] == "forget", "speaker"] == "theo").all()


def test_attack_auc_table_is_the_loss_attack(workdir):
    # speech_mia.csv: the LOSS attack's AUC per setting, recomputed here from the per-clip losses
    import json

    import numpy as np

    table = pd.read_csv(workdir / "results/tables/speech_mia.csv").set_index("method")
    assert list(table.index) == ROWS and table.loc["base", "reference"] == 1
    index = pd.read_csv(workdir / "results/speech/data/index.csv")
    for setting in ("sample", "class"):
        record = json.loads((workdir / f"results/speech_{setting}/speech_eval/qr_erase_k2_mia.json").read_text())
        members, held = np.array(record["member_loss"]), np.array(record["nonmember_loss"])
        auc = ((members[:, None] < held[None, :]) + 0.5 * (members[:, None] == held[None, :])).mean()
        assert table.loc["qr_erase", f"{setting}_mia_loss"] == pytest.approx(auc, abs=1e-12)
        trained = (index[f"{setting}_partition"] == "forget") & (index["split"] == "train")
        assert len(members) == trained.sum()
        if setting == "class":  # theo's validation and test clips
            assert len(held) == ((index["speaker"] == "theo") & index["split"].isin(["val", "test"])).sum()
    assert table.loc["base", "class_mia_loss"] > 0.5  # the fine-tuned model was trained on theo's clips


def test_energy_and_rank_outputs(workdir):
    for name in ("speech_energy", "speech_rank", "speech_sample_energy", "speech_class_energy"):
        png = workdir / f"results/figures/{name}.png"
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    energy = pd.read_csv(workdir / "results/tables/speech_energy.csv")
    assert list(energy["setting"]) == ["sample", "class"]
    assert (energy["effective_layers"] >= 1).all() and (energy["effective_layers"] <= 2 + 1e-9).all()  # 2 blocks
    rank = pd.read_csv(workdir / "results/tables/speech_rank.csv")
    assert sorted(set(rank["rank"])) == [1, 2] and set(rank["decomp"]) == {"cpqr", "svd"}
    for _decomp, d in rank.groupby("decomp"):
        err = d.sort_values("rank")["recon_error"].to_numpy()
        assert err[1] <= err[0]  # reconstruction error falls with the rank


def test_baselines_write_loss_curves_and_benchmarks(workdir):
    for setting in ("sample", "class"):
        for method in ("ga", "scrub", "bad_teaching"):
            curve = pd.read_csv(workdir / f"results/speech_{setting}/baselines/{method}/loss.csv")
            assert len(curve) > 0 and {"step", "phase", "loss"} <= set(curve.columns)
            assert (workdir / f"results/benchmarks/speech_baseline/speech_{setting}_{method}.tsv").is_file()
    assert (workdir / "results/benchmarks/speech_finetune/speech.tsv").is_file()
    assert (workdir / "results/benchmarks/speech_lora/speech_class_forget.tsv").is_file()
    # the cost table: per setting, baselines' training time vs LoRA + closed-form erase, from those files
    cost = pd.read_csv(workdir / "results/tables/speech_cost.csv").set_index("method")
    assert list(cost.index) == ROWS[1:]
    for setting in ("sample", "class"):
        base, sub = cost.loc[["ga", "scrub", "bad_teaching"]], cost.loc[ROWS[4:]]
        assert (base[f"{setting}_baseline_s"] > 0).all() and base[f"{setting}_erase_s"].isna().all()
        assert (sub[[f"{setting}_{c}" for c in ("lora_s", "task_matrices_s", "erase_s")]] > 0).all().all()
        lora = sum(
            float(
                pd.read_csv(workdir / f"results/benchmarks/speech_lora/speech_{setting}_{s}.tsv", sep="\t")["s"].iloc[0]
            )
            for s in ("forget", "retain")
        )
        assert sub[f"{setting}_lora_s"].tolist() == pytest.approx([lora] * 4)
    md = (workdir / "results/tables/speech_cost.md").read_text()
    assert "Setting sample" in md and "Setting class" in md and "SCRUB" in md


def test_report_renders_the_tracks_tables_and_figures(workdir):
    names = ("speech.md", "speech_mia.md", "speech_energy.png", "speech_rank.png", "speech_sample_energy.png")
    build_report(workdir, write_speech_config(workdir), *names, "speech_cost.md")


def test_changing_the_speech_rank_reruns_no_training(workdir):
    cfg = write_speech_config(workdir, "rank1.yaml", speech__rank=1)
    rules = planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg)))
    # new models at k=1: all four methods in the sample setting; the two LL ones in the class setting,
    # whose rank sweep (ranks [1, 2]) already holds qr_erase_k1 and unlearn_k1
    assert rules.get("speech_table") == 1 and rules.get("speech_evaluate") == 6
    assert not {"speech_data", "speech_finetune", "speech_lora", "speech_baseline", "task_matrices"} & set(rules)


def test_pretraining_feeds_finetuning_and_the_lora_base(workdir):
    curve = pd.read_csv(workdir / "results/speech/models/pretrained_loss.csv")
    assert len(curve) > 0 and (workdir / "results/benchmarks/speech_pretrain/speech.tsv").is_file()
    pre = yaml.safe_load((workdir / "results/speech/models/pretrained/config.json").read_text())
    full = yaml.safe_load((workdir / "results/speech/models/full/config.json").read_text())
    assert len(pre["id2label"]) == 10 and len(full["id2label"]) == 6  # digits, then speakers
    index = pd.read_csv(workdir / "results/speech/data/index.csv")
    assert (index["split"] == "val").sum() == 6 * 2  # round(0.1 * 20) non-test utterances per speaker
    log = (workdir / "results/logs/speech_lora/speech_class_forget.log").read_text()
    assert "LoRA base: the pretrained encoder" in log


@pytest.fixture(scope="module")
def tradeoff(workdir) -> pd.DataFrame:
    cfg = write_speech_config(workdir)
    snakemake(workdir, "speech_tradeoff_all", "--cores", "2", "--configfile", str(cfg))
    return pd.read_csv(workdir / "results/tables/speech_tradeoff.csv")


def test_tradeoff_sweep_covers_every_method_and_point(workdir, tradeoff):
    assert (workdir / "results/figures/speech_tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    assert set(tradeoff["setting"]) == {"class"}  # speech.tradeoff.settings of the test config
    for setting in ("class",):
        d = tradeoff[tradeoff["setting"] == setting]
        assert (d["method"] == "base").sum() == 1
        for m in ("unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"):
            pts = d[d["method"] == m]
            assert sorted(zip(pts["rank"], pts["value"])) == [(1, 1.0), (1, 4.0), (2, 1.0), (2, 4.0)]
        assert sorted(d.loc[d["method"] == "ga", "value"]) == [0.0005, 0.002]
        assert set(d.loc[d["method"] == "scrub", "param"]) == {"epochs"}
    assert tradeoff[["D_t", "D_f", "D_r", "D_v"]].apply(lambda c: c.between(0, 1)).all().all()
    rule = pd.read_csv(workdir / "results/tables/speech_scale_rule.csv")
    assert set(rule["method"]) == {"unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"} and (rule["rank"] == 2).all()
    assert "selected_scale" in rule.columns  # the λ rule's pick, named as in the text tracks


def test_tradeoff_points_equal_the_workflow_evaluations(workdir, tradeoff):
    # (k = speech.rank, λ = speech.scale) in-process equals the merged erase the table evaluates; the
    # configured baseline knob re-uses the trained baseline
    for setting in ("class",):
        d = tradeoff[tradeoff["setting"] == setting]
        for method, model, where in (
            ("qr_erase_ll", "qr_erase_ll_k2", (d["rank"] == 2) & (d["value"] == SCALE)),
            ("ga", "ga", d["value"] == 0.0005),
            ("base", "base", d["method"] == "base"),
        ):
            ev = pd.read_csv(workdir / f"results/speech_{setting}/speech_eval/{model}.csv").set_index("set")["accuracy"]
            row = d[(d["method"] == method) & where].iloc[0]
            assert [row[s] for s in ("D_t", "D_f", "D_r")] == pytest.approx([ev[s] for s in ("D_t", "D_f", "D_r")])


def test_changing_the_sweep_grid_reruns_no_training(workdir, tradeoff):
    cfg = write_speech_config(workdir, "grid.yaml", speech__tradeoff__scales=[1.0, 2.0], speech__scale=2.0)
    rules = planned_rules(snakemake(workdir, "speech_tradeoff_all", "-n", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("speech_tradeoff_subspace") == 4 and rules.get("speech_tradeoff") == 1  # 4 methods x class
    assert not {
        "speech_pretrain",
        "speech_finetune",
        "speech_lora",
        "speech_baseline",
        "speech_tradeoff_baseline",
        "task_matrices",
        "factors",
    } & set(rules)
    # both settings swept: the sample setting's points are planned (4 methods; ga at 2 lrs, scrub, bad_teaching)
    cfg = write_speech_config(workdir, "both.yaml", speech__tradeoff__settings=["sample", "class"])
    rules = planned_rules(snakemake(workdir, "speech_tradeoff_all", "-n", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("speech_tradeoff_subspace") == 4 and rules.get("speech_tradeoff_baseline") == 4
    # the sweep covers only the settings the track runs
    cfg = write_speech_config(
        workdir,
        "class.yaml",
        speech__tradeoff__scales=[1.0, 2.0],
        speech__tradeoff__settings=["sample", "class"],
        speech__scale=2.0,
        speech__settings=["class"],
        speech__rank_settings=["class"],
    )
    rules = planned_rules(snakemake(workdir, "speech_tradeoff_all", "-n", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("speech_tradeoff_subspace") == 4 and rules.get("speech_tradeoff") == 1


def test_hubert_xlarge_config_plans_the_speech_track(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "hubert-xlarge.yaml").read_text())
    cfg["speech"]["data"]["root"] = str(REPO / "data" / "fsdd")
    cfg["tofu"] = {"data": {"source": "local", "root": str(REPO / "data" / "tofu"), "split": "forget10"}}
    path = tmp_path / "xl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rules = planned_rules(snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(path)))
    assert rules["speech_finetune"] == 1 and rules["speech_lora"] == 4 and rules["speech_baseline"] == 6
    assert "speech_pretrain" not in rules  # the hub checkpoint is the pretrained model
    assert rules["speech_evaluate"] == 2 * 8 + 2 * 8  # table rows + the rank sweep's extra ranks, both settings


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"speech__forget_speakers": ["alice"]}, "config key 'speech.forget_speakers': speaker 'alice' not in"),
        ({"speech__forget_fraction": 1.5}, "config key 'speech.forget_fraction'"),
        ({"speech__forget_fraction": 0}, "config key 'speech.forget_fraction'"),
        ({"methods": {"tofu": ["qr_erase"], "speech": ["qr_erase", "npo"]}}, "config key 'methods.speech.1'"),
        ({"speech__ranks": [1, 8]}, "exceeds the LoRA rank speech.lora.r=4"),
        ({"speech__data__root": "/no/such/dir"}, "config key 'speech.data.root': /no/such/dir"),
        ({"speech__lora__base": "scratch"}, "config key 'speech.lora.base'"),
        ({"speech__pretrain__epochs": 0}, "config key 'speech.pretrain.epochs'"),
        (
            {"speech__tradeoff__baselines__ga": {"param": "alpha", "values": [1]}},
            "config key 'speech.tradeoff.baselines.ga.param'",
        ),
        ({"speech__tradeoff__ranks": [1, 8]}, "exceeds the LoRA rank speech.lora.r=4"),
        (
            {"speech__settings": ["class"], "speech__rank_settings": [], "speech__tradeoff__settings": ["sample"]},
            "config key 'speech.tradeoff.settings'",
        ),
    ],
)
def test_bad_speech_config_fails_at_dag_construction(tmp_path, overrides, message):
    assert_config_error(tmp_path, write_speech_config(tmp_path, **overrides), message)


# the robustness stage on the fixture's run: a small grid (its own jobs: ~10 s each), one subspace method
ROBUSTNESS = {
    "methods": {"speech": ["qr_erase_ll"]},
    "budgets": [0, 1, 2],
    "lr_factors": [1.0],
    "benign_lr_factors": [1.0],
    "modes": ["full", "lora"],
    "formats": ["q4_0"],
    "optional_formats": [],  # config.yaml's NF4 and int8 are left out of this small grid
}
ROBUST_MODELS = ["base", "retain", "qr_erase_ll_k2"]


@pytest.fixture(scope="module")
def robustness(workdir):
    cfg = write_speech_config(workdir, "robustness.yaml", **{f"robustness__{k}": v for k, v in ROBUSTNESS.items()})
    proc = snakemake(workdir, "robustness", "--cores", "2", "--configfile", str(cfg))
    rows = {
        (setting, m): pd.read_csv(workdir / f"results/speech_{setting}/robustness/{m}.csv").fillna({"format": ""})
        for setting in ("sample", "class")
        for m in ROBUST_MODELS
    }
    return proc, rows


def test_robustness_rows_follow_the_protocol(workdir, robustness):
    """Per model: every budget of every training attack, budget 0 = the model as given; A and B partition
    D_f as qrerase.tracks.speech.robustness.speech_sets draws them; the floor never learned the class setting's
    speaker."""
    import re

    from qrerase.robustness.settings import robustness_settings
    from qrerase.tracks.speech.robustness import speech_sets

    _, rows = robustness
    index = pd.read_csv(workdir / "results/speech/data/index.csv")
    seed = yaml.safe_load((REPO / "config.yaml").read_text())["seed"]  # the test config keeps the default
    for (setting, model), r in rows.items():
        train = r[r["attack"] != "quantize"]
        for _, g in train.groupby(["attack", "mode", "lr_factor"]):
            assert sorted(set(g["budget"])) == [0, 1, 2] and set(g["set"]) == {"B", "forget", "utility"}
        start = train[train["budget"] == 0].groupby("set")["value"].agg(["min", "max"])
        assert (start["min"] == start["max"]).all()  # every attack starts from the same model
        assert set(r.loc[r["attack"] == "quantize", "set"]) == {"forget", "utility", "weights"}
        log = (workdir / f"results/logs/robustness_speech/speech_{setting}_{model}.log").read_text()
        a, retain = map(int, re.search(r"A (\d+), retain (\d+) clips", log).groups())
        scored, training = speech_sets(index, setting, seed, robustness_settings(ROBUSTNESS).a_share)
        assert not set(training["A"]) & set(scored["B"])
        assert (a, retain) == (len(training["A"]), len(training["retain"]))
        assert len(training["A"]) + len(scored["B"]) == (index[f"{setting}_partition"] == "forget").sum()
    floor = rows[("class", "retain")]
    assert floor.loc[(floor["budget"] == 0) & (floor["set"] == "B"), "value"].eq(0).all()  # theo never trained on


def test_robustness_table_against_the_definitions(workdir, robustness):
    _, rows = robustness
    table = pd.read_csv(workdir / "results/tables/speech_robustness.csv").fillna({"format": "", "mode": ""})
    assert set(table["exp"]) == {"speech_sample", "speech_class"} and set(table["model"]) == set(ROBUST_MODELS)
    train = table[table["attack"] != "quantize"]
    assert set(train["budget"]) == {0, 1, 2}
    for row in train.itertuples():
        setting = row.exp.removeprefix("speech_")

        def value(model, row=row, setting=setting):
            r = rows[(setting, model)]
            hit = r[(r["attack"] == row.attack) & (r["mode"] == row.mode) & (r["lr_factor"] == row.lr_factor)]
            return float(hit.loc[(hit["budget"] == row.budget) & (hit["set"] == row.set), "value"].iloc[0])

        s, floor, ceiling = value(row.model), value("retain"), value("base")
        assert row.statistic == pytest.approx(s)
        if abs(ceiling - floor) < 1e-9:  # the attack left the floor where the ceiling is: undefined
            assert pd.isna(row.recovery)
        else:  # (attacked − floor) / (ceiling − floor): 1 for the ceiling, 0 for the floor
            assert row.recovery == pytest.approx((s - floor) / (ceiling - floor))
    quant = table[table["attack"] == "quantize"]
    assert set(quant["format"]) == {"q4_0"} and quant.loc[quant["model"] != "base", "edit_step_ratio"].gt(0).all()
    assert quant.loc[quant["model"] == "base", "edit_step_ratio"].isna().all()  # the ceiling has no edit
    refs = quant[quant["model"].isin(["base", "retain"])]
    assert refs["forgetting_undone"].isna().all()  # the unscaled share: the methods' own forgetting only
    # scaled by the quantized floor and ceiling: 1 and 0 for them, or undefined where the round trip ties them
    assert (refs["recovery"].isna() | (refs["recovery"] == refs["model"].map({"base": 1.0, "retain": 0.0}))).all()
    sub = pd.read_csv(workdir / "results/tables/speech_robustness_subspace.csv")
    got = sub.groupby(["exp", "model"])["subspace"].apply(set)
    assert all(
        got[(e, m)] == ({"erased", "ceiling"} if m == "qr_erase_ll_k2" else set()) | {"task", "retain", "random"}
        for e, m in got.index
    )
    # every row of a model over the same modules: the references' all 8 (4 attention projections x 2 layers),
    # the LL method's those it edits
    assert (sub.groupby(["exp", "model"])["modules"].nunique() == 1).all()
    assert (sub.loc[sub["model"] != "qr_erase_ll_k2", "modules"] == 8).all()
    assert sub.loc[sub["model"] == "qr_erase_ll_k2", "modules"].between(1, 8).all()
    md = (workdir / "results/tables/speech_robustness.md").read_text()
    assert "### speech_sample" in md and "### speech_class" in md and "Retain reference (floor)" in md
    for name in ("speech_robustness", "speech_robustness_subspace"):
        assert (workdir / f"results/figures/{name}.png").read_bytes()[:4] == b"\x89PNG"
