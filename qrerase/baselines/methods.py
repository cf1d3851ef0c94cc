"""The text baselines' registrations, each by keyword next to its implementation (torch-free).

Imported by :mod:`qrerase.registry` after the subspace methods, in table order. Each names its objective
(:mod:`qrerase.baselines.objective`, :mod:`~qrerase.baselines.simnpo`, :mod:`~qrerase.baselines.rmu`,
:mod:`~qrerase.baselines.undial`) and its hyperparameters (:mod:`qrerase.baselines.settings`) as
``"module:attribute"`` strings, imported when a job runs. A plug-in baseline registers itself the same
way (docs/extending.md).
"""

from __future__ import annotations

from ..registry import register_method

_OBJ = "qrerase.baselines.objective"
_HP = "qrerase.baselines.settings"
_TEXT = ("tofu",)  # the cross-lingual track adds itself (qrerase.tracks.crosslingual.methods)

register_method(
    "ga",
    label="Gradient Ascent",
    description="Gradient Ascent: minus the mean answer-token NLL of the forget set",
    tracks=_TEXT,
    run={"text": f"{_OBJ}:GradientAscent"},
    plan_shape=(1, 0),
)
register_method(
    "graddiff",
    label="Gradient Difference",
    description="Gradient Difference: forget NLL ascent plus retain_weight x retain NLL",
    tracks=_TEXT,
    run=f"{_OBJ}:GradientDifference",
    hparams=f"{_HP}:RetainWeight",
    plan_shape=(2, 0),
)
register_method(
    "kl",
    label="KL Minimization",
    description="KL Minimisation: forget NLL ascent plus retain_weight x KL to the fine-tuned model on retain answers",
    tracks=_TEXT,
    run=f"{_OBJ}:KLMinimization",
    hparams=f"{_HP}:RetainWeight",
    plan_shape=(2, 1),
)
register_method(
    "npo",
    label="NPO",
    description="NPO (Zhang et al. 2024)",
    tracks=_TEXT,
    run=f"{_OBJ}:NPO",
    hparams=f"{_HP}:Preference",
    plan_shape=(1, 1),
)
register_method(
    "dpo",
    label="DPO",
    description="DPO (Rafailov et al. 2023) with refusals as preferred answers",
    tracks=_TEXT,
    run=f"{_OBJ}:DPO",
    hparams=f"{_HP}:Preference",
    inputs=("refusals",),
    plan_shape=(2, 1),
)
register_method(
    "flat",
    label="FLAT",
    description="FLAT (Wang et al. 2025), forget data only",
    tracks=_TEXT,
    run=f"{_OBJ}:FLAT",
    hparams=f"{_HP}:FlatHparams",
    inputs=("refusals",),
    plan_shape=(2, 0),
)
register_method(
    "simnpo",
    label="SimNPO",
    description="SimNPO (Fan et al. 2024): NPO without pi_ref, length-normalised, plus a retain NLL",
    tracks=_TEXT,
    run="qrerase.baselines.simnpo:SimNPO",
    hparams=f"{_HP}:SimNpoHparams",
    plan_shape=(2, 0),
)
register_method(
    "rmu",
    label="RMU",
    description="RMU (Li et al. 2024, WMDP): one layer's forget activations steered to a random direction",
    tracks=_TEXT,
    run="qrerase.baselines.rmu:RMU",
    hparams=f"{_HP}:RmuHparams",
    plan_shape=(2, 1),
)
register_method(
    "undial",
    label="UNDIAL",
    description="UNDIAL (Dong et al. 2024): self-distillation, the target token's logit lowered",
    tracks=_TEXT,
    run="qrerase.baselines.undial:UNDIAL",
    hparams=f"{_HP}:UndialHparams",
    plan_shape=(2, 1),
)
