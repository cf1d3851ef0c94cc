"""Experiment tracks: one module per track (``qrerase/tracks/<name>.py``), each registering one :class:`Track`.

A track is everything the workflow does differently for it, declared once in its module as data (its
config section, experiment names, runner kind, cost groups, page) or as a method that its
:class:`Track` subclass overrides (how its training sections and jobs are composed, its memory plan,
its config checks). The generic code (``qrerase.workflow``, ``qrerase.reports.pages``,
``qrerase.smoke``, ``rules/common.smk``, ``rules/studies/cost_common.smk``, ``rules/studies/tradeoff_common.smk``)
looks a track up with :func:`track` and never compares track names; the functions it calls
(``targets``, ``costs``, ``tradeoff_targets``, ``sweep``, ``finetune_start``, ``robustness``) are
bound by the track's rules file (:meth:`Track.bind`): ``rules/<name>_common.smk``, or the rules file
a plug-in track names (:attr:`Track.rules`; :func:`track_rules`, included by the Snakefile).
:mod:`qrerase.tracks.base` holds the class and the registry
(``qrerase.registry`` re-exports :class:`Track` and :data:`TRACKS`); importing this package registers
the built-in tracks, a plug-in module (config key ``plugins``) registers more.

Standard library only at import (the Snakefile imports this at parse time). docs/extending.md:
adding a track.
"""

from __future__ import annotations

import importlib

from .base import TRACKS, Track, TrackError, register_track, section_at, track, track_rules

__all__ = ["Track", "TrackError", "TRACKS", "BUILTIN", "register_track", "track", "track_rules", "section_at"]

#: The built-in track modules, in config order (each registers its track when imported).
BUILTIN = ("tofu", "crosslingual", "speech", "task_level")
for _module in BUILTIN:
    importlib.import_module(f"{__name__}.{_module}")
