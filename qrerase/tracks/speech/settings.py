"""The speech baselines' job config and the built-in speech methods' own hyperparameters (torch-free).

A speech baseline job (:class:`SpeechBaselineConfig`) is the shared training keys
(:class:`qrerase.hparams.TrainConfig`), the speech job's own keys (``mode`` and the LoRA shape) and
the method's hyperparameters (:class:`ScrubHparams`, :class:`BadTeachingHparams`; none for Gradient
Ascent), read by :mod:`qrerase.tracks.speech.baselines` as ``cfg.hparams.<key>``. The config's
``speech.baselines.<method>`` sections are generated from these declarations, ``speech.baselines.common``
from the shared ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...baseline_config import BaselineConfig
from ...hparams import ENGINE_KEYS, Hparams, hparam

__all__ = ["ScrubHparams", "BadTeachingHparams", "SpeechBaselineConfig"]


@dataclass
class ScrubHparams(Hparams):
    """SCRUB (Kurmanji et al. 2023): max-steps then min-steps, teacher-student KL at a temperature."""

    max_epochs: int = hparam(1, "SCRUB: the first epochs that also take max-steps on forget batches", ge=0)
    alpha: float = hparam(0.001, "SCRUB: weight of the teacher-student KL in the min-step", ge=0)
    gamma: float = hparam(0.99, "SCRUB: weight of the retain cross-entropy in the min-step", ge=0)
    temperature: float = hparam(1.0, "SCRUB: softmax temperature of the teacher-student KL", gt=0)


@dataclass
class BadTeachingHparams(Hparams):
    """Bad Teaching (Chundawat et al. 2023): distillation temperature and retain share."""

    temperature: float = hparam(1.0, "Bad Teaching: softmax temperature of the teacher-student KL", gt=0)
    retain_fraction: float = hparam(1.0, "Bad Teaching: share of the retain utterances used", gt=0, le=1)


@dataclass
class SpeechBaselineConfig(BaselineConfig):
    """One speech baseline's settings (config ``speech.baselines.<method>`` over ``speech.baselines.common``).

    ``mode``: ``full`` (all weights) or ``lora`` (LoRA ``lora_r`` / ``lora_alpha`` on ``target_modules``,
    merged at the end); ``train``: the optimisation (every update runs on
    :func:`qrerase.engine.train_steps`, Adam at a constant rate); ``hparams``: the method's own keys.
    """

    runner: ClassVar[str] = "speech"
    what: ClassVar[str] = "speech baseline config"
    train_defaults: ClassVar[dict] = {"epochs": 1, "lr": 1e-4, "batch_size": 32}
    section_train: ClassVar[tuple[str, ...]] = ("epochs", "lr", "batch_size", "max_grad_norm", *ENGINE_KEYS)
    section_own: ClassVar[tuple[str, ...]] = ("mode", "lora_r", "lora_alpha", "target_modules")

    mode: str = hparam(
        "full",
        "full: train all weights; lora: a LoRA adapter (lora_r, lora_alpha on target_modules) merged at the end",
        choices=("full", "lora"),
    )
    lora_r: int = hparam(8, "LoRA rank in lora mode", ge=1)
    lora_alpha: float = hparam(16, "LoRA alpha in lora mode", gt=0)
    target_modules: tuple[str, ...] = hparam(
        ("q_proj", "k_proj", "v_proj", "out_proj"), "modules the LoRA adapter wraps in lora mode"
    )
