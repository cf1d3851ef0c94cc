"""Experiment tracks: one package per track (``qrerase/tracks/<name>/``), each registering one :class:`Track`.

A track is everything the workflow does differently for it, declared once in its package as data (its
config section, experiment names, runner, cost groups, page) or as a method that its :class:`Track`
subclass overrides (how its training sections and jobs are composed, its memory plan, its config
checks). The generic code (``qrerase.workflow``, ``qrerase.reports.pages``, ``qrerase.smoke``,
``rules/common.smk``, ``rules/core/``, ``rules/studies/``) looks a track up with :func:`track` and
never compares track names; the functions it calls (``targets``, ``costs``, ``tradeoff_targets``,
``sweep``, ``sweep_eval``, ``finetune_start``, ``robustness``) are bound by the track's rules
(:meth:`Track.bind`) in ``rules/<name>/common.smk``. The Snakefile
includes every rules file a track names (:attr:`Track.rules`, :func:`track_rules`): the built-in
tracks' ``rules/<name>/rules.smk`` and a plug-in's own. :mod:`qrerase.tracks.base` holds the class and
the registry (``qrerase.registry`` re-exports :class:`Track` and :data:`TRACKS`); importing this
package registers the built-in tracks, a plug-in module (config key ``plugins``) registers more.

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
