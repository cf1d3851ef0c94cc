"""`qrerase smoke`: each training job kind of a config, a few steps on a random model of its shape, with
the plan's engine settings; the CSV holds the measured peak next to the plan's estimate."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from qrerase.cli import main
from qrerase.smoke import COLUMNS, model_config, smoke_jobs, write_random_checkpoint
from qrerase.workflow.plan_config import load_config
from qrerase.workflow.shapes import ModelShape
from qrerase.workflow.stages import job_settings

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "tests/configs/test.yaml"


def test_jobs_are_the_planned_training_jobs_with_their_plan_rows(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(TEST_CONFIG)
    jobs = smoke_jobs(cfg)
    baselines = [
        m for m in cfg["methods"]["tofu"] if m in cfg["tofu"]["baselines"] and m not in ("unlearn", "qr_erase")
    ]
    assert [j.stage for j in jobs][:2] == ["finetune", "lora"]
    assert {j.stage for j in jobs[2:]} <= set(baselines) and jobs[2:]
    for j in jobs:
        assert j.settings == job_settings(cfg, j.track, j.stage)  # what the workflow's job runs with
        assert (j.plan.processes, j.plan.backend) == (j.spec.processes, j.spec.backend)
    assert [j.stage for j in smoke_jobs(cfg, only=("lora",))] == ["lora"]
    with pytest.raises(ValueError, match=r"smoke --only: \['nope'\] is no planned training job"):
        smoke_jobs(cfg, only=("nope",))


def test_random_checkpoint_has_the_shape_and_loads_with_stock_transformers(tmp_path):
    shape = ModelShape("toy", layers=2, hidden=32, intermediate=64, vocab=50, heads=4, kv_heads=2)
    out = write_random_checkpoint(shape, "bfloat16", tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    assert sum(p.numel() for p in model.parameters()) == shape.count_params()
    assert model.config.num_key_value_heads == 2 and model.config.vocab_size == 50
    w = model.model.layers[0].self_attn.q_proj.weight.float()
    assert abs(w.std().item() - 0.02) < 0.004 and model.model.norm.weight.float().eq(1).all()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("t5 t49").input_ids == [5, 49] and tok.eos_token_id == 1
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors")
    with pytest.raises(ValueError, match="has no gated MLP"):
        model_config(ModelShape("gpt", 2, 32, 64, 50, 4, 4, gated_mlp=False))


@pytest.mark.slow
def test_smoke_runs_a_two_process_fsdp_job_and_writes_plan_and_measured(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    over = tmp_path / "two.yaml"
    over.write_text("resources:\n  train:\n    processes: 2\nfinetune:\n  backend: fsdp\n")
    out = tmp_path / "smoke.csv"
    args = ["smoke", "--configfile", str(TEST_CONFIG), str(over), "--steps", "1", "--only", "npo"]
    assert main([*args, "--out", str(out), "--work", str(tmp_path / "work")]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == list(COLUMNS) and len(table) == 1
    row = table.iloc[0]
    assert (row.job, row.backend, row.processes, row.steps, row.device) == ("tofu:npo", "fsdp", 2, 1, "cpu")
    # both ranks reported; the peak is a real measurement (bytes the model and training added)
    assert sorted(p.name for p in (tmp_path / "work").glob("npo.rank*.json")) == ["npo.rank0.json", "npo.rank1.json"]
    assert row.plan_gib > 0 and row.measured_gib > 0
    assert row.measured_over_plan == pytest.approx(row.measured_gib / row.plan_gib, rel=0.01)
