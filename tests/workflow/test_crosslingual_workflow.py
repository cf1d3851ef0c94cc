"""End-to-end: the cross-lingual track on its small test config, through the real snakemake CLI; the
large config's plan; config errors at DAG construction."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import REPO
from support.snakemake_cli import assert_config_error, build_report, planned_rules, snakemake, write_yaml_config

pytestmark = pytest.mark.workflow

#: the test config's methods (the two CPQR ones; the SVD pair runs on the TOFU track's test config)
METHODS = yaml.safe_load((REPO / "tests/configs/test_crosslingual.yaml").read_text())["methods"]["crosslingual"]
ALL_METHODS = ["unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"]  # config/crosslingual_all.yaml


def xling_config(
    workdir: Path, name: str = "xling.yaml", base: str = "tests/configs/test_crosslingual.yaml", **overrides
) -> Path:
    """tests/configs/test.yaml + the given cross-lingual config, data roots made absolute, then overrides."""
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "test.yaml").read_text())
    for key, value in yaml.safe_load((REPO / base).read_text()).items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    cfg["crosslingual"]["data"]["english_root"] = str(REPO / "data" / "tofu")
    cfg["crosslingual"]["data"]["root"] = str(REPO / "data" / "mtofu")
    return write_yaml_config(workdir, name, cfg, overrides)


@pytest.fixture(scope="module")
def xling_workdir(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("xling")
    snakemake(wd, "--cores", "2", "--configfile", str(xling_config(wd)))
    return wd


def test_pairs_table(xling_workdir):
    table = pd.read_csv(xling_workdir / "results/tables/crosslingual.csv")
    assert list(table["method"]) == ["base", "retain", *METHODS]
    pairs = ["en>en", "en>hi_R", "hi_R>en", "hi_R>hi_R"]
    assert [c for c in table.columns if c.endswith(":utility")] == [f"{p}:utility" for p in pairs]
    assert [c for c in table.columns if c.endswith(":forget")] == [f"{p}:forget" for p in pairs]
    for p in pairs:
        u, f = table[f"{p}:utility"], table[f"{p}:forget"]
        assert ((u >= 0) & (u <= 1)).all() and table[f"{p}:utility"].notna().all()
        assert ((f[table["method"] != "retain"] >= 0) & (f[table["method"] != "retain"] <= 1)).all()
        # two ranked rows: best and second, or no mark when their printed values tie (an LL selection
        # of every layer is the all-layer edit)
        printed = {f"{v:.4f}" for v in u[2:]}
        marks = sorted(table[f"{p}:utility_mark"].fillna("")[2:])
        assert marks == (["", ""] if len(printed) == 1 else ["best", "second"]), (printed, marks)
    md = (xling_workdir / "results/tables/crosslingual.md").read_text()
    assert "**en→hi_R**" in md and "QR-Erase (LL)" in md
    tex = (xling_workdir / "results/tables/crosslingual.tex").read_text()
    assert r"\textbf{hi\_R$\to$en}" in tex and r"\begin{table*}" in tex


def test_matrix_table_and_metrics(xling_workdir):
    matrix = pd.read_csv(xling_workdir / "results/tables/crosslingual_matrix.csv")
    assert list(matrix["pair"]) == ["base>en", "base>hi_R", "en>en", "en>hi_R", "hi_R>en", "hi_R>hi_R"]
    assert list(matrix["reference"]) == [1, 1, 0, 0, 0, 0]
    assert list(matrix["display_label"])[-2] == "Hindi (R) → English"
    metrics = pd.read_csv(xling_workdir / "results/xling/metrics.csv")
    assert len(metrics) == (2 + 2 * len(METHODS)) * 2
    # the matrix rows are the metrics of the table method (same numbers, not recomputed differently)
    row = metrics.query("unlearn == 'hi_R' and method == 'qr_erase_ll' and eval == 'en'").iloc[0]
    assert matrix.set_index("pair").loc["hi_R>en", "model_utility"] == pytest.approx(row["model_utility"], rel=1e-9)
    # the base model did not forget: its own forget-set truth ratios differ from the reference's
    base = metrics.query("method == 'base'")
    assert (base["forget_quality"] < 1).all()


def test_romanised_files_and_logs(xling_workdir):
    rows = [
        json.loads(line) for line in (xling_workdir / "results/xling/romanised/hi_R/forget01_perturbed.jsonl").open()
    ]
    assert len(rows) == 40 and all(ord(ch) < 0x900 or ord(ch) > 0x97F for r in rows for ch in r["answer"])
    for lang in ("en", "hi_R"):
        log = xling_workdir / "results/xling_hi_R/eval_languages/qr_erase_ll_k2" / lang / "eval_log_forget.json"
        assert len(json.loads(log.read_text())["avg_gt_loss"]) == 20


def test_energy_report_and_figures(xling_workdir):
    energy = pd.read_csv(xling_workdir / "results/xling/energy.csv")
    assert list(dict.fromkeys(energy["unlearn"])) == ["en", "hi_R"]
    for _, group in energy.groupby("unlearn"):
        assert group["energy"].sum() == pytest.approx(1.0)
    for name in ("crosslingual_scatter", "crosslingual_energy", "xling_en_energy", "xling_hi_R_energy"):
        png = xling_workdir / "results/figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_renders_the_tracks_tables_and_figures(xling_workdir):
    names = ("crosslingual.md", "crosslingual_matrix.md", "crosslingual_scatter.png", "crosslingual_energy.png")
    build_report(xling_workdir, xling_config(xling_workdir), *names, "crosslingual_cost.md")


def test_cost_table_per_unlearning_language(xling_workdir):
    cost = pd.read_csv(xling_workdir / "results/tables/crosslingual_cost.csv").set_index("method")
    assert list(cost.index) == METHODS
    for lang in ("en", "hi_R"):
        parts = cost[[f"{lang}_{c}" for c in ("lora_s", "task_matrices_s", "erase_s")]]
        assert (parts > 0).all().all() and cost[f"{lang}_baseline_s"].isna().all()
        assert (cost[f"{lang}_total_s"] - parts.sum(axis=1)).abs().max() < 1e-9
        assert (cost[f"{lang}_unlearn_s"] == cost[f"{lang}_erase_s"]).all()

    # QR-Erase (LL) = QR-Erase's factors and forget update + the energy job + its own erase job
    def seconds(rule, name):
        return float(pd.read_csv(xling_workdir / f"results/benchmarks/{rule}/{name}.tsv", sep="\t")["s"].iloc[0])

    extra = (
        seconds("energy", "xling_en")
        + seconds("erase_merged", "xling_en_2_qr_erase_ll")
        - seconds("erase_merged", "xling_en_2_qr_erase")
    )
    assert cost.loc["qr_erase_ll", "en_erase_s"] - cost.loc["qr_erase", "en_erase_s"] == pytest.approx(extra)
    assert "Unlearn in hi_R" in (xling_workdir / "results/tables/crosslingual_cost.md").read_text()


def test_tradeoff_points_are_the_x_to_x_pairs_of_the_table(xling_workdir):
    scale = yaml.safe_load((REPO / "config.yaml").read_text())["unlearn"]["scale"]
    cfg = xling_config(
        xling_workdir,
        "xling_tradeoff.yaml",
        tradeoff__scales=[0, scale],
        tradeoff__ranks=[2],
        methods__crosslingual=["qr_erase_ll"],
    )
    snakemake(xling_workdir, "tradeoff", "--cores", "2", "--configfile", str(cfg))
    frame = pd.read_csv(xling_workdir / "results/tables/crosslingual_tradeoff.csv")
    assert sorted(frame["group"].unique()) == ["en", "hi_R"] and len(frame) == 4
    metrics = pd.read_csv(xling_workdir / "results/xling/metrics.csv")
    for _, row in frame.iterrows():  # lambda 0 is the base model in X; lambda_0 the table's X -> X erase
        x = row["group"]
        unlearn, method = ("base", "base") if row["scale"] == 0 else (x, "qr_erase_ll")
        hit = metrics[(metrics["unlearn"] == unlearn) & (metrics["method"] == method) & (metrics["eval"] == x)]
        assert row["model_utility"] == pytest.approx(hit["model_utility"].item(), rel=1e-6)
    assert frame["tune_retain_nll"].isna().all()  # no held-out slice in this track: no lambda rule
    assert pd.read_csv(xling_workdir / "results/tables/crosslingual_tradeoff_selection.csv").empty
    assert (xling_workdir / "results/figures/crosslingual_tradeoff.png").is_file()


def test_rerun_does_nothing(xling_workdir):
    proc = snakemake(xling_workdir, "-n", "--configfile", str(xling_workdir / "xling.yaml"))
    assert planned_rules(proc) == {}


def test_full_config_plans(tmp_path):
    proc = snakemake(tmp_path, "-n", "--configfile", str(xling_config(tmp_path, base="config/crosslingual_all.yaml")))
    jobs = planned_rules(proc)
    assert jobs["xling_romanise"] == 2 and jobs["xling_sets"] == 12
    assert jobs["xling_evaluate"] == 2 + 12 * len(ALL_METHODS)
    assert jobs["lora"] == 24 and jobs["erase_merged"] == 12 * len(ALL_METHODS)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"crosslingual__languages": ["en", "xx"]}, "config key 'crosslingual.languages[1]': unknown language 'xx'"),
        ({"crosslingual__languages": ["en", "ko_R"]}, "no transliterator for the hangul script of Korean"),
        (
            {"crosslingual__unlearn": ["fr"]},
            "config key 'crosslingual.unlearn[0]': 'fr' is not in crosslingual.languages",
        ),
        (
            {"crosslingual__table_method": "qr_erase"} | {"methods__crosslingual": ["unlearn"]},
            "config key 'crosslingual.table_method'",
        ),
        ({"methods__crosslingual": ["scrub"]}, "config key 'methods.crosslingual.0'"),
    ],
)
def test_bad_config_fails_at_dag_construction(tmp_path, overrides, message):
    assert_config_error(tmp_path, xling_config(tmp_path, **overrides), message)


def test_language_file_missing_a_field(tmp_path):
    root = tmp_path / "mtofu"
    shutil.copytree(REPO / "data" / "mtofu" / "hi", root / "hi")
    rows = [json.loads(line) for line in (root / "hi" / "forget01_perturbed.jsonl").open()]
    del rows[11]["paraphrased_answer"]
    (root / "hi" / "forget01_perturbed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = xling_config(tmp_path, crosslingual__data__root=str(root))
    assert_config_error(
        tmp_path,
        cfg,
        "config key 'crosslingual.data.root'",
        "forget01_perturbed.jsonl:12: field 'paraphrased_answer' missing",
    )


def test_robustness_relearns_in_one_language_and_scores_every_language(xling_workdir):
    """`snakemake robustness` (docs/robustness.md): per unlearning language, relearning on half A in that
    language, half B scored in it and (B:<lang>) in every other evaluated language, the same questions."""
    from qrerase.io import read_jsonl

    cfg = xling_config(  # one method and a small grid: what differs from the TOFU track's test is the languages
        xling_workdir,
        "xling_robustness.yaml",
        robustness__methods={"crosslingual": ["qr_erase_ll"]},
        robustness__lr_factors=[1.0],
        robustness__modes=["full"],
        robustness__formats=["q4_0"],
    )
    snakemake(xling_workdir, "robustness", "--cores", "2", "--configfile", str(cfg))
    test_cfg = yaml.safe_load((REPO / "tests/configs/test_crosslingual.yaml").read_text())["crosslingual"]
    frame = pd.read_csv(xling_workdir / "results/tables/crosslingual_robustness.csv")
    assert sorted(frame["exp"].unique()) == sorted(f"xling_{x}" for x in test_cfg["unlearn"])
    for lang in test_cfg["unlearn"]:
        exp = frame[(frame["exp"] == f"xling_{lang}") & (frame["attack"] == "relearn")]
        others = [x for x in test_cfg["languages"] if x != lang]
        assert set(exp["set"]) == {"B", *(f"B:{x}" for x in others)}
        assert (exp[exp["model"] == "base"]["recovery"] == 1).all() and (
            exp[exp["model"] == "retain"]["recovery"] == 0
        ).all()
        halves = xling_workdir / f"results/xling_{lang}/robustness/halves"
        forget = read_jsonl(xling_workdir / f"results/xling/languages/{lang}/eval_forget.jsonl")
        # each row keeps its fields and gains its author (the in-context attack's facts)
        b = read_jsonl(halves / "B.jsonl")
        assert all(r.pop("entity") in {str(i) for i in range(len(forget) // 20)} for r in b)
        positions = [forget.index(r) for r in b]  # B's rows of the unlearning language's forget file
        a = {r["question"] for r in read_jsonl(halves / "A.jsonl")}
        assert not a & {r["question"] for r in b} and len(a) + len(b) == len(forget)
        for x in others:  # the same positions of the other language's (aligned) forget file
            other = read_jsonl(xling_workdir / f"results/xling/languages/{x}/eval_forget.jsonl")
            rows = [{k: v for k, v in r.items() if k != "entity"} for r in read_jsonl(halves / f"B_{x}.jsonl")]
            assert rows == [other[i] for i in positions]
        # the three prompt attacks on B in the unlearning language (its forget file has paraphrased questions)
        prompt = frame[(frame["exp"] == f"xling_{lang}") & frame["attack"].isin(["paraphrase", "prefix", "in_context"])]
        assert set(prompt["attack"]) == {"paraphrase", "prefix", "in_context"} and set(prompt["set"]) == {"B"}
