"""`qrerase smoke`: each training job kind of a config, a few steps on a random model of its shape, with
the plan's engine settings; the CSV holds the measured peak next to the plan's estimate."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from support import REPO as ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

from qrerase.cli import main
from qrerase.smoke import COLUMNS, TensorPeak, model_config, running_peak, smoke_jobs, write_random_checkpoint
from qrerase.workflow.plan_config import load_config
from qrerase.workflow.shapes import ModelShape
from qrerase.workflow.stages import job_settings

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


@pytest.mark.parametrize(
    ("overlay", "stages"),
    [("one-h100-8b.yaml", ("lora", "npo", "kl")), ("one-h100-1b.yaml", ("finetune", "lora", "npo", "kl"))],
)
def test_the_one_gpu_overlays_plan_jobs_that_fit_one_gpu(overlay, stages):
    """config/smoke/*.yaml: the overlays of docs/cluster.md's GPU measurement; every job they are run
    with is one process on one GPU and fits it, and the 8B full fine-tune does not (so it is not run)."""
    cfg = load_config(ROOT / "config/llama3-8b.yaml", ROOT / "config/smoke" / overlay, jobs=False)  # as qrerase smoke
    jobs = smoke_jobs(cfg, stages)
    assert sorted(j.stage for j in jobs) == sorted(stages)
    for j in jobs:
        assert (j.plan.processes, j.plan.gpus, j.plan.fits) == (1, 1, True), j
    if overlay == "one-h100-8b.yaml":
        assert not smoke_jobs(cfg, ("finetune",))[0].plan.fits


def test_a_tied_shape_is_saved_tied_and_a_stamped_checkpoint_is_reused(tmp_path):
    """The defect: `to_empty` gave the LM head of a tied shape (Llama-3.2-1B) storage of its own, which
    was saved uninitialised; transformers then refused to tie it, so the model had V x h parameters
    more than the shape (measured on an H100: 26.6 GiB against 23.5 planned for the tied shape)."""
    shape = ModelShape("toy", layers=2, hidden=32, intermediate=64, vocab=50, heads=4, kv_heads=2, tied_embeddings=True)
    out = write_random_checkpoint(shape, "bfloat16", tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) == shape.count_params()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert abs(model.lm_head.weight.float().std().item() - 0.02) < 0.004
    weights = out / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert write_random_checkpoint(shape, "bfloat16", out) == out and weights.stat().st_mtime_ns == before
    write_random_checkpoint(shape, "bfloat16", out, seed=1)  # another stamp: written again
    assert weights.stat().st_mtime_ns != before
    assert not torch.equal(AutoModelForCausalLM.from_pretrained(out).lm_head.weight, model.lm_head.weight)


@pytest.mark.slow
def test_smoke_runs_two_process_fsdp_jobs_and_each_peak_is_within_a_quarter_of_the_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    over = tmp_path / "two.yaml"
    over.write_text("resources:\n  train:\n    processes: 2\nfinetune:\n  backend: fsdp\n")
    out = tmp_path / "smoke.csv"
    args = ["smoke", "--configfile", str(TEST_CONFIG), str(over), "--steps", "2", "--only", "finetune", "lora", "npo"]
    assert main([*args, "--out", str(out), "--work", str(tmp_path / "work")]) == 0
    table = pd.read_csv(out)
    assert list(table.columns) == list(COLUMNS) and len(table) == 3
    assert list(table.job) == ["tofu:finetune", "tofu:lora", "tofu:npo"]  # NPO: a reference-model baseline
    for row in table.itertuples():
        assert (row.backend, row.processes, row.steps, row.device) == ("fsdp", 2, 2, "cpu")
        # both ranks reported; the peak is a real measurement (the bytes of live tensors)
        assert sorted(p.name for p in (tmp_path / "work").glob(f"{row.job[5:]}.rank*.json")) == [
            f"{row.job[5:]}.rank0.json",
            f"{row.job[5:]}.rank1.json",
        ]
        assert row.plan_gib > 0 and row.measured_gib > 0
        assert row.measured_over_plan == pytest.approx(row.measured_gib / row.plan_gib, rel=0.01)
        # the criterion: each job's per-rank tensor peak within 25 % of the plan's estimate
        assert 0.75 <= row.measured_over_plan <= 1.25, row
        # the resident set also holds the allocator's cache, the libraries and gloo: it reads higher
        assert row.rss_gib > row.measured_gib


def test_running_peak_is_the_largest_prefix_sum_in_time_order():
    events = [(3, -40), (1, 100), (2, 50), (4, 30), (5, -200)]  # (time, bytes), given out of order
    assert running_peak(events) == 150  # 100, 150, 110, 140, -60
    assert running_peak([]) == 0 and running_peak([(0, -5)]) == 0


def test_tensor_peak_counts_the_tensors_alive_together_inside_the_block():
    with TensorPeak() as tp:
        a = torch.empty(1 << 20, dtype=torch.float32)  # 4 MiB
        b = torch.empty(1 << 19, dtype=torch.float32)  # 2 MiB, alive with a: 6 MiB
        del a, b
        c = torch.empty(1 << 20, dtype=torch.float64)  # 8 MiB alone
        del c
    assert 8 * 2**20 <= tp.peak < 8 * 2**20 + 2**16
    with TensorPeak() as tp:
        a = torch.empty(1 << 20, dtype=torch.float32)
        b = torch.empty(1 << 19, dtype=torch.float32)
        del a, b
    assert 6 * 2**20 <= tp.peak < 6 * 2**20 + 2**16
