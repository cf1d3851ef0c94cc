"""Speech architectures: the Qwen3-Omni audio-tower loader (only ``thinker.audio_tower.*`` is read), the
declarations' shapes and presets, and the planning-time checks of a speech checkpoint; on tiny random
checkpoints of the real transformers classes, built here (no downloads)."""

from __future__ import annotations

import json

import pytest
import torch
from support.architectures import QWEN3_OMNI_AUDIO, save_hubert, save_qwen3_omni, save_wav2vec2

from qrerase.method.architectures import TARGET_PRESETS
from qrerase.method.module_names import block_of
from qrerase.tracks.speech.architectures import (
    ARCHITECTURES,
    KNOWN_SPEECH_SHAPES,
    architecture_for,
    check_speech_checkpoint,
    qwen3_omni_audio_params,
    speech_lora_targets,
)
from qrerase.tracks.speech.model import graft_encoder, load_speech_model
from qrerase.tracks.speech.qwen3_omni import PREFIX, audio_tower_plan

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    """(checkpoint dir, the full multimodal model it was saved from)."""
    path = tmp_path_factory.mktemp("omni") / "qwen3-omni"
    return path, save_qwen3_omni(path)


def _weight_map(path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def test_loader_reads_only_the_audio_tower(omni, tmp_path):
    path, full = omni
    weight_map = _weight_map(path)
    audio_keys = sorted(k for k in weight_map if k.startswith(PREFIX))
    other_shards = set(weight_map.values()) - {weight_map[k] for k in audio_keys}
    assert audio_keys and other_shards  # the released layout: the audio tower among other tensors
    assert len(weight_map) > len(audio_keys)
    # a copy whose shards without audio-tower tensors are garbage: a loader reading them would fail
    copy = tmp_path / "garbage"
    copy.mkdir()
    for f in path.iterdir():
        (copy / f.name).write_bytes(b"not a safetensors file" if f.name in other_shards else f.read_bytes())
    assert check_speech_checkpoint(copy, 16000, "auto").name == "qwen3-omni"  # planning reads no such shard
    plan = audio_tower_plan(copy)
    assert sorted(k for keys in plan.values() for k in keys) == audio_keys
    model = load_speech_model(copy, ["a", "b", "c"], seed=3)
    assert model.config.source["tensors"] == audio_keys and model.config.source["shards"] == sorted(plan)
    assert model.config.source["checkpoint"] == str(copy)
    released = full.state_dict()  # transformers' own module names: thinker.model.audio_tower.*
    own = model.audio_tower.state_dict()
    assert set(own) == {k[len(PREFIX) :] for k in audio_keys}
    for name, t in own.items():
        assert torch.equal(t, released[f"thinker.model.audio_tower.{name}"]), name
    assert model.classifier.out_features == 3 and model.config.id2label[2] == "c"
    # the head is new and seeded: the same seed gives the same head, another seed another one
    again = load_speech_model(path, ["a", "b", "c"], seed=3)
    assert torch.equal(again.classifier.weight, model.classifier.weight)
    assert not torch.equal(load_speech_model(path, ["a", "b", "c"], seed=4).classifier.weight, model.classifier.weight)


def test_classifier_forward_save_load_and_graft(omni, tmp_path):
    path, _ = omni
    model = load_speech_model(path, ["a", "b"], seed=0)
    x = torch.randn(3, 6400, generator=torch.Generator().manual_seed(0))
    m = torch.ones(3, 6400, dtype=torch.long)
    m[1, 4000:] = 0
    logits = model(input_values=x, attention_mask=m).logits
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
    # the padded tail of clip 1 is not heard: its logits are those of the clip cut at its mask
    alone = model(input_values=x[1:2, :4000], attention_mask=m[1:2, :4000]).logits
    assert torch.allclose(alone, logits[1:2], atol=1e-5)
    model.save_pretrained(str(tmp_path / "cls"))
    back = load_speech_model(tmp_path / "cls")
    assert torch.allclose(back(input_values=x, attention_mask=m).logits, logits)
    assert back.config.source["tensors"] == model.config.source["tensors"]  # provenance kept in config.json
    with torch.no_grad():
        for p in back.audio_tower.parameters():
            p.add_(1.0)
    graft_encoder(back, model)  # the architecture's encoder prefix: audio_tower.
    assert torch.allclose(back(input_values=x, attention_mask=m).logits, logits)


def test_declarations_presets_layers_and_shapes(omni):
    path, _ = omni
    model = load_speech_model(path, ["a", "b"])
    arch = ARCHITECTURES["qwen3-omni"]
    assert speech_lora_targets(model.config.to_dict(), "auto") == list(arch.lora_targets)
    for name in ("hubert", "wav2vec2"):  # model_type presets of the generic resolver agree with the declarations
        assert TARGET_PRESETS[name] == ARCHITECTURES[name].lora_targets
    linear = [n for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
    adapted = [n for n in linear if n.rsplit(".", 1)[-1] in arch.lora_targets]
    assert len(adapted) == 4 * QWEN3_OMNI_AUDIO["encoder_layers"]
    assert all(n.startswith(arch.layers + ".") and block_of(n) is not None for n in adapted)
    assert {block_of(n) for n in adapted} == set(range(QWEN3_OMNI_AUDIO["encoder_layers"]))
    # the plan's parameter count is the encoder's own
    cfg = json.loads((path / "config.json").read_text())
    shape = architecture_for(cfg, "x").shape(cfg, "tiny")
    assert shape.count_params() == sum(p.numel() for p in model.audio_tower.parameters())
    assert shape.layers == 2 and shape.hidden == 16 and shape.vocab == 0 and shape.frames_per_second == 13
    from transformers import Qwen3OmniMoeAudioEncoderConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

    with torch.device("meta"):
        released = Qwen3OmniMoeAudioEncoder(Qwen3OmniMoeAudioEncoderConfig(output_dim=2048))
    n = sum(p.numel() for p in released.parameters())
    assert qwen3_omni_audio_params({"output_dim": 2048}) == n
    assert KNOWN_SPEECH_SHAPES["Qwen/Qwen3-Omni-30B-A3B-Instruct"][1].count_params() == n  # about 0.65 B


def test_waveform_family_loads_through_auto_audio_classification(tmp_path):
    from transformers import Wav2Vec2ForSequenceClassification

    model = load_speech_model(save_wav2vec2(tmp_path / "w2v"), ["a", "b", "c"], seed=0)
    assert type(model) is Wav2Vec2ForSequenceClassification and model.config.num_labels == 3
    assert architecture_for(model.config.to_dict(), "x").name == "wav2vec2"
    hubert = json.loads((save_hubert(tmp_path / "hubert") / "config.json").read_text())
    shape = ARCHITECTURES["hubert"].shape(hubert, "h")
    assert (shape.layers, shape.hidden, shape.vocab, shape.frames_per_second) == (2, 32, 0, 50)


def test_planning_checks_name_key_and_file(omni, tmp_path):
    path, _ = omni
    assert check_speech_checkpoint(path, 16000, "auto").name == "qwen3-omni"
    with pytest.raises(
        ValueError, match=r"^config key 'speech.data.sample_rate': 8000 Hz, but the feature extractor .*"
    ):
        check_speech_checkpoint(path, 8000, "auto")
    with pytest.raises(ValueError, match=r"^config key 'speech.lora.target_modules': 'o_proj' matches no linear"):
        check_speech_checkpoint(path, 16000, ["q_proj", "o_proj"])
    # a checkpoint whose index lists no audio-tower tensor
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in path.iterdir():
        (bare / f.name).write_bytes(f.read_bytes())
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith(PREFIX)}
    (bare / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"index.json holds no thinker.audio_tower.\* tensors"):
        check_speech_checkpoint(bare, 16000, "auto")
    with pytest.raises(ValueError, match=r"model_type 'llama' has no audio encoder"):
        architecture_for({"model_type": "llama"}, "config.json")
