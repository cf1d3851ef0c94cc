"""Experiment names: the ``{exp}`` wildcard of every workflow path, built and parsed in one place.

An experiment name is ``<prefix>[_<arg>]``; the prefix names the track (file-name prefixes keep the
short ``xling`` of the cross-lingual track: results/ paths are part of the artifacts' identity):

=====================  ==============  =======================================================
name                   track           what it holds
=====================  ==============  =======================================================
``tofu_<split>``       tofu            a TOFU experiment (split ``forget01|05|10``): own models
``xling``              crosslingual    the shared multilingual models
``xling_<lang>``       crosslingual    unlearning in language ``<lang>`` (``hi``, ``hi_R``)
``speech``             speech          the prepared audio and the shared speaker classifier
``speech_<setting>``   speech          unlearning in one setting (``sample`` or ``class``)
``task_level``         task_level      the task-level experiment: own model
``size_h<W>_s<S>``     tofu            the size study: TOFU at hidden width W, seed S: own models
=====================  ==============  =======================================================

A size-study experiment runs every rule of the TOFU track; its model width and seed come from its
name (:func:`size_of`), everything else from the TOFU configuration.

Evaluated models are named here too: a subspace method at rank k is ``<method>_k<k>``
(:func:`format_model`, parsed by :func:`parse_model` / :func:`method_of`); any other model (a
baseline, ``base``, ``retain``) by its own name.

Standard library only (read by the Snakefile before any job runs).
"""

from __future__ import annotations

import numbers
import re
from typing import NamedTuple

from ..tracks.base import TRACKS, Track, track

__all__ = [
    "Experiment",
    "EXP_PATTERNS",
    "PREFIX",
    "exp_pattern",
    "language_model_templates",
    "text_unlearning_templates",
    "parse_exp",
    "format_exp",
    "model_exp",
    "size_exp",
    "size_of",
    "format_model",
    "parse_model",
    "method_of",
    "track_of_exp",
]


def _tables() -> tuple[dict[str, str], dict[str, str], dict[str, str], dict[str, str]]:
    """(track -> prefix, template -> regex, template -> track, template -> prefix) of the registered tracks
    (:attr:`qrerase.tracks.Track.prefix`, ``experiments``, ``template_prefixes``), read when called so that a
    plug-in track's names parse too."""
    prefix = {t.name: t.prefix for t in TRACKS.values()}
    own = [(k, r) for t in TRACKS.values() for k, r in t.experiments.items() if k not in t.template_prefixes]
    other = [(k, r) for t in TRACKS.values() for k, r in t.experiments.items() if k in t.template_prefixes]
    patterns = dict(own + other)  # the templates named by their track's prefix first, then the others
    template_track = {k: t.name for t in TRACKS.values() for k in t.experiments}
    template_prefix = {k: p for t in TRACKS.values() for k, p in t.template_prefixes.items()}
    return prefix, patterns, template_track, template_prefix


#: track -> the prefix of its experiment names (the built-in tracks; :attr:`qrerase.tracks.Track.prefix`).
PREFIX: dict[str, str] = _tables()[0]
#: template -> regex of its names; a template is the name's template (the built-in tracks'
#: :attr:`qrerase.tracks.Track.experiments`, in track order, the templates with another prefix last). The
#: order is the central ``exp`` wildcard constraint's (rules/common.smk).
EXP_PATTERNS: dict[str, str] = _tables()[1]


class Experiment(NamedTuple):
    """A parsed experiment name: its track, and its argument (TOFU split, unlearning language,
    speech setting; ``None`` for the shared ``xling`` / ``speech`` experiments and ``task_level``)."""

    track: str
    arg: str | None

    @property
    def name(self) -> str:
        return format_exp(self.track, self.arg)


def language_model_templates() -> list[str]:
    """The experiment templates whose models are causal language models, built by the shared text chain
    (tokenizer, pretrain, finetune, LoRA: ``rules/core/model.smk``, ``rules/core/lora.smk``), in the order of
    :data:`EXP_PATTERNS`: those of the tracks with :attr:`qrerase.tracks.Track.language_model`."""
    lm_tracks = {t.name for t in TRACKS.values() if t.language_model}
    template_track = _tables()[2]
    return [k for k in _tables()[1] if template_track[k] in lm_tracks]


def text_unlearning_templates() -> list[str]:
    """The experiment templates that unlearn with the shared text rules (baselines and trade-off sweeps):
    those of the tracks whose baselines use the ``text`` runner, less a track's shared-model template (the
    ``<prefix>`` experiment of a :attr:`qrerase.tracks.Track.shared_models` track only trains), in the
    order of :data:`EXP_PATTERNS`."""
    patterns, template_track = _tables()[1], _tables()[2]
    return [
        k
        for k in patterns
        if TRACKS[template_track[k]].runner == "text"
        and not (TRACKS[template_track[k]].shared_models and k == TRACKS[template_track[k]].prefix)
    ]


def exp_pattern(*templates: str) -> str:
    """The regex of experiment names of the given templates (keys of :data:`EXP_PATTERNS`; none: all)."""
    patterns = _tables()[1]
    unknown = [k for k in templates if k not in patterns]
    if unknown:
        raise KeyError(f"exp_pattern: unknown template(s) {unknown}; known: {list(patterns)}")
    return "|".join(patterns[k] for k in (templates or patterns))


def parse_exp(exp: str) -> Experiment:
    """``'xling_hi_R'`` -> ``Experiment('crosslingual', 'hi_R')``; ValueError for a malformed name."""
    prefixes, patterns, template_track, template_prefix = _tables()
    for template, pattern in patterns.items():
        if re.fullmatch(pattern, exp):
            name = template_track[template]
            prefix = template_prefix.get(template, prefixes[name])
            arg = exp[len(prefix) + 1 :] if "<" in template else None
            return Experiment(name, arg)
    raise ValueError(f"experiment name {exp!r} matches none of {list(patterns)}")


def track_of_exp(exp: str) -> Track:
    """The registered :class:`~qrerase.tracks.Track` of an experiment name."""
    return track(parse_exp(exp).track)


def format_exp(track: str, arg: str | None = None) -> str:
    """The inverse of :func:`parse_exp`; ValueError when the result would not parse back."""
    prefixes, patterns, template_track, template_prefix = _tables()
    if track not in prefixes:
        raise ValueError(f"unknown track {track!r}; known: {list(prefixes)}")
    name = prefixes[track] if arg is None else f"{prefixes[track]}_{arg}"
    for template, prefix in template_prefix.items():  # e.g. ('tofu', 'h64_s0') -> 'size_h64_s0'
        if (
            template_track[template] == track
            and arg is not None
            and re.fullmatch(patterns[template], f"{prefix}_{arg}")
        ):
            name = f"{prefix}_{arg}"
    try:
        parsed = parse_exp(name)
    except ValueError:
        parsed = None
    if parsed != (track, arg):
        raise ValueError(f"experiment name {name!r} does not parse back to ({track!r}, {arg!r})")
    return name


def size_exp(width: int, seed: int) -> str:
    """``(256, 1)`` -> ``'size_h256_s1'``: the size study's experiment at hidden width ``width``, seed ``seed``."""
    if not (isinstance(width, int) and width >= 1 and isinstance(seed, int) and seed >= 0):
        raise ValueError(f"size_exp: expected width >= 1 and seed >= 0 (integers), got {width!r}, {seed!r}")
    return f"size_h{width}_s{seed}"


def size_of(exp: str) -> tuple[int, int] | None:
    """``'size_h256_s1'`` -> ``(256, 1)`` (width, seed); ``None`` for any other experiment."""
    m = re.fullmatch(r"size_h(\d+)_s(\d+)", exp)
    return (int(m.group(1)), int(m.group(2))) if m else None


def model_exp(exp: str) -> str:
    """The experiment whose fine-tuned models ``exp`` unlearns from: ``<prefix>`` for a track with
    :attr:`~qrerase.tracks.Track.shared_models` (``xling_<lang>`` -> ``xling``, ``speech_<setting>`` ->
    ``speech``), else ``exp`` itself (TOFU experiments and ``task_level`` own theirs)."""
    t = track(parse_exp(exp).track)
    return t.prefix if t.shared_models else exp


def format_model(method: str, rank: int) -> str:
    """``('qr_erase', 4)`` -> ``'qr_erase_k4'``: the evaluated model of a subspace method at rank k (the
    inverse of :func:`parse_model`). ValueError unless ``method`` is a non-empty name and ``rank`` an
    integer ≥ 1 (numpy integers included)."""
    if not (isinstance(method, str) and method) or isinstance(rank, bool) or not isinstance(rank, numbers.Integral):
        raise ValueError(f"format_model: expected a method name and an integer rank, got {method!r}, {rank!r}")
    if rank < 1:
        raise ValueError(f"format_model: {method}: rank must be >= 1, got {rank}")
    return f"{method}_k{int(rank)}"


def parse_model(model: str) -> tuple[str, int | None]:
    """An evaluated model's name -> (method, rank): ``'qr_erase_k4'`` -> ``('qr_erase', 4)``; a name
    without a ``_k<digits>`` suffix (``'ga'``, ``'base'``, ``'x_k'``) -> ``(name, None)``."""
    head, _, rank = model.rpartition("_k")
    return (head, int(rank)) if head and rank.isdigit() else (model, None)


def method_of(model: str) -> str:
    """The method of an evaluated model's name: ``'qr_erase_k4'`` -> ``'qr_erase'`` (:func:`parse_model`);
    any other name (``'ga'``, ``'base'``) is returned unchanged."""
    return parse_model(model)[0]
