"""A plug-in for tests and docs/extending.md: registers two toy text baselines on the tofu track.

``toy_ga`` has no hyperparameter of its own; ``toy_scaled`` declares one, ``toy_scale`` (its dataclass
:class:`ToyScale`, validated on construction and generated into the config schema's
``tofu.baselines.toy_scaled``). Standard library only (the workflow imports it at planning time, config key
``plugins``); the objectives, :mod:`toy_objective`, are imported by name when a job runs them.
"""

from dataclasses import dataclass

from qrerase.hparams import Hparams, hparam
from qrerase.registry import register_method


@dataclass
class ToyScale(Hparams):
    """The toy scaled ascent's own hyperparameter."""

    toy_scale: float = hparam(0.5, "s: the factor of the toy objective, L = -s x the forget NLL", gt=0)


register_method(
    "toy_ga",
    label="Toy Half Ascent",
    description="the toy baseline (half GA)",
    tracks=("tofu",),
    run={"text": "toy_objective:HalfAscent"},
    plan_shape=(1, 0),
)
register_method(
    "toy_scaled",
    label="Toy Scaled Ascent",
    description="the toy baseline with its own hyperparameter (toy_scale x GA)",
    tracks=("tofu",),
    run={"text": "toy_objective:ScaledAscent"},
    hparams=ToyScale,
    plan_shape=(1, 0),
)
