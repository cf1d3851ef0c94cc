"""End-to-end, through the real snakemake CLI: the TOFU track (the speech track for HuBERT) with
``model.name_or_path`` pointing at a tiny random checkpoint of each real transformers architecture,
saved here with a tokenizer built here; and the ready configs of the paper's models, planned by -n."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from support import REPO
from support.architectures import (
    CAUSAL,
    LLAMA3_CHAT,
    SMALL_SPEECH,
    as_old_peft,
    build_tokenizer,
    save_causal,
    save_hubert,
    save_lora,
)
from support.snakemake_cli import (
    assert_config_error,
    planned_rules,
    snakemake,
    write_config,
    write_speech_config,
    write_yaml_config,
)

pytestmark = [pytest.mark.workflow, pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")]

EXP = "results/tofu_forget10"
ERASE = f"{EXP}/erase/k2/qr_erase_ll"
SMALL = dict(  # a few optimiser steps and questions: the run checks plumbing, not numbers
    tofu__data__knowledge=[],
    tofu__evaluate={"max_questions": 4, "batch_size": 16, "max_new_tokens": 4},
    finetune={"epochs": 1, "lr": 1.0e-3, "batch_size": 64, "max_length": 64},
    lora={"r": 4, "alpha": 8, "target_modules": "auto", "epochs": 1, "lr": 1.0e-3, "batch_size": 32, "max_length": 64},
    unlearn__rank=2,
    unlearn__control=[],  # no control row: one erase and one evaluation per architecture
    methods={"tofu": ["qr_erase_ll"]},
    erase={"outputs": ["merged", "adapter"]},
)
# Per run: the erased checkpoint, the erase adapter, the TOFU eval log of the erased model and a table
# (the factor report; the full TOFU table, which adds the retain reference and two more evaluations,
# for the chat-template Llama run and the adapters-from-elsewhere run).
TARGETS = [f"{ERASE}/model", f"{ERASE}/adapter", f"{EXP}/eval/qr_erase_ll_k2", f"{EXP}/factors/k2/report.csv"]
FULL_TABLE = [*TARGETS, "results/tables/tofu.csv"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tok")


def _logits_equal(model_cls, base: Path, adapter: Path, merged: Path, inputs: dict) -> float:
    """Base + erase adapter and the merged checkpoint give the same logits; returns max |merged − base|."""
    from peft import PeftModel

    with torch.no_grad():
        plain = model_cls.from_pretrained(str(base)).eval()(**inputs).logits
        with_adapter = (
            PeftModel.from_pretrained(model_cls.from_pretrained(str(base)).eval(), str(adapter)).eval()(**inputs).logits
        )
        merged_logits = model_cls.from_pretrained(str(merged)).eval()(**inputs).logits
    torch.testing.assert_close(with_adapter, merged_logits, rtol=1e-4, atol=1e-5)
    return float((merged_logits - plain).abs().max())


#: one end-to-end run per module layout: Llama (chat template, full table), Mixtral (experts), Phi (dense,
#: fc1/fc2, partial rotary), GPT-2 (Conv1D). Cohere and Qwen2 have Llama's layout (`_LLAMA_LIKE` in
#: qrerase.method.architectures; their module kinds: tests/unit/test_architectures.py), and Qwen2 runs end to
#: end with adapters trained elsewhere below.
LAYOUTS = ["gpt2", "llama", "mixtral", "phi"]


@pytest.mark.parametrize("arch", LAYOUTS)
def test_tofu_track_on_a_checkpoint_of_each_architecture(arch, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    assert set(LAYOUTS) <= set(CAUSAL)

    ckpt = save_causal(arch, tokenizer, tmp_path / "ckpt", chat_template=LLAMA3_CHAT if arch == "llama" else None)
    extra = {"model__template": "chat"} if arch == "llama" else {}
    cfg = write_config(tmp_path, model__name_or_path=str(ckpt), **SMALL, **extra)
    full = arch == "llama"
    ran = planned_rules(
        snakemake(tmp_path, *(FULL_TABLE if full else TARGETS), "--cores", "2", "--configfile", str(cfg))
    )
    assert "tokenizer" not in ran and ran["finetune"] == (2 if full else 1) and ran["lora"] == 2
    if full:
        table = pd.read_csv(tmp_path / "results/tables/tofu.csv")
        assert list(table["method"]) == ["base", "retain", "qr_erase_ll"] and table["model_utility"].between(0, 1).all()
    from qrerase.method.adapters import load_factors

    report = pd.read_csv(tmp_path / f"{EXP}/factors/k2/report.csv")
    assert len(report) == 2 * len(load_factors(tmp_path / f"{EXP}/task_matrices/forget.safetensors"))  # both sets
    from qrerase.metrics.log_metrics import model_utility
    from qrerase.text.eval_log import load_log

    assert 0 <= model_utility(load_log(tmp_path / f"{EXP}/eval/qr_erase_ll_k2")) <= 1
    lora = yaml.safe_load((tmp_path / f"{EXP}/lora/forget/adapter_config.json").read_text())
    modules = yaml.safe_load((tmp_path / f"{EXP}/energy/selected_layers.json").read_text())["modules"]
    erase_cfg = yaml.safe_load((tmp_path / f"{ERASE}/adapter/adapter_config.json").read_text())
    from qrerase.method.architectures import TARGET_PRESETS
    from qrerase.method.module_names import module_kind

    model_type = yaml.safe_load((ckpt / "config.json").read_text())["model_type"]
    assert sorted(lora["target_modules"]) == sorted(TARGET_PRESETS[model_type])  # target_modules: auto
    assert lora["fan_in_fan_out"] is (arch == "gpt2") and erase_cfg["fan_in_fan_out"] is (arch == "gpt2")
    assert sorted(erase_cfg["target_modules"]) == sorted(modules)  # eq. 16: the selected blocks' modules
    assert {module_kind(m).rsplit(".", 1)[-1] for m in modules} == set(TARGET_PRESETS[model_type])
    ids = torch.tensor([[tokenizer.bos_token_id, 25, 99, 140, 7, 311, 60, 18]])
    moved = _logits_equal(
        AutoModelForCausalLM,
        tmp_path / f"{EXP}/models/full",
        tmp_path / f"{ERASE}/adapter",
        tmp_path / f"{ERASE}/model",
        {"input_ids": ids},
    )
    assert moved > 0  # the erase changed the function


def test_adapters_trained_elsewhere(tokenizer, tmp_path):
    """lora.adapters: a forget adapter with rsLoRA and an alpha pattern in PEFT 0.6's config format, and
    a retain adapter of another rank with a rank pattern; no LoRA job runs."""
    from transformers import AutoModelForCausalLM

    ckpt = save_causal("qwen2", tokenizer, tmp_path / "ckpt")
    base = AutoModelForCausalLM.from_pretrained(str(ckpt))
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    forget = as_old_peft(
        save_lora(
            base,
            tmp_path / "forget",
            seed=1,
            r=4,
            lora_alpha=6,
            use_rslora=True,
            target_modules=targets,
            alpha_pattern={"down_proj": 12},
        )
    )
    retain = save_lora(
        base,
        tmp_path / "retain",
        seed=2,
        r=8,
        lora_alpha=8,
        target_modules=targets,
        rank_pattern={"model.layers.0.mlp.up_proj": 3},
    )
    cfg = write_config(
        tmp_path, model__name_or_path=str(ckpt), **SMALL, lora__adapters={"forget": str(forget), "retain": str(retain)}
    )
    ran = planned_rules(snakemake(tmp_path, *FULL_TABLE, "--cores", "2", "--configfile", str(cfg)))
    assert "lora" not in ran and ran["task_matrices"] == 2
    assert len(pd.read_csv(tmp_path / "results/tables/tofu.csv")) == 3
    ids = torch.tensor([[tokenizer.bos_token_id, 25, 99, 140, 7, 311]])
    assert (
        _logits_equal(
            AutoModelForCausalLM,
            tmp_path / f"{EXP}/models/full",
            tmp_path / f"{ERASE}/adapter",
            tmp_path / f"{ERASE}/model",
            {"input_ids": ids},
        )
        > 0
    )


def test_adapter_for_another_model_fails_naming_both(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    ckpt = save_causal("qwen2", tokenizer, tmp_path / "ckpt")
    other = save_causal("gpt2", tokenizer, tmp_path / "other")
    wrong = save_lora(
        AutoModelForCausalLM.from_pretrained(str(other)),
        tmp_path / "wrong",
        seed=1,
        r=2,
        lora_alpha=2,
        target_modules=["c_attn"],
    )
    cfg = write_config(
        tmp_path, model__name_or_path=str(ckpt), **SMALL, lora__adapters={"forget": str(wrong), "retain": None}
    )
    target = f"{EXP}/task_matrices/forget.safetensors"
    # planning refuses the base it names (issue 51); accepted, the job still refuses the shapes
    assert_config_error(tmp_path, cfg, f"config key 'lora.adapters.forget': adapter {wrong} was trained on '{other}'")
    cfg = write_config(
        tmp_path,
        model__name_or_path=str(ckpt),
        **SMALL,
        lora__adapters={"forget": str(wrong), "retain": None},
        lora__accept_other_base=True,
    )
    proc = snakemake(tmp_path, target, "--cores", "2", "--configfile", str(cfg), check=False)
    assert proc.returncode != 0 and not (tmp_path / target).exists()
    log = (tmp_path / "results/logs/task_matrices/tofu_forget10_forget.log").read_text()
    assert f"does not fit model {EXP}/models/full: module 'transformer.h.0.attn.c_attn' is not in the model" in log
    assert f"adapter {wrong}" in log


def test_speech_track_on_a_hubert_checkpoint(tmp_path):
    from transformers import HubertForSequenceClassification

    ckpt = save_hubert(tmp_path / "hubert")
    cfg = write_speech_config(
        tmp_path,
        speech__model__name_or_path=str(ckpt),
        **SMALL_SPEECH,
    )
    erase = "results/speech_class/erase/k2/qr_erase_ll"
    snakemake(
        tmp_path,
        "results/tables/speech.csv",
        f"{erase}/model",
        f"{erase}/adapter",
        "--cores",
        "2",
        "--configfile",
        str(cfg),
    )
    assert list(pd.read_csv(tmp_path / "results/tables/speech.csv")["method"]) == ["base", "qr_erase_ll"]
    lora = yaml.safe_load((tmp_path / "results/speech_class/lora/forget/adapter_config.json").read_text())
    assert sorted(lora["target_modules"]) == ["k_proj", "out_proj", "q_proj", "v_proj"]
    audio = torch.randn(2, 6400, generator=torch.Generator().manual_seed(0))
    assert (
        _logits_equal(
            HubertForSequenceClassification,
            tmp_path / "results/speech/models/full",
            tmp_path / f"{erase}/adapter",
            tmp_path / f"{erase}/model",
            {"input_values": audio},
        )
        > 0
    )


PAPER_CONFIGS = {  # config -> model.size_b (as published; resources come from the memory plan)
    "llama3-8b": 8,
    "llama3-70b": 70,
    "mixtral-8x7b": 46.7,
    "aya-23-8b": 8,
    "llama2-7b-chat": 7,
    "phi-1_5": 1.4,
}


@pytest.mark.parametrize("name", sorted(PAPER_CONFIGS))
def test_paper_model_configs_plan(name, tmp_path):
    cfg = yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text())
    assert cfg["model"]["size_b"] == PAPER_CONFIGS[name]
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    path = write_yaml_config(tmp_path, f"{name}.yaml", cfg, {})
    ran = planned_rules(snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(path)))
    # 4 subspace methods + the QR-Erase (LL) control row (config.yaml unlearn.control)
    assert ran["finetune"] == 2 and ran["lora"] == 2 and ran["erase_adapter"] == 5 and "tokenizer" not in ran
    assert "pretrain" not in ran  # a hub checkpoint is the pretrained model
