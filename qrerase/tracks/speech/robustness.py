"""The robustness stage on the speech track's speaker classifier (docs/robustness.md).

:func:`speech_sets` splits a setting's forget set D_f into halves A (relearning data) and B (scored) and
names the other sets; :func:`speech_target` is the :class:`~qrerase.robustness.runner.AttackTarget` of a
speaker classifier; :func:`retain_reference` trains the floor, the retain reference.

* The forget statistic is top-k speaker accuracy (:func:`qrerase.tracks.speech.train.topk_accuracy`, the speech
  table's statistic; the stage uses k = 1) on ``B``, on the whole forget set ``forget`` (D_f) and, as
  utility, on the test set ``utility`` (D_t: in the class setting the retained speakers' test clips).
* Training attacks minimise the fine-tuning loss, the cross-entropy of the speaker labels, on a batch of
  ``A`` (half A of D_f) or ``retain`` (D_r: the training clips outside D_f).
* Halves (:func:`qrerase.robustness.measures.split_halves`): in the class setting the entity is the
  speaker, so every forgotten speaker has clips in both halves. In the sample setting no speaker is
  forgotten (every speaker keeps clips in D_r; D_f is a random draw of training clips), so the forget set
  is one entity, as a task-level skill; a speaker of D_f may have a single clip there, which no split by
  speaker could put in both halves.
* The floor: the same recipe as the fine-tuned classifier (the pretrained encoder, a new seeded speaker
  head, ``speech.finetune``) on D_r alone. In the class setting the forgotten speakers' labels never occur
  in its training data: a model that never learned them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from ...robustness.measures import split_halves
from ...robustness.runner import AttackTarget
from ...robustness.text import linear_weights
from .data import eval_masks, train_mask

__all__ = ["forget_entities", "speech_sets", "speech_target", "retain_reference"]


def forget_entities(index: pd.DataFrame, setting: str) -> tuple[np.ndarray, list[str]]:
    """(corpus indices of the setting's forget set D_f, in corpus order; the entity of each): its
    speaker in the class setting, one entity (``'sample'``) in the sample setting (module docstring)."""
    forget = np.flatnonzero(eval_masks(index, setting)["D_f"])
    if not forget.size:
        raise ValueError(f"robustness: the {setting} setting's forget set is empty")
    if setting == "class":
        return forget, [str(s) for s in index["speaker"].to_numpy()[forget]]
    return forget, ["sample"] * len(forget)


def speech_sets(index: pd.DataFrame, setting: str, seed: int, share: float) -> tuple[dict, dict]:
    """The stage's sets of one setting as corpus indices: ``(scored, training)``, scored = {``B``: half B
    of D_f, ``forget``: D_f, ``utility``: D_t}, training = {``A``: half A of D_f, ``retain``: D_r}.
    A and B partition D_f (:func:`forget_entities`, split by ``split_halves(entities, seed, share)``)."""
    forget, entities = forget_entities(index, setting)
    in_a = split_halves(entities, seed, share)
    masks = eval_masks(index, setting)
    scored = {"B": forget[~in_a], "forget": forget, "utility": np.flatnonzero(masks["D_t"])}
    training = {"A": forget[in_a], "retain": np.flatnonzero(train_mask(index, setting, "retain"))}
    for name, idx in {**scored, **training}.items():
        if not idx.size:
            raise ValueError(f"robustness: set {name!r} of the {setting} setting is empty")
    return scored, training


def _mask(n: int, idx: np.ndarray) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    mask[np.asarray(idx, dtype=np.int64)] = True
    return mask


def speech_target(
    arrays: Mapping[str, np.ndarray],
    scored: Mapping[str, np.ndarray],
    training: Mapping[str, np.ndarray],
    rates: Mapping[str, tuple[float, int]],
    lora_cfg: Any = None,
    batch_size: int = 64,
    k: int = 1,
) -> AttackTarget:
    """The attack target of a speaker classifier. ``arrays``: the corpus (:mod:`qrerase.tracks.speech.data`);
    ``scored``: set name -> corpus indices scored by top-``k`` accuracy after every budget; ``training``:
    ``A`` and ``retain`` corpus indices; ``rates``: mode -> (lr, batch size); ``lora_cfg``: a
    :class:`qrerase.text.training.LoraTrainConfig` (its shape; ``train.seed`` seeds the adapter's A
    init; None: no LoRA attack); ``batch_size``: the evaluation batch."""
    import torch
    import torch.nn.functional as F

    from ...engine.placement import model_device
    from .train import as_tensors, classifier_logits, predict_logits, topk_accuracy

    n = len(arrays["labels"])
    masks = {name: _mask(n, idx) for name, idx in scored.items()}
    for name, mask in masks.items():
        if not mask.any():
            raise ValueError(f"robustness: scored set {name!r} is empty")
    tensors = {}
    for name, idx in training.items():
        if not len(idx):
            raise ValueError(f"robustness: training set {name!r} is empty")
        tensors[name] = as_tensors(arrays, _mask(n, idx), "cpu")  # in corpus order: the runner's indices index it

    def score(model, names=None) -> dict[str, float]:
        return {
            name: topk_accuracy(predict_logits(model, arrays, mask, batch_size), arrays["labels"][mask], k)
            for name, mask in masks.items()
            if names is None or name in names
        }

    def loss(model, name: str, idx: list[int]) -> torch.Tensor:
        x, m, y = tensors[name]
        b = torch.as_tensor(idx, dtype=torch.long)
        device = model_device(model)
        return F.cross_entropy(classifier_logits(model, x[b].to(device), m[b].to(device)), y[b].to(device))

    def add_lora(model):
        from peft import get_peft_model

        from .train import speech_lora_config

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(lora_cfg.train.seed)
            return get_peft_model(
                model, speech_lora_config(lora_cfg.r, lora_cfg.alpha, lora_cfg.dropout, lora_cfg.target_modules)
            )

    return AttackTarget(
        score=score,
        sizes={name: len(t[2]) for name, t in tensors.items()},
        loss=loss,
        rates=rates,
        add_lora=add_lora if lora_cfg is not None else None,
        weights=linear_weights,
    )


def retain_reference(
    model_cfg: Mapping[str, Any],
    pretrained: str | None,
    speakers: list[str],
    arrays: Mapping[str, np.ndarray],
    index: pd.DataFrame,
    setting: str,
    train: Mapping[str, Any],
    seed: int,
    threads: int,
):
    """The floor of a setting: the fine-tuned classifier's recipe (rule speech_finetune: the pretrained
    encoder ``pretrained``, or ``model_cfg``'s checkpoint, with a new speaker head seeded by ``seed``;
    ``train``: ``speech.finetune`` with the engine keys) trained on D_r only. Returns (model in eval mode,
    its loss curve)."""
    from ...text.training import TrainConfig
    from .model import load_pretrained
    from .train import train_classifier

    train = dict(train)
    model = load_pretrained(model_cfg, pretrained, speakers, seed=seed)
    if train.pop("freeze_feature_encoder", False):
        model.freeze_feature_encoder()
    cfg = TrainConfig.from_dict({**train, "seed": seed, "threads": threads})
    curve = train_classifier(model, arrays, train_mask(index, setting, "retain"), cfg, desc="retain reference")
    return model, curve
