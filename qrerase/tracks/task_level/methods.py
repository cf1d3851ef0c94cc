"""The task-level track's methods: its runner's Gradient Ascent, and KGA and KU, which only it runs (torch-free).

Imported by :mod:`qrerase.registry` after the shared built-in methods (:attr:`qrerase.tracks.Track.methods`),
so the methods keep the table order. The implementations are ``"module:attribute"`` strings
(:mod:`qrerase.tracks.task_level.runners`), imported when a baseline job runs.
"""

from __future__ import annotations

from ...registry import extend_method, register_method

_RUNNERS = "qrerase.tracks.task_level.runners"
_SETTINGS = "qrerase.tracks.task_level.settings"

# Gradient Ascent on the task-level track: the text objective through its runner.
extend_method("ga", tracks=("task_level",), run={"task_level": f"{_RUNNERS}:run_text_objective"})
register_method(
    "kga",
    label="KGA",
    description="KGA (Wang et al. 2023)",
    tracks=("task_level",),
    run=f"{_RUNNERS}:run_kga",
    hparams=f"{_SETTINGS}:KgaHparams",
    inputs=("initial",),
    plan_shape=(2, 3),
)
register_method(
    "ku",
    label="KU",
    description="KU (Jang et al. 2023)",
    tracks=("task_level",),
    run=f"{_RUNNERS}:run_ku",
    hparams=f"{_SETTINGS}:KuHparams",
    plan_shape=(1, 0),
)
