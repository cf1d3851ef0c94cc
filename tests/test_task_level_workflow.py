"""End-to-end: the task-level track on config/test_task.yaml through the real snakemake CLI; the
Llama-3-70B config's plan; bad task configs as one-line errors before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_workflow import assert_config_error, planned_rules, snakemake, write_yaml_config

pytestmark = pytest.mark.workflow

REPO = Path(__file__).resolve().parents[1]
ROWS = ["base", "ga", "kga", "ku", "unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"]


def write_task_config(workdir: Path, name: str = "test_task.yaml", **overrides) -> Path:
    cfg = yaml.safe_load((REPO / "config" / "test_task.yaml").read_text())
    cfg["task_level"]["data"]["knowledge"]["root"] = str(REPO / "data" / "tofu")
    cfg.setdefault("tofu", {})["data"] = {"source": "local", "root": str(REPO / "data" / "tofu"), "split": "forget10"}
    return write_yaml_config(workdir, name, cfg, overrides)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("task_level")
    snakemake(wd, "--cores", "2", "--configfile", str(write_task_config(wd)))
    return wd


def test_task_table_layout_and_numbers(workdir):
    table = pd.read_csv(workdir / "results/tables/task_level.csv")
    assert list(table["method"]) == ROWS
    cols = ["unrelated_accuracy", "similar_accuracy", "forget_accuracy"]
    assert [c for c in table.columns if c in cols] == cols
    assert table[cols].apply(lambda c: c.between(0, 1)).all().all()
    assert list(table["reference"]) == [1] + [0] * (len(ROWS) - 1)
    for col in cols:  # best and second marked among the methods
        assert "best" in set(table[f"{col}_mark"].fillna(""))
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
    assert r"\label{tab:task_results}" in tex and r"$\downarrow$" in tex
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
    cost = pd.read_csv(workdir / "results/tables/task_cost.csv").set_index("method")
    assert list(cost.index) == ROWS[1:]
    assert (cost.loc[["ga", "kga", "ku"], "baseline_s"] > 0).all()
    assert (cost.loc[["qr_erase", "qr_erase_ll"], "lora_s"] > 0).all()
    assert (workdir / "results/figures/task_energy.png").stat().st_size > 0
    assert json.loads((workdir / "results/task_level/energy/selected_layers.json").read_text())["modules"]


def test_llama3_70b_config_plans(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "llama3-70b-task.yaml").read_text())
    cfg["task_level"]["data"]["knowledge"]["root"] = str(REPO / "data" / "tofu")
    cfg["tofu"] = {"data": {"source": "local", "root": str(REPO / "data" / "tofu"), "split": "forget10"}}
    proc = snakemake(tmp_path, "-n", "--configfile", str(write_yaml_config(tmp_path, "70b.yaml", cfg, {})))
    jobs = planned_rules(proc)
    assert jobs["task_level_baseline"] == 3 and jobs["task_level_evaluate"] == 8 and jobs["erase_adapter"] == 4
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
    ],
)
def test_bad_task_config_is_an_error_before_anything_runs(tmp_path, overrides, message):
    assert_config_error(tmp_path, write_task_config(tmp_path, **overrides), message)
