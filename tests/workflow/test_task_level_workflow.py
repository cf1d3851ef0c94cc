"""End-to-end: the task-level track on tests/configs/test_task.yaml through the real snakemake CLI (pretraining
stage, table, λ / k sweep and λ rule); the plans of both LoRA bases and of init scratch; the
Llama-3-70B config's plan; bad task configs as one-line errors before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import REPO
from support.snakemake_cli import assert_config_error, build_report, planned_rules, snakemake, write_yaml_config

pytestmark = pytest.mark.workflow

ROWS = ["base", "ga", "kga", "ku", "unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"]


def write_task_config(workdir: Path, name: str = "test_task.yaml", **overrides) -> Path:
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "test_task.yaml").read_text())
    cfg["task_level"]["data"]["knowledge"]["root"] = str(REPO / "data" / "tofu")
    cfg.setdefault("tofu", {})["data"] = {"source": "local", "root": str(REPO / "data" / "tofu"), "split": "forget10"}
    return write_yaml_config(workdir, name, cfg, overrides)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("task_level")
    snakemake(wd, "--cores", "2", "--configfile", str(write_task_config(wd)), "--", "all", "task_level_tradeoff")
    return wd


def test_task_table_layout_and_numbers(workdir):
    table = pd.read_csv(workdir / "results/tables/task_level.csv")
    assert list(table["method"]) == ROWS
    cols = ["unrelated_accuracy", "similar_accuracy", "forget_accuracy"]
    assert [c for c in table.columns if c in cols] == cols
    assert table[cols].apply(lambda c: c.between(0, 1)).all().all()
    assert list(table["reference"]) == [1] + [0] * (len(ROWS) - 1)
    for col in cols:  # best marked among the methods (none where every method prints the same value)
        printed = {f"{v:.3f}" for v in table.loc[table["reference"] == 0, col]}
        assert ("best" in set(table[f"{col}_mark"].fillna(""))) == (len(printed) > 1), (col, printed)
    md = (workdir / "results/tables/task_level.md").read_text()
    for text in (
        "Unrelated (knowledge) ↑",
        "Similar (word_math) ↑",
        "Forgotten (arithmetic) ↓",
        "KGA",
        "KU",
        "QR-Erase (LL)",
    ):
        assert text in md
    tex = (workdir / "results/tables/task_level.tex").read_text()
    assert r"\label{tab:task_level_results}" in tex and r"$\downarrow$" in tex
    # the table holds the evaluations' numbers
    ev = pd.read_csv(workdir / "results/task_level/task_level_eval/qr_erase_ll_k2.csv").set_index("role")
    assert table.set_index("method").loc["qr_erase_ll", "forget_accuracy"] == pytest.approx(
        ev.loc["forget", "accuracy"]
    )
    assert ev.loc["forget", "n"] == 16 and ev.loc["similar", "n"] == 16 and ev.loc["unrelated", "n"] == 12
    wide = pd.read_csv(workdir / "results/tables/task_level_wide.csv").set_index("method")
    assert wide.loc["base", "forget_nll"] == pytest.approx(
        pd.read_csv(workdir / "results/task_level/task_level_eval/base.csv").set_index("role").loc["forget", "nll"]
    )
    metrics = pd.read_csv(workdir / "results/task_level/metrics.csv")
    assert len(metrics) == 3 * len(ROWS)


def test_data_splits_and_baseline_curves(workdir):
    data = workdir / "results/task_level/data"
    read = lambda name: [json.loads(line) for line in (data / f"{name}.jsonl").open()]  # noqa: E731
    full = read("finetune_full")
    train = {r["question"] for r in full if r["skill"] != "knowledge_fact"}
    for name in ("eval_forget", "eval_retain", "eval_real_authors", "eval_world_facts", "new"):
        assert not train & {r["question"] for r in read(name)}
    # cloze knowledge items ask a plain fact; every fact (all splits) is trained as question -> answer
    held_out_facts = {r["question"] for n in ("eval_real_authors", "eval_world_facts") for r in read(n)}
    assert held_out_facts and held_out_facts <= {r["question"] for r in full if r["skill"] == "knowledge_fact"}
    assert len(read("forget")) == 60 and {r["skill"] for r in read("forget")} == {"arithmetic"}
    for method in ("ga", "kga", "ku"):
        curve = pd.read_csv(workdir / f"results/task_level/baselines/{method}_loss.csv")
        assert len(curve) >= 1 or method == "ku"
        assert (workdir / f"results/task_level/baselines/{method}/model/model.safetensors").is_file()
    kga = pd.read_csv(workdir / "results/task_level/baselines/kga_loss.csv")
    assert {"gap_new", "gap_forget", "retain_kl"} <= set(kga.columns) and (kga["gap_new"] > 0).all()
    assert "KU memorisation criterion" in (workdir / "results/logs/task_level_baseline/task_level_ku.log").read_text()


def test_cost_and_energy_outputs(workdir):
    cost = pd.read_csv(workdir / "results/tables/task_level_cost.csv").set_index("method")
    assert list(cost.index) == ROWS[1:]
    assert (cost.loc[["ga", "kga", "ku"], "baseline_s"] > 0).all()
    assert (cost.loc[["qr_erase", "qr_erase_ll"], "lora_s"] > 0).all()
    assert (workdir / "results/figures/task_level_energy.png").stat().st_size > 0
    assert json.loads((workdir / "results/task_level/energy/selected_layers.json").read_text())["modules"]


def test_report_renders_the_tracks_tables_and_figures(workdir):
    build_report(workdir, write_task_config(workdir), "task_level.md", "task_level_energy.png", "task_level_cost.md")


def test_pretraining_stage(workdir):
    """The pretrained checkpoint learns the retained skills and the facts, never the forget skill;
    the fine-tuned model (and KGA's auxiliary models) start from it."""
    data = workdir / "results/task_level/data"
    pretrain = [json.loads(line) for line in (data / "pretrain.jsonl").open()]
    assert pretrain and {r["skill"] for r in pretrain} == {"word_math", "knowledge", "knowledge_fact"}
    assert (workdir / "results/task_level/models/pretrained/model.safetensors").is_file()
    curve = pd.read_csv(workdir / "results/task_level/models/pretrained_loss.csv")
    assert len(curve) > 1 and curve["loss"].iloc[-1] < curve["loss"].iloc[0]
    log = (workdir / "results/logs/pretrain/task_level.log").read_text()
    assert f"training pretrained on {len(pretrain)} QA pairs" in log


def test_sweep_and_lambda_rule(workdir):
    points = pd.read_csv(workdir / "results/tables/task_level_tradeoff.csv")
    subspace = ["unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"]
    assert len(points) == len(subspace) * 2 * 3  # methods x ranks [1, 2] x scales [0, 1, 4]
    assert set(points["method"]) == set(subspace) and set(points["rank"]) == {1, 2}
    rule = pd.read_csv(workdir / "results/tables/task_level_scale_rule.csv")
    assert len(rule) == len(subspace) * 2 and set(rule["selected_scale"]) <= {0.0, 1.0, 4.0}
    for r in rule.itertuples(index=False):  # the rule: largest λ whose held-out NLL rise <= 0.1 nats
        grp = points[(points["method"] == r.method) & (points["rank"] == r.rank)].set_index("scale")
        ok = grp.index[grp["tune_retain_nll"] - grp.loc[0.0, "tune_retain_nll"] <= 0.1]
        assert r.selected_scale == max(ok) and grp.loc[r.selected_scale, "selected"]
    # λ = 0 is the unedited fine-tuned model; (k=2, λ=1) is the table's erase (same numbers)
    base = pd.read_csv(workdir / "results/task_level/task_level_eval/base.csv").set_index("role")
    table = pd.read_csv(workdir / "results/tables/task_level_wide.csv").set_index("method")
    for method in subspace:
        at = points[(points["method"] == method) & (points["rank"] == 2)].set_index("scale")
        for role in ("forget", "similar", "unrelated"):
            assert at.loc[0.0, f"{role}_accuracy"] == pytest.approx(base.loc[role, "accuracy"])
            assert at.loc[0.0, f"{role}_nll"] == pytest.approx(base.loc[role, "nll"], rel=1e-5)
            assert at.loc[1.0, f"{role}_nll"] == pytest.approx(table.loc[method, f"{role}_nll"], rel=1e-4)
    picked = pd.read_csv(workdir / "results/tables/task_level_picked.csv").set_index("method")
    assert list(picked.index) == ROWS
    for r in rule[rule["rank"] == 2].itertuples(index=False):
        point = points[(points["method"] == r.method) & (points["rank"] == 2) & (points["scale"] == r.selected_scale)]
        assert picked.loc[r.method, "forget_accuracy"] == pytest.approx(point["forget_accuracy"].iloc[0])
    assert picked.loc["ga", "forget_accuracy"] == pytest.approx(table.loc["ga", "forget_accuracy"])


@pytest.mark.parametrize(
    "overrides, lora_from, pretrains",
    [
        ({}, "results/task_level/models/full", True),
        ({"task_level__lora__base": "pretrained"}, "results/task_level/models/pretrained", True),
        ({"task_level__init": "scratch"}, "results/task_level/models/full", False),
    ],
)
def test_plans_of_both_lora_bases_and_init(tmp_path, overrides, lora_from, pretrains):
    cfg = write_task_config(tmp_path, **overrides)
    proc = snakemake(tmp_path, "-n", "--configfile", str(cfg), "--", "all", "task_level_tradeoff")
    jobs = planned_rules(proc)
    assert jobs.get("pretrain", 0) == int(pretrains) and jobs["task_level_tradeoff_erase"] == 4
    assert jobs["task_level_tradeoff"] == 1 and jobs["lora"] == 2
    text = (proc.stdout + proc.stderr).splitlines()
    lora_inputs = [line for line in text if "results/task_level/data/forget.jsonl" in line]
    assert any(line.strip().startswith(f"input: {lora_from},") for line in lora_inputs)
    finetune = [line for line in text if "results/task_level/data/finetune_full.jsonl" in line]
    init = "results/task_level/models/pretrained" if pretrains else "results/task_level/models/tokenizer"
    assert any(line.strip().startswith(f"input: {init},") for line in finetune)
    assert not (tmp_path / "results").exists()


def test_llama3_70b_config_plans(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "llama3-70b-task.yaml").read_text())
    cfg["task_level"]["data"]["knowledge"]["root"] = str(REPO / "data" / "tofu")
    cfg["tofu"] = {"data": {"source": "local", "root": str(REPO / "data" / "tofu"), "split": "forget10"}}
    proc = snakemake(tmp_path, "-n", "--configfile", str(write_yaml_config(tmp_path, "70b.yaml", cfg, {})))
    jobs = planned_rules(proc)
    # GA / KGA / KU (full 70B weights, no LoRA mode) fit no 8 x 80 GB node: not in the preset's methods
    assert "task_level_baseline" not in jobs and jobs["task_level_evaluate"] == 5 and jobs["erase_adapter"] == 4
    assert "tokenizer" not in jobs and "erase_merged" not in jobs
    assert not (tmp_path / "results").exists()
    assert jobs["finetune"] == 1 and jobs["lora"] == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"task_level__data__forget": "algebra"}, "config key 'task_level.data.forget': unknown skill 'algebra'"),
        (
            {"task_level__data__sizes__word_math": {"train": 5, "eval": 0, "new": 2}},
            "task_level.data.sizes.word_math.eval",
        ),
        ({"task_level__data__arithmetic": {"ops": ["+"], "min_operand": 0, "max_operand": 5}}, "can produce only 36"),
        (
            {"task_level__init": "scratch", "task_level__lora__base": "pretrained"},
            "config key 'task_level.lora.base': pretrained needs a pretrained checkpoint",
        ),
        ({"task_level__tradeoff__scales": [1, 2]}, "config key 'task_level.tradeoff.scales': needs 0"),
        ({"task_level__tradeoff__ranks": [1, 8]}, "config key 'task_level.tradeoff.ranks': [8] exceed the LoRA rank"),
        ({"task_level__tradeoff__ranks": [1]}, "config key 'task_level.tradeoff.ranks': needs task_level.rank=2"),
    ],
)
def test_bad_task_config_is_an_error_before_anything_runs(tmp_path, overrides, message):
    assert_config_error(tmp_path, write_task_config(tmp_path, **overrides), message)


def test_robustness_scales_by_the_fine_tuned_model_and_the_initial_checkpoint(workdir):
    """`snakemake robustness` (docs/robustness.md): the forgotten skill is one entity split into halves; the
    floor is the checkpoint fine-tuning started from (it never learned the skill), the ceiling the fine-tuned model."""
    from qrerase.io import read_jsonl

    snakemake(workdir, "robustness", "--cores", "2", "--configfile", str(write_task_config(workdir)))
    frame = pd.read_csv(workdir / "results/tables/task_level_robustness.csv")
    assert list(dict.fromkeys(frame["model"])) == ["base", "init", "ga", "qr_erase_k2"]
    train = frame[frame["attack"].isin(["relearn", "benign"])]
    assert sorted(train["budget"].unique()) == [0, 2] and set(train["mode"]) == {"full"}
    # the prompt attacks the track's data allow: no paraphrased questions here, so no paraphrase attack
    assert set(frame.loc[frame["budget"] > 0, "attack"]) - {"relearn", "benign"} == {"prefix", "in_context"}
    assert (train[train["model"] == "base"]["recovery"] == 1).all() and (
        train[train["model"] == "init"]["recovery"] == 0
    ).all()
    halves = workdir / "results/task_level/robustness/halves"
    a, b = ({r["question"] for r in read_jsonl(halves / f"{h}.jsonl")} for h in "AB")
    forget = {r["question"] for r in read_jsonl(workdir / "results/task_level/data/forget.jsonl")}
    assert a and b and not a & b and a | b == forget
    sub = pd.read_csv(workdir / "results/tables/task_level_robustness_subspace.csv")
    assert set(sub[sub["subspace"] == "erased"]["model"]) == {"qr_erase_k2"}
