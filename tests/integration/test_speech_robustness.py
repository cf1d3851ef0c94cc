"""The robustness stage on the speech track (qrerase.tracks.speech.robustness), on a tiny random HuBERT and real
FSDD clips, against the definitions of docs/robustness.md: the halves, the scores, the training loss, the
attacks and the retain reference (the floor)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support import REPO
from support.tiny_hubert import TINY_HUBERT

from qrerase.tracks.speech import data as sd
from qrerase.tracks.speech import model as sm
from qrerase.tracks.speech.robustness import forget_entities, retain_reference, speech_sets, speech_target

FSDD = REPO / "data" / "fsdd"
RATES = {"full": (1e-3, 8), "lora": (1e-2, 8)}


@pytest.fixture(scope="module")
def corpus():
    """Real FSDD audio: indices 0-2 of every speaker x digit (180 utterances), 0.3 s, a validation slice."""
    cfg = sd.SpeechDataConfig(
        root=str(FSDD), max_seconds=0.3, max_per_digit=3, test_fraction=0.34, val_fraction=0.1, seed=0
    )
    return sd.make_speech_data(cfg, progress=False)


def _model(speakers, seed=0, **shape):
    return sm.build_tiny_hubert(sm.TinyHubertConfig(**{**TINY_HUBERT, **shape}), speakers, seed)


@pytest.mark.parametrize("setting", ["sample", "class"])
def test_the_halves_partition_the_forget_set(corpus, setting):
    _, index, meta = corpus
    scored, training = speech_sets(index, setting, seed=3, share=0.5)
    masks = sd.eval_masks(index, setting)
    a, b = set(training["A"].tolist()), set(scored["B"].tolist())
    assert not a & b  # B is never trained on
    assert a | b == set(np.flatnonzero(masks["D_f"]).tolist()) == set(scored["forget"].tolist())
    assert set(training["retain"].tolist()) == set(np.flatnonzero(masks["D_r"]).tolist())
    assert not set(training["retain"].tolist()) & (a | b)
    assert set(scored["utility"].tolist()) == set(np.flatnonzero(masks["D_t"]).tolist())
    speaker = index["speaker"].to_numpy()
    if setting == "class":  # every forgotten speaker in both halves, ceil(n / 2) of its clips in A
        assert set(speaker[list(a)]) == set(speaker[list(b)]) == set(meta["forget_speakers"])
        for s in meta["forget_speakers"]:
            n = int((speaker[scored["forget"]] == s).sum())
            assert (speaker[training["A"]] == s).sum() == math.ceil(n / 2)
    else:  # one entity: no speaker is forgotten
        _, entities = forget_entities(index, setting)
        assert set(entities) == {"sample"} and len(a) == math.ceil(len(scored["forget"]) / 2)
    again, _ = speech_sets(index, setting, seed=3, share=0.5)
    other, _ = speech_sets(index, setting, seed=4, share=0.5)
    assert np.array_equal(again["B"], scored["B"]) and not np.array_equal(other["B"], scored["B"])


def test_scores_are_hand_counted_accuracies_and_the_loss_is_the_cross_entropy(corpus):
    import torch
    import torch.nn.functional as F

    arrays, index, meta = corpus
    scored, training = speech_sets(index, "class", seed=0, share=0.5)
    model = _model(meta["speakers"])
    target = speech_target(arrays, scored, training, RATES, batch_size=7)
    got = target.score(model)
    assert set(got) == {"B", "forget", "utility"}
    labels = arrays["labels"]
    with torch.no_grad():
        for name, idx in scored.items():
            x = torch.from_numpy(np.array(arrays["input_values"][idx]))
            m = torch.from_numpy(np.array(arrays["attention_mask"][idx]))
            pred = model(input_values=x, attention_mask=m).logits.argmax(-1).numpy()
            assert got[name] == pytest.approx(np.mean(pred == labels[idx]))
    assert target.sizes == {"A": len(training["A"]), "retain": len(training["retain"])}
    # example i of a training set is its i-th clip in corpus order
    clips = np.sort(training["A"])[[0, 2]]
    x = torch.from_numpy(np.array(arrays["input_values"][clips]))
    m = torch.from_numpy(np.array(arrays["attention_mask"][clips]))
    with torch.no_grad():
        want = F.cross_entropy(model(input_values=x, attention_mask=m).logits, torch.from_numpy(labels[clips]))
        assert float(target.loss(model, "A", [0, 2])) == pytest.approx(float(want), rel=1e-6)
    assert target.add_lora is None  # no LoRA shape: no LoRA attack


def test_every_attack_runs_on_a_copy_and_starts_from_the_model(corpus):
    import torch

    from qrerase.robustness.runner import run_attacks
    from qrerase.robustness.settings import robustness_settings
    from qrerase.text.training import LoraTrainConfig

    arrays, index, meta = corpus
    scored, training = speech_sets(index, "class", seed=0, share=0.5)
    scored["utility"], training["retain"] = scored["utility"][:12], training["retain"][:16]  # time
    # input widths of 32: every linear layer is quantized
    model = _model(
        meta["speakers"], hidden_size=32, intermediate_size=64, conv_dim=(8, 16, 16, 32), classifier_proj_size=32
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoraTrainConfig.from_dict(
        {
            "r": 2,
            "alpha": 4,
            "target_modules": ["q_proj", "v_proj"],
            "train": {"epochs": 1, "lr": 1e-2, "batch_size": 1, "seed": 0},
        }
    )
    target = speech_target(arrays, scored, training, RATES, lora)
    start = target.score(model)
    settings = robustness_settings({"budgets": [0, 1], "lr_factors": [1.0], "formats": ["q4_0"]})
    module = "hubert.encoder.layers.0.attention.q_proj"
    rows, delta = run_attacks(model, target, settings, seed=0, diagnostic=[module])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # attacks ran on copies
    for attack in ("relearn", "benign"):
        for mode in ("full", "lora"):
            mine = [r for r in rows if (r["attack"], r["mode"]) == (attack, mode)]
            assert sorted({r["budget"] for r in mine}) == [0, 1]
            assert {r["set"]: r["value"] for r in mine if r["budget"] == 0} == pytest.approx(start)
    quant = {r["set"]: r["value"] for r in rows if r["attack"] == "quantize"}
    assert set(quant) == {"forget", "utility"} and all(0 <= v <= 1 for v in quant.values())
    assert delta[module].shape == (32, 32) and np.abs(delta[module]).max() > 0


def test_the_retain_reference_is_the_finetune_recipe_on_the_retain_set(corpus, tmp_path):
    import torch

    from qrerase.text.training import TrainConfig
    from qrerase.tracks.speech.train import train_classifier

    arrays, index, meta = corpus
    sm.save_speech_model(_model([str(d) for d in range(10)], seed=1), tmp_path / "pretrained")  # a digit model
    train = {"epochs": 2, "lr": 1e-3, "batch_size": 32, "warmup_ratio": 0.1, "freeze_feature_encoder": True}
    floor, curve = retain_reference(
        {}, str(tmp_path / "pretrained"), meta["speakers"], arrays, index, "class", train, seed=5, threads=1
    )
    retain = sd.train_mask(index, "class", "retain")
    assert len(curve) == 2 * math.ceil(retain.sum() / 32)
    assert not (index["speaker"].to_numpy()[retain] == meta["forget_speakers"][0]).any()
    # the same by hand: the pretrained encoder, a new head seeded alike, speech_finetune's loop on D_r
    model = sm.load_pretrained({}, str(tmp_path / "pretrained"), meta["speakers"], seed=5)
    model.freeze_feature_encoder()
    cfg = TrainConfig.from_dict(
        {"epochs": 2, "lr": 1e-3, "batch_size": 32, "warmup_ratio": 0.1, "seed": 5, "threads": 1}
    )
    train_classifier(model, arrays, retain, cfg)
    mine = floor.state_dict()
    assert all(torch.equal(mine[k], v) for k, v in model.state_dict().items())
    assert list(floor.config.id2label.values()) == meta["speakers"]
