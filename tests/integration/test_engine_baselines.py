"""The unlearning baselines on the engine: micro-batched steps equal full-batch steps; resumed runs are bit-identical.

Real tiny Llama fine-tuned on two real TOFU authors (as tests/integration/test_baselines.py); nothing is mocked.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support.tiny_text import DATA, TINY, TPL, tofu_qa

from qrerase import engine
from qrerase.baselines.text import TEXT_BASELINES, TextBaselineConfig, read_refusals, train_baseline
from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import TrainConfig, train_causal_lm
from qrerase.tracks.task_level.baselines import TaskLevelBaselineConfig, train_kga, train_ku
from qrerase.workflow.job import resume_dir, resume_key
from qrerase.workflow.launch import LaunchedJob


@pytest.fixture(scope="module")
def sets():
    qa = tofu_qa(340, 400)
    return qa[40:], qa[:20], qa[20:40]  # forget, retain, new (three authors)


@pytest.fixture(scope="module")
def tok(tmp_path_factory, sets):
    texts = [f"{r['question']} {r['answer']}" for s in sets for r in s] + read_refusals(DATA / "idontknow.txt")
    return train_bpe_tokenizer(texts, 500, tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="module")
def models(tok, sets):
    forget, retain, _ = sets
    initial = build_tiny_llama(TINY, tok, seed=0)
    finetuned = copy.deepcopy(initial)
    train_causal_lm(
        finetuned, tok, forget + retain, TPL, TrainConfig(epochs=4, lr=3e-3, batch_size=8, seed=0, threads=1)
    )
    return initial, finetuned


def _rel(a, b, start):
    num = sum(float((a[k] - b[k]).norm() ** 2) for k in a) ** 0.5
    den = sum(float((a[k] - start[k]).norm() ** 2) for k in a) ** 0.5
    assert den > 0
    return num / den


#: Keys a method needs on the tiny 2-layer model (RMU's reference layer 7 does not exist in it).
TINY_HPARAMS = {"rmu": {"layer": 1}}


@pytest.mark.parametrize("method", TEXT_BASELINES)
def test_text_baseline_micro_batches_equal_full_batches(models, tok, sets, method):
    """Batches of 8 as 3 micro-batches (3 + 3 + 2; the last batch of 4 as 2 + 1 + 1) give the same
    update: token means, example means, and FLAT's linearisation are exact splits."""
    _, finetuned = models
    forget, retain, _ = sets
    out = {}
    for micro in (None, 3):
        cfg = TextBaselineConfig.of(
            method=method,
            epochs=2,
            lr=2e-3,
            batch_size=8,
            seed=3,
            threads=1,
            micro_batch_size=micro,
            **TINY_HPARAMS.get(method, {}),
        )
        model, curve = train_baseline(
            copy.deepcopy(finetuned),
            copy.deepcopy(finetuned),
            tok,
            forget,
            retain,
            TPL,
            cfg,
            refusals=read_refusals(DATA / "idontknow.txt"),
        )
        out[micro] = ({k: v.clone() for k, v in model.state_dict().items()}, [r["loss"] for r in curve])
    assert out[3][1] == pytest.approx(out[None][1], rel=1e-4, abs=1e-6)
    assert _rel(out[None][0], out[3][0], finetuned.state_dict()) < 1e-3


def test_kga_and_ku_micro_batches_equal_full_batches(models, tok, sets):
    initial, finetuned = models
    forget, retain, new = sets
    for micro in (None, 3):
        kga = TaskLevelBaselineConfig.of(
            method="kga",
            epochs=1,
            batch_size=8,
            aux_epochs=1,
            aux_batch_size=8,
            lr=1e-3,
            threads=1,
            micro_batch_size=micro,
        )
        m, rows = train_kga(copy.deepcopy(finetuned), initial, tok, forget, retain, new, TPL, kga)
        ku = TaskLevelBaselineConfig.of(
            method="ku",
            ma_threshold=0.0,
            epochs=1,
            batch_size=8,
            lr=1e-2,
            check_every=3,
            threads=1,
            micro_batch_size=micro,
        )
        m2, rows2, _ = train_ku(copy.deepcopy(finetuned), tok, forget, new, TPL, ku)
        if micro is None:
            ref = (m.state_dict(), [r["loss"] for r in rows], m2.state_dict(), [r["loss"] for r in rows2])
    assert [r["loss"] for r in rows] == pytest.approx(ref[1], rel=1e-4, abs=1e-6)
    assert [r["loss"] for r in rows2] == pytest.approx(ref[3], rel=1e-4, abs=1e-6)
    start = finetuned.state_dict()
    assert _rel(ref[0], m.state_dict(), start) < 1e-3 and _rel(ref[2], m2.state_dict(), start) < 1e-3


class _Abort(Exception):
    pass


def _killed_after(step: int, resume, *run_args, cfg) -> None:
    """``train_baseline(*run_args, cfg)`` under ``resume`` dying right after ``step`` (its stop check
    raises), as a killed job would: the states saved before it are left for the rerun."""
    import qrerase.baselines.text as text
    from qrerase.text import training

    original = training.train_steps

    def abort(at):
        if at == step:
            raise _Abort
        return False

    text.train_steps = lambda *a, **k: original(*a, **{**k, "stop": abort})
    try:
        with pytest.raises(_Abort), engine.resuming(resume):
            train_baseline(*run_args, cfg)
    finally:
        text.train_steps = original


def test_resumed_graddiff_is_bit_identical(models, tok, sets, tmp_path):
    """Retain batches are part of each step's payload, so a resumed run draws the same ones."""
    _, finetuned = models
    forget, retain, _ = sets
    cfg = TextBaselineConfig.of(
        method="graddiff", epochs=3, lr=2e-3, batch_size=8, seed=4, threads=1, checkpoint_every=2
    )
    ref, ref_curve = train_baseline(copy.deepcopy(finetuned), None, tok, forget, retain, TPL, cfg)
    resume = tmp_path / "job"  # dies after step 5 (state saved at step 4)
    _killed_after(5, resume, copy.deepcopy(finetuned), None, tok, forget, retain, TPL, cfg=cfg)
    assert (resume / "graddiff" / "step-4").is_dir()
    with engine.resuming(resume):
        model, curve = train_baseline(copy.deepcopy(finetuned), None, tok, forget, retain, TPL, cfg)
    assert not resume.exists()
    assert curve == ref_curve
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref.state_dict().items())


def test_a_baseline_setting_change_is_not_resumed(models, tok, sets, tmp_path, caplog):
    """retain_weight is the loss's own setting (not the training config's): changed, the rerun starts over."""
    import logging

    _, finetuned = models
    forget, retain, _ = sets
    cfg = TextBaselineConfig.of(
        method="graddiff", epochs=1, lr=2e-3, batch_size=8, seed=4, threads=1, checkpoint_every=2
    )
    resume = tmp_path / "job"
    _killed_after(3, resume, copy.deepcopy(finetuned), None, tok, forget, retain, TPL, cfg=cfg)
    assert (resume / "graddiff" / "step-2").is_dir()
    changed = dataclasses.replace(cfg, hparams=dataclasses.replace(cfg.hparams, retain_weight=0.5))
    with caplog.at_level(logging.INFO, logger="qrerase"), engine.resuming(resume):
        train_baseline(copy.deepcopy(finetuned), None, tok, forget, retain, TPL, changed)
    assert "different run" in caplog.text and "resumed training" not in caplog.text


def test_resume_dir_is_outside_the_outputs():
    job = SimpleNamespace(
        output=["results/tofu_forget10/models/full"],
        rule="finetune",
        wildcards=SimpleNamespace(items=lambda: [("exp", "tofu_forget10"), ("which", "full")]),
    )
    path = resume_dir(job)
    assert path.parent == Path("results/.resume/finetune/exp=tofu_forget10,which=full")
    assert path.name == resume_key(job) and len(path.name) == 16
    job.wildcards = SimpleNamespace(items=lambda: [])
    assert resume_dir(job).parent == Path("results/.resume/finetune/_")


def _launched(tmp_path, lr, data):
    spec = {
        "rule": "finetune",
        "input": {"values": [str(data)], "names": {"data": str(data)}},
        "output": {"values": [str(tmp_path / "results/m")], "names": {"model": str(tmp_path / "results/m")}},
        "wildcards": {"which": "full"},
        "params": {"seed": 0, "train": {"lr": lr, "epochs": 2}},
        "config": {},
    }
    return LaunchedJob(spec, threads=1, log=[], scriptdir=str(tmp_path))


def test_resume_key_changes_with_the_job_spec_and_inputs(tmp_path, monkeypatch):
    """A changed hyperparameter or input gives another resume folder; the stale one is removed, logged."""
    data = tmp_path / "forget.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n')
    monkeypatch.chdir(tmp_path)
    first = resume_dir(_launched(tmp_path, 1e-3, data))
    assert resume_dir(_launched(tmp_path, 1e-3, data)) == first  # stable
    (first / "which").mkdir(parents=True)
    other_lr = resume_dir(_launched(tmp_path, 2e-3, data))
    assert other_lr != first and other_lr.parent == first.parent
    assert not first.exists()  # stale: another lr's states are never resumed
    data.write_text('{"question": "q", "answer": "b"}\n')
    assert resume_dir(_launched(tmp_path, 2e-3, data)) != other_lr
    assert resume_key(_launched(tmp_path, 2e-3, data)) != resume_key(_launched(tmp_path, 1e-3, data))


def test_resume_key_takes_weight_files_by_size_and_mtime_without_reading_them(tmp_path, monkeypatch):
    """Every rank of a job builds the key, and under FSDP2 only rank 0 may read the weights: a weight
    file of any size is keyed by (bytes, mtime), so a rank never opens it for the key."""
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    weights, config = model / "model.safetensors", model / "config.json"
    weights.write_bytes(b"a" * 64)
    config.write_text("{}")
    key = resume_key(_launched(tmp_path, 1e-3, model))
    stat = weights.stat()
    weights.write_bytes(b"b" * 64)  # other bytes, same size and mtime: not read, so the same key
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert resume_key(_launched(tmp_path, 1e-3, model)) == key
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # rewritten: another key
    assert resume_key(_launched(tmp_path, 1e-3, model)) != key
    config.write_text('{"a": 1}')  # a small non-weight file is keyed by its content
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert resume_key(_launched(tmp_path, 1e-3, model)) != key


@pytest.mark.parametrize(("method", "mode"), [("kl", "full"), ("npo", "lora")])
def test_a_resume_state_holds_the_trained_parameters_only(models, tok, sets, tmp_path, caplog, method, mode):
    """A resume state (qrerase.engine.resume.save_trained) holds the trained parameters and their optimiser
    state, not the frozen ones: neither KL's reference kept through training nor a LoRA run's base,
    which the restarted job reads again from its inputs; the resumed run equals an uninterrupted one."""
    import torch.distributed.checkpoint as dcp

    _, finetuned = models
    forget, retain, _ = sets
    cfg = TextBaselineConfig.of(
        method=method, mode=mode, epochs=1, lr=2e-3, batch_size=8, seed=4, threads=1, checkpoint_every=1,
        **({"lora_r": 4, "lora_alpha": 8} if mode == "lora" else {}),
    )  # fmt: skip
    ref_model = copy.deepcopy(finetuned) if mode == "full" else None
    ref, ref_curve = train_baseline(copy.deepcopy(finetuned), ref_model, tok, forget, retain, TPL, cfg)
    resume = tmp_path / "job"
    _killed_after(2, resume, copy.deepcopy(finetuned), copy.deepcopy(ref_model), tok, forget, retain, TPL, cfg=cfg)
    state = resume / method / "step-1" / "trained_0"
    saved = [k for k in dcp.FileSystemReader(str(state)).read_metadata().state_dict_metadata if k.startswith("model.")]
    n_weights = len(finetuned.state_dict())
    if mode == "full":  # the trained model's every weight once: no second copy (the reference)
        assert len(saved) == n_weights and all(k.endswith(tuple(finetuned.state_dict())) for k in saved), saved
    else:  # the adapters only
        assert saved and all("lora_" in k for k in saved), saved
    with caplog.at_level(logging.INFO, logger="qrerase"), engine.resuming(resume):
        model, curve = train_baseline(copy.deepcopy(finetuned), copy.deepcopy(ref_model), tok, forget, retain, TPL, cfg)
    assert f"resumed training from {resume / method / 'step-1'}" in caplog.text
    assert curve == ref_curve
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref.state_dict().items())
