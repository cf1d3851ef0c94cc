"""The text baselines' job config and the built-in text methods' own hyperparameters (torch-free).

A job config (:class:`TextBaselineConfig`; a track with its own runner declares its own, e.g.
:class:`qrerase.tracks.task_level.settings.TaskLevelBaselineConfig`) is the shared training keys
(:class:`qrerase.hparams.TrainConfig`) plus the method's hyperparameters: an instance of the dataclass
the method registered (:func:`qrerase.registry.register_method` ``hparams=``). The objectives read
them as ``cfg.hparams.<key>`` (:mod:`qrerase.baselines.objective`). The config schema's
``baselines.<method>`` sections are generated from the same declarations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from ..baseline_config import BaselineConfig
from ..hparams import ENGINE_KEYS, Hparams, hparam

__all__ = [
    "DIVERGENCES",
    "SECTION_TRAIN",
    "RetainWeight",
    "Preference",
    "FlatHparams",
    "SimNpoHparams",
    "UndialHparams",
    "RmuHparams",
    "TextBaselineConfig",
]

#: FLAT's f-divergences (:func:`qrerase.baselines.losses.flat_loss`).
DIVERGENCES = ("tv", "kl", "js", "pearson")
SECTION_TRAIN = ("epochs", "lr", "batch_size", "weight_decay", "warmup_ratio", "max_grad_norm", *ENGINE_KEYS)


@dataclass
class RetainWeight(Hparams):
    """graddiff, kl: the weight of the retain term."""

    retain_weight: float = hparam(
        1.0,
        "w: weight of the retain term (graddiff: retain NLL; kl: KL to the fine-tuned model on retain answer tokens)",
        ge=0,
    )


@dataclass
class Preference(Hparams):
    """npo, dpo: the inverse temperature."""

    beta: float = hparam(0.1, "beta: the inverse temperature of the NPO / DPO objective", gt=0)


@dataclass
class FlatHparams(Hparams):
    """FLAT: the f-divergence."""

    divergence: str = hparam(
        "tv",
        "the f-divergence of the FLAT objective (total variation, KL, Jensen-Shannon, Pearson)",
        choices=DIVERGENCES,
    )


@dataclass
class SimNpoHparams(Hparams):
    """SimNPO (:mod:`qrerase.baselines.simnpo`). Defaults: the TOFU forget10 values of the authors' code
    (OPTML-Group/Unlearn-Simple: ``beta=4.5``, ``npo_coeff=0.125``, ``grad_diff_coeff=1.0``, ``gamma=0``),
    also open-unlearning's configs/trainer/SimNPO.yaml."""

    beta: float = hparam(4.5, "beta: the inverse temperature of SimNPO (reference: 4.5 on TOFU forget10)", gt=0)
    gamma: float = hparam(0.0, "gamma: the reward margin of SimNPO, subtracted after the beta scaling", ge=0)
    forget_weight: float = hparam(0.125, "w_f: weight of the SimNPO forget term (the reference npo_coeff 0.125)", gt=0)
    retain_weight: float = hparam(
        1.0, "w_r: weight of the retain answer NLL (reference grad_diff_coeff 1.0; 0 = no retain pass)", ge=0
    )


@dataclass
class UndialHparams(Hparams):
    """UNDIAL (:mod:`qrerase.baselines.undial`). Defaults: open-unlearning's configs/trainer/UNDIAL.yaml
    (``beta: 10``, ``alpha: 0``: the paper uses no retain term)."""

    beta: float = hparam(
        10.0, "beta: how much the target token's teacher logit is lowered (reference 10; 0 distils pi_ref)", ge=0
    )
    retain_weight: float = hparam(0.0, "w_r: weight of the retain answer NLL (reference 0: no retain pass)", ge=0)


_LAYER_PARAM = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")  # a decoder layer's parameter: index, rest of the name


@dataclass
class RmuHparams(Hparams):
    """RMU (:mod:`qrerase.baselines.rmu`). Defaults: the authors' code (centerforaisafety/wmdp,
    rmu/unlearn.py, zephyr-7b, 32 layers): ``layer_id 7``, ``layer_ids 5,6,7``, ``param_ids 6``
    (``mlp.down_proj``), ``steering_coeffs 20``, ``alpha 100``. ``update_layers`` must be ``<= layer``."""

    layer: int = hparam(7, "l: the 0-based decoder layer whose output is steered (reference 7 of 32)", ge=0)
    update_layers: tuple[int, ...] | None = hparam(
        None,
        "decoder layers whose parameters are trained, each <= layer; null = max(0, layer - 2) ... layer "
        "(reference 5, 6, 7)",
        ge=0,
    )
    update_modules: tuple[str, ...] = hparam(
        ("mlp.down_proj",),
        "module paths inside a decoder layer whose parameters are trained (LoRA adapters of them included); "
        "'*' = every parameter of the layer (reference: mlp.down_proj)",
    )
    steering_coeff: float = hparam(20.0, "c: the scale of the random control vector u (reference 20)", gt=0)
    alpha: float = hparam(100.0, "alpha: the weight of the retain activation MSE (reference 100)", ge=0)
    control_seed: int | None = hparam(None, "the seed of the control vector u; null = the run's seed", ge=0)

    def __post_init__(self):
        super().__post_init__()
        if self.update_layers is not None and max(self.update_layers) > self.layer:
            raise ValueError(
                f"RmuHparams: 'update_layers' must be a non-empty list of integers in [0, layer={self.layer}], "
                f"got {list(self.update_layers)!r}"
            )
        if any(not m.strip(".") for m in self.update_modules):
            raise ValueError(f"RmuHparams: 'update_modules' must be module paths, got {list(self.update_modules)!r}")

    def layers_updated(self) -> tuple[int, ...]:
        """The decoder layers whose parameters are trained (``update_layers`` or ``l-2 ... l``)."""
        if self.update_layers is not None:
            return tuple(sorted(set(self.update_layers)))
        return tuple(range(max(0, self.layer - 2), self.layer + 1))

    def trains(self, name: str) -> bool:
        """Whether parameter ``name`` (as ``model.named_parameters()`` gives it) is one RMU trains: in a
        decoder layer of :meth:`layers_updated`, its name within the layer a path of ``update_modules``
        or under one (``'*'``: any)."""
        m = _LAYER_PARAM.search(name)
        if m is None or int(m.group(1)) not in self.layers_updated():
            return False
        rest = m.group(2)
        return any(p == "*" or rest == p.strip(".") or rest.startswith(p.strip(".") + ".") for p in self.update_modules)


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
