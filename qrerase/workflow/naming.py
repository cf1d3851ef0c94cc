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

__all__ = [
    "Experiment",
    "EXP_PATTERNS",
    "PREFIX",
    "exp_pattern",
    "parse_exp",
    "format_exp",
    "tofu_exp",
    "xling_exp",
    "speech_exp",
    "model_exp",
    "TASK_LEVEL_EXP",
    "size_exp",
    "size_of",
    "format_model",
    "parse_model",
    "method_of",
    "LANG_PATTERN",
    "ROMANISED_LANG_PATTERN",
    "XLING_EXP",
    "SPEECH_EXP",
]

#: track -> the prefix of its experiment names.
PREFIX = {"tofu": "tofu", "crosslingual": "xling", "speech": "speech", "task_level": "task_level"}

#: A cross-lingual language code: ISO 639-1, '_R' for its romanised copy ('hi', 'hi_R').
LANG_PATTERN = r"[a-z]{2}(_R)?"
ROMANISED_LANG_PATTERN = r"[a-z]{2}_R"

#: kind -> regex of its names; a kind is the name's template. The order is the central
#: ``exp`` wildcard constraint's (rules/common.smk).
EXP_PATTERNS: dict[str, str] = {
    "tofu_<split>": r"tofu_forget\d\d",
    "xling": "xling",
    "xling_<lang>": rf"xling_{LANG_PATTERN}",
    "speech": "speech",
    "speech_<setting>": "speech_(sample|class)",
    "task_level": "task_level",
    "size_<shape>": r"size_h\d+_s\d+",
}
_KIND_TRACK = {
    "tofu_<split>": "tofu",
    "xling": "crosslingual",
    "xling_<lang>": "crosslingual",
    "speech": "speech",
    "speech_<setting>": "speech",
    "task_level": "task_level",
    "size_<shape>": "tofu",
}
#: kinds whose names do not start with their track's prefix
_KIND_PREFIX = {"size_<shape>": "size"}

XLING_EXP = PREFIX["crosslingual"]
SPEECH_EXP = PREFIX["speech"]
TASK_LEVEL_EXP = PREFIX["task_level"]


class Experiment(NamedTuple):
    """A parsed experiment name: its track, and its argument (TOFU split, unlearning language,
    speech setting; ``None`` for the shared ``xling`` / ``speech`` experiments and ``task_level``)."""

    track: str
    arg: str | None

    @property
    def name(self) -> str:
        return format_exp(self.track, self.arg)


def exp_pattern(*kinds: str) -> str:
    """The regex of experiment names of the given kinds (keys of :data:`EXP_PATTERNS`; none: all)."""
    unknown = [k for k in kinds if k not in EXP_PATTERNS]
    if unknown:
        raise KeyError(f"exp_pattern: unknown kind(s) {unknown}; known: {list(EXP_PATTERNS)}")
    return "|".join(EXP_PATTERNS[k] for k in (kinds or EXP_PATTERNS))


def parse_exp(exp: str) -> Experiment:
    """``'xling_hi_R'`` -> ``Experiment('crosslingual', 'hi_R')``; ValueError for a malformed name."""
    for kind, pattern in EXP_PATTERNS.items():
        if re.fullmatch(pattern, exp):
            track = _KIND_TRACK[kind]
            prefix = _KIND_PREFIX.get(kind, PREFIX[track])
            arg = exp[len(prefix) + 1 :] if "<" in kind else None
            return Experiment(track, arg)
    raise ValueError(f"experiment name {exp!r} matches none of {list(EXP_PATTERNS)}")


def format_exp(track: str, arg: str | None = None) -> str:
    """The inverse of :func:`parse_exp`; ValueError when the result would not parse back."""
    if track not in PREFIX:
        raise ValueError(f"unknown track {track!r}; known: {list(PREFIX)}")
    name = PREFIX[track] if arg is None else f"{PREFIX[track]}_{arg}"
    for kind, prefix in _KIND_PREFIX.items():  # e.g. ('tofu', 'h64_s0') -> 'size_h64_s0'
        if _KIND_TRACK[kind] == track and arg is not None and re.fullmatch(EXP_PATTERNS[kind], f"{prefix}_{arg}"):
            name = f"{prefix}_{arg}"
    try:
        parsed = parse_exp(name)
    except ValueError:
        parsed = None
    if parsed != (track, arg):
        raise ValueError(f"experiment name {name!r} does not parse back to ({track!r}, {arg!r})")
    return name


def tofu_exp(split: str) -> str:
    """``'forget10'`` -> ``'tofu_forget10'``."""
    return format_exp("tofu", split)


def xling_exp(lang: str | None = None) -> str:
    """``'hi_R'`` -> ``'xling_hi_R'`` (unlearning in that language); ``None`` -> the shared ``'xling'``."""
    return format_exp("crosslingual", lang)


def speech_exp(setting: str | None = None) -> str:
    """``'sample'`` -> ``'speech_sample'``; ``None`` -> the shared ``'speech'``."""
    return format_exp("speech", setting)


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
    """The experiment whose fine-tuned models ``exp`` unlearns from: TOFU experiments and ``task_level``
    own theirs; ``xling_<lang>`` uses the shared ``xling`` models, ``speech_<setting>`` ``speech``."""
    track, _ = parse_exp(exp)
    return PREFIX[track] if track in ("crosslingual", "speech") else exp


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
