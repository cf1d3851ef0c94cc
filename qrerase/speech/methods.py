"""The speech track's baselines: its runner's Gradient Ascent, SCRUB and Bad Teaching (torch-free).

Imported by :mod:`qrerase.registry` after the text baselines, in table order. The implementations
(:mod:`qrerase.speech.baselines`) and hyperparameters (:mod:`qrerase.speech.settings`) are
``"module:attribute"`` strings, imported when a job runs; each has an entry in the trade-off sweep's
section (:func:`qrerase.registry.sweep_settings`).
"""

from __future__ import annotations

from ..registry import extend_method, register_method, sweep_settings

_RUN = "qrerase.speech.baselines"
_HP = "qrerase.speech.settings"
_SPEECH = ("speech",)

extend_method(
    "ga",
    tracks=_SPEECH,
    run={"speech": f"{_RUN}:run_ga"},
    settings=sweep_settings("Gradient Ascent", _SPEECH),
)
register_method(
    "scrub",
    label="SCRUB",
    description="SCRUB (teacher-student max / min steps)",
    tracks=_SPEECH,
    run=f"{_RUN}:run_scrub",
    hparams=f"{_HP}:ScrubHparams",
    settings=sweep_settings("SCRUB", _SPEECH),
    plan_shape=(2, 1),
)
register_method(
    "bad_teaching",
    label="Bad Teaching",
    description="Bad Teaching (competent and incompetent teachers)",
    tracks=_SPEECH,
    run=f"{_RUN}:run_bad_teaching",
    hparams=f"{_HP}:BadTeachingHparams",
    settings=sweep_settings("Bad Teaching", _SPEECH),
    plan_shape=(2, 2),
)
