"""The speech track's baselines: its runner's Gradient Ascent, SCRUB and Bad Teaching (torch-free).

Imported by :mod:`qrerase.registry` after the text baselines, in table order
(:attr:`qrerase.tracks.Track.methods`). The implementations (:mod:`qrerase.tracks.speech.baselines`) and
hyperparameters (:mod:`qrerase.tracks.speech.settings`) are ``"module:attribute"`` strings, imported
when a job runs; each has an entry in the trade-off sweep's section (:func:`sweep_settings`).
"""

from __future__ import annotations

from ...registry import extend_method, register_method

_RUN = "qrerase.tracks.speech.baselines"
_HP = "qrerase.tracks.speech.settings"
_SPEECH = ("speech",)


def sweep_settings(label: str) -> dict[str, dict[str, str]]:
    """A baseline's entry in the trade-off sweep's section (``speech.tradeoff.baselines.<method>``: its
    ``param`` and ``values``, the schema's ``speech_sweep``)."""
    return {"speech.tradeoff.baselines": {"$ref": "#/definitions/speech_sweep", "description": f"the {label} sweep"}}


extend_method(
    "ga",
    tracks=_SPEECH,
    run={"speech": f"{_RUN}:run_ga"},
    settings=sweep_settings("Gradient Ascent"),
)
register_method(
    "scrub",
    label="SCRUB",
    description="SCRUB (teacher-student max / min steps)",
    tracks=_SPEECH,
    run=f"{_RUN}:run_scrub",
    hparams=f"{_HP}:ScrubHparams",
    settings=sweep_settings("SCRUB"),
    plan_shape=(2, 1),
)
register_method(
    "bad_teaching",
    label="Bad Teaching",
    description="Bad Teaching (competent and incompetent teachers)",
    tracks=_SPEECH,
    run=f"{_RUN}:run_bad_teaching",
    hparams=f"{_HP}:BadTeachingHparams",
    settings=sweep_settings("Bad Teaching"),
    plan_shape=(2, 2),
)
