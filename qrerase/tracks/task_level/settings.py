"""The task-level track's baseline job config and the hyperparameters of its own baselines, KGA and KU (torch-free).

:class:`TaskLevelBaselineConfig` is the job config of the ``task_level`` runner
(:mod:`qrerase.tracks.task_level.runners`); the config schema's ``task_level.baselines.<method>``
sections are generated from it and from the dataclasses its methods register
(:mod:`qrerase.tracks.task_level.methods`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...baseline_config import BaselineConfig
from ...baselines.settings import SECTION_TRAIN
from ...hparams import Hparams, hparam

__all__ = ["KgaHparams", "KuHparams", "TaskLevelBaselineConfig"]


@dataclass
class KgaHparams(Hparams):
    """KGA: the retain KL weight and the auxiliary models' training (A_f on D_f, A_n on D_n)."""

    train_defaults = {"epochs": 1, "lr": 3e-4}

    alpha: float = hparam(1.0, "weight of the retain KL term", ge=0)
    aux_epochs: int = hparam(
        5, "epochs of the auxiliary models A_f and A_n (trained from the initial checkpoint)", ge=1
    )
    aux_lr: float = hparam(2e-3, "learning rate of the auxiliary models", gt=0)
    aux_batch_size: int = hparam(32, "batch size of the auxiliary models", ge=1)


@dataclass
class KuHparams(Hparams):
    """KU: the memorisation criterion."""

    train_defaults = {"epochs": 1, "lr": 3e-4}

    check_every: int = hparam(10, "steps between checks of the forget set's memorisation accuracy", ge=1)
    ma_threshold: float | None = hparam(
        None,
        "stop when the memorisation accuracy falls to this; null = the fine-tuned model's mean on the unseen (new) "
        "questions",
        ge=0,
        le=1,
    )


@dataclass
class TaskLevelBaselineConfig(BaselineConfig):
    """One task-level baseline run of its own runner (KGA, KU: :mod:`qrerase.tracks.task_level.baselines`):
    ``train`` (``micro_batch_size`` applies to KGA's auxiliary runs too) and the method's ``hparams``.
    A text baseline on the task-level track runs with a :class:`TextBaselineConfig`."""

    runner: ClassVar[str] = "task_level"
    section_nullable: ClassVar[bool] = True
    what: ClassVar[str] = "task-level baseline config"
    train_defaults: ClassVar[dict] = {"epochs": 1, "lr": 3e-4, "batch_size": 32}
    section_train: ClassVar[tuple[str, ...]] = SECTION_TRAIN
    section_required: ClassVar[tuple[str, ...]] = ("epochs", "lr", "batch_size")

    def train_config(self, aux: bool = False):
        """The optimisation of the unlearning run, or (``aux``, KGA) of its auxiliary models."""
        from dataclasses import replace

        if aux:
            hp = self.hparams
            return replace(self.train, epochs=hp.aux_epochs, lr=hp.aux_lr, batch_size=hp.aux_batch_size)
        return self.train
