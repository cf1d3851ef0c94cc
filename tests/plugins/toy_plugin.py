"""A plug-in method for tests and docs/extending.md: registers the toy baseline ``toy_ga`` on the tofu track.

Standard library only (the workflow imports it at planning time, config key ``plugins``); its
implementation, :class:`toy_objective.HalfAscent`, is imported by name when a job runs it.
"""

from qrerase.registry import register_method

register_method(
    "toy_ga",
    label="Toy Half Ascent",
    tracks=("tofu",),
    run={"text": "toy_objective:HalfAscent"},
    settings={"baselines": {"$ref": "#/definitions/baseline_plain", "description": "the toy baseline (half GA)"}},
    plan_shape=(1, 0),
)
