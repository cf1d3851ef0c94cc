"""The text baselines' job config (torch-free); each method's own hyperparameters live in its module.

A job config (:class:`TextBaselineConfig`; a track with its own runner declares its own, e.g.
:class:`qrerase.tracks.task_level.settings.TaskLevelBaselineConfig`) is the shared training keys
(:class:`qrerase.hparams.TrainConfig`) plus the method's hyperparameters: an instance of the dataclass
the method registered (:func:`qrerase.registry.register_method` ``hparams=``). The objectives read
them as ``cfg.hparams.<key>`` (:mod:`qrerase.baselines.objective`). The config schema's
``baselines.<method>`` sections are generated from the same declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..baseline_config import BaselineConfig
from ..hparams import ENGINE_KEYS, hparam

__all__ = [
    "DIVERGENCES",
    "SECTION_TRAIN",
    "TextBaselineConfig",
]

#: FLAT's f-divergences (:func:`qrerase.baselines.losses.flat_loss`, ``FlatHparams.divergence``).
DIVERGENCES = ("tv", "kl", "js", "pearson")
SECTION_TRAIN = ("epochs", "lr", "batch_size", "weight_decay", "warmup_ratio", "max_grad_norm", *ENGINE_KEYS)


@dataclass
class TextBaselineConfig(BaselineConfig):
    """One text baseline run (:func:`qrerase.baselines.text.train_baseline`).

    ``method``: a registered text baseline; ``train``: its optimisation (``epochs`` over the forget
    set, ``batch_size`` forget examples per step, retain batches of the same size); ``hparams``: the
    method's own keys (``beta`` of NPO / DPO, ...). ``mode``: ``full`` (all weights) or ``lora``
    (``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``; merged back at the end),
    from the config's ``tofu.baselines`` section.
    """

    runner: ClassVar[str] = "text"
    section_nullable: ClassVar[bool] = True
    what: ClassVar[str] = "baseline config"
    train_defaults: ClassVar[dict] = {"epochs": 5, "lr": 1e-5, "batch_size": 32}
    section_train: ClassVar[tuple[str, ...]] = SECTION_TRAIN
    section_required: ClassVar[tuple[str, ...]] = ("epochs", "lr", "batch_size")

    mode: str = hparam(
        "full", "full: train all weights; lora: LoRA adapters merged back at the end", choices=("full", "lora")
    )
    lora_r: int = hparam(8, "LoRA rank", ge=1)
    lora_alpha: float = hparam(16, "LoRA alpha (the update is scaled by alpha / r)", gt=0)
    lora_dropout: float = hparam(0.0, "LoRA dropout", ge=0, lt=1)
    lora_target_modules: tuple[str, ...] = hparam(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), "modules the adapter wraps"
    )

    def train_config(self):
        """The optimisation part (:class:`qrerase.hparams.TrainConfig`)."""
        return self.train

    def lora_config(self):
        from ..text.training import LoraTrainConfig

        return LoraTrainConfig(
            r=self.lora_r,
            alpha=self.lora_alpha,
            dropout=self.lora_dropout,
            target_modules=self.lora_target_modules,
            train=self.train,
        )
