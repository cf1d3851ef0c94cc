"""End-to-end, through the real snakemake CLI: the speech track on a tiny random Qwen3-Omni checkpoint in
the released layout (only its audio encoder is loaded) and on a tiny random wav2vec 2.0 checkpoint
(``AutoModelForAudioClassification``); the planning-time errors of a bad speech checkpoint; and
config/qwen3-omni.yaml planned with its memory plan."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from support import REPO
from support.architectures import SMALL_SPEECH, save_qwen3_omni, save_wav2vec2
from support.snakemake_cli import assert_config_error, planned_rules, snakemake, write_speech_config, write_yaml_config

pytestmark = [pytest.mark.workflow, pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")]

ERASE = "results/speech_class/erase/k2/qr_erase_ll"
TARGETS = ("results/tables/speech.csv", f"{ERASE}/model", f"{ERASE}/adapter")


def _run(workdir: Path, ckpt: Path) -> None:
    cfg = write_speech_config(workdir, speech__model__name_or_path=str(ckpt), **SMALL_SPEECH)
    snakemake(workdir, *TARGETS, "--cores", "2", "--configfile", str(cfg))


def _logits(model, audio, mask):
    with torch.no_grad():
        return model.eval()(input_values=audio, attention_mask=mask).logits


def _check_erase(workdir: Path) -> None:
    """The table's rows; base + erase adapter gives the merged checkpoint's logits, which differ from base."""
    from peft import PeftModel

    from qrerase.tracks.speech.model import load_speech_model

    assert list(pd.read_csv(workdir / "results/tables/speech.csv")["method"]) == ["base", "qr_erase_ll"]
    energy = pd.read_csv(workdir / "results/speech_class/energy/energy.csv")
    assert len(energy) == 2  # two encoder layers
    audio = torch.randn(2, 6400, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 6400, dtype=torch.long)
    full = workdir / "results/speech/models/full"
    base = _logits(load_speech_model(full), audio, mask)
    adapted = _logits(
        PeftModel.from_pretrained(load_speech_model(full), str(workdir / f"{ERASE}/adapter")), audio, mask
    )
    merged = _logits(load_speech_model(workdir / f"{ERASE}/model"), audio, mask)
    torch.testing.assert_close(adapted, merged, rtol=1e-4, atol=1e-5)
    assert float((merged - base).abs().max()) > 0


@pytest.fixture(scope="module")
def omni_run(tmp_path_factory) -> tuple[Path, Path]:
    """The track on the checkpoint whose shards without audio-tower tensors (the thinker's language model,
    the vision encoder) are garbage: no job of the run reads them, at planning or in a loader."""
    wd = tmp_path_factory.mktemp("omni")
    ckpt = wd / "qwen3-omni"
    save_qwen3_omni(ckpt)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    audio_shards = {f for k, f in index.items() if k.startswith("thinker.audio_tower.")}
    garbage = sorted(set(index.values()) - audio_shards)
    assert garbage
    for shard in garbage:
        (ckpt / shard).write_bytes(b"not a safetensors file")
    _run(wd, ckpt)
    return wd, ckpt


def test_qwen3_omni_runs_the_speech_track(omni_run):
    wd, ckpt = omni_run
    _check_erase(wd)
    config = json.loads((wd / "results/speech/models/full/config.json").read_text())
    assert config["model_type"] == "qrerase_qwen3_omni_speaker" and len(config["id2label"]) == 6
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    audio = sorted(k for k in index if k.startswith("thinker.audio_tower."))
    assert config["source"]["checkpoint"] == str(ckpt) and config["source"]["tensors"] == audio  # the tensors taken
    assert len(index) > len(audio)
    log = (wd / "results/logs/speech_finetune/speech.log").read_text()
    assert f"encoder: {len(audio)} tensors thinker.audio_tower.* of {ckpt}" in log
    lora = json.loads((wd / "results/speech_class/lora/forget/adapter_config.json").read_text())
    assert sorted(lora["target_modules"]) == ["k_proj", "out_proj", "q_proj", "v_proj"]  # its declaration's preset
    assert "LoRA base: the pretrained encoder" in (wd / "results/logs/speech_lora/speech_class_forget.log").read_text()


def test_qwen3_omni_task_matrices_are_peft_delta_weights(omni_run):
    from peft import PeftModel

    from qrerase.method.adapters import load_factors
    from qrerase.tracks.speech.model import load_speech_model

    wd, _ = omni_run
    for which in ("forget", "retain"):
        factors = load_factors(wd / f"results/speech_class/task_matrices/{which}.safetensors")
        peft = PeftModel.from_pretrained(
            load_speech_model(wd / "results/speech/models/full"), str(wd / f"results/speech_class/lora/{which}")
        )
        deltas = {
            name.removeprefix("base_model.model."): module.get_delta_weight("default")
            for name, module in peft.named_modules()
            if hasattr(module, "get_delta_weight") and "default" in getattr(module, "lora_A", {})
        }
        assert sorted(deltas) == sorted(factors) and len(deltas) == 2 * 4  # 2 layers x q, k, v, out
        for name, delta in deltas.items():
            assert factors[name].dense() == pytest.approx(delta.double().numpy(), abs=1e-7)
        assert any(float(d.abs().max()) > 0 for d in deltas.values())


def test_wav2vec2_runs_the_speech_track(tmp_path):
    from transformers import Wav2Vec2ForSequenceClassification

    ckpt = save_wav2vec2(tmp_path / "wav2vec2")
    _run(tmp_path, ckpt)
    _check_erase(tmp_path)
    from qrerase.tracks.speech.model import load_speech_model

    assert type(load_speech_model(tmp_path / "results/speech/models/full")) is Wav2Vec2ForSequenceClassification


@pytest.fixture(scope="module")
def omni_ckpt(tmp_path_factory) -> Path:
    ckpt = tmp_path_factory.mktemp("ckpt") / "qwen3-omni"
    save_qwen3_omni(ckpt)
    return ckpt


def _text_only(out_dir: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    LlamaForCausalLM(config).save_pretrained(str(out_dir))
    return out_dir


def _no_audio_tower(ckpt: Path, out_dir: Path) -> Path:
    out_dir.mkdir()
    for f in ckpt.iterdir():
        (out_dir / f.name).write_bytes(f.read_bytes())
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith("thinker.audio_tower.")}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    return out_dir


def test_bad_speech_checkpoints_fail_at_planning(omni_ckpt, tmp_path):
    cases = [
        (
            {"speech__model__name_or_path": str(_text_only(tmp_path / "llama"))},
            f"config key 'speech.model.name_or_path': {tmp_path / 'llama' / 'config.json'}: model_type 'llama' "
            "has no audio encoder",
        ),
        (
            {"speech__model__name_or_path": str(_no_audio_tower(omni_ckpt, tmp_path / "bare"))},
            f"config key 'speech.model.name_or_path': {tmp_path / 'bare' / 'model.safetensors.index.json'} holds "
            "no thinker.audio_tower.* tensors",
        ),
        (
            {"speech__model__name_or_path": str(omni_ckpt), "speech__data__sample_rate": 8000},
            f"config key 'speech.data.sample_rate': 8000 Hz, but the feature extractor "
            f"{omni_ckpt / 'preprocessor_config.json'} expects 16000 Hz",
        ),
        (
            {"speech__model__name_or_path": str(omni_ckpt), "speech__lora__target_modules": ["q_proj", "o_proj"]},
            "config key 'speech.lora.target_modules': 'o_proj' matches no linear layer of the qwen3-omni encoder",
        ),
    ]
    for i, (overrides, message) in enumerate(cases):
        wd = tmp_path / f"case{i}"
        wd.mkdir()
        assert_config_error(wd, write_speech_config(wd, **overrides), message)


def test_qwen3_omni_config_plans_with_a_memory_plan(tmp_path):
    from qrerase.tracks.speech import frames, speech_shape
    from qrerase.workflow.plan_config import load_config, plan_config

    cfg = yaml.safe_load((REPO / "config" / "qwen3-omni.yaml").read_text())
    assert cfg["speech"]["model"]["name_or_path"] == "Qwen/Qwen3-Omni-30B-A3B-Instruct"
    cfg["speech"]["data"]["root"] = str(REPO / "data" / "fsdd")
    cfg["tofu"] = {"data": {"source": "local", "root": str(REPO / "data" / "tofu"), "split": "forget10"}}
    path = write_yaml_config(tmp_path, "qwen3-omni.yaml", cfg, {})
    rules = planned_rules(snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(path)))
    assert rules["speech_finetune"] == 1 and rules["speech_lora"] == 4 and rules["speech_baseline"] == 6
    assert "speech_pretrain" not in rules  # the hub checkpoint's audio encoder is the pretrained model
    loaded = load_config(path)
    shape = speech_shape(loaded)  # the audio encoder alone, not the 30B multimodal model
    assert 0.6e9 < shape.count_params() < 0.7e9 and shape.layers == 32 and shape.hidden == 1280
    assert frames(loaded) == 13  # positions of a 1 s clip
    finetune = next(r for r in plan_config(loaded) if r.name == "speech:finetune")
    assert finetune.fits and finetune.gpus == 1
    assert 16 * shape.count_params() < finetune.device_bytes < 40 * 2**30  # weights, grads, AdamW state
