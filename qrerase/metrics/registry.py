"""The metric registry: every evaluation metric, with its direction, tracks, inputs and implementation.

A metric is registered once (:func:`register_metric`, duplicate names rejected) with its table label,
its **direction** (``higher`` or ``lower`` is better, or ``target``: closest to a target value is
best, e.g. an MIA AUC closest to 0.5 or PrivLeak closest to 0), the tracks it applies to, what it needs
(:data:`NEEDS`: evaluation sets and reference models), how its per-sequence statistic is aggregated
(:data:`AGGREGATES`), its function, its table format and whether the track's headline table shows it
(``headline``; every metric of a track is a column of the track's metrics table).
:func:`distance_to_ideal` turns a value into "how far from the best possible", so a table can mark
the best row for any direction (:func:`best_of`).

Standard library only: functions are ``"module:attribute"`` strings imported on first use
(:func:`metric_function`), like :mod:`qrerase.registry`, so planning code never imports torch. The
built-in metrics (:mod:`qrerase.metrics.mia`, :mod:`qrerase.metrics.privleak`,
:mod:`qrerase.metrics.memorisation`) are registered at the end of this module; a plug-in module (config
key ``plugins``, imported at planning time and by every job, :func:`qrerase.workflow.job.job`) may
register more (docs/extending.md, "Adding a metric").
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..registry import TRACKS

__all__ = [
    "Metric",
    "MetricError",
    "evaluating_tracks",
    "DIRECTIONS",
    "NEEDS",
    "AGGREGATES",
    "register_metric",
    "metric",
    "metric_names",
    "metrics_for",
    "headline_metrics",
    "metric_function",
    "distance_to_ideal",
    "direction_distance",
    "best_of",
    "MIA_ATTACKS",
]

Impl = str | Callable[..., Any]


class MetricError(ValueError):
    """A bad metric registration, an unknown metric or a bad value: the message is one line naming it."""


def evaluating_tracks() -> list[str]:
    """The tracks whose evaluation jobs compute the registered metrics (:attr:`qrerase.tracks.Track.metrics`:
    rule ``evaluate``, :func:`qrerase.metrics.scoring.track_sequence_metrics`; rule ``speech_evaluate``,
    :func:`qrerase.tracks.speech.privacy.attack_metrics`), in registration order."""
    return [t.name for t in TRACKS.values() if t.metrics]


#: Directions: which value is best.
DIRECTIONS: dict[str, str] = {
    "higher": "higher is better",
    "lower": "lower is better",
    "target": "closest to the metric's target value is best",
}
#: What a metric may need to be computed: evaluation sets (of the evaluated model) and reference models.
NEEDS: dict[str, str] = {
    "forget": "the forget set (members: the fine-tuned model was trained on it)",
    "holdout": "the holdout set (non-members from the forget set's distribution; TOFU holdoutXX)",
    "retain_reference": "the same metric of the retain-only reference model (trained without the forget set)",
}
#: How the per-sequence statistic of a metric becomes one number per model.
AGGREGATES: dict[str, str] = {
    "auc": "ROC AUC of the per-sequence score, forget members (label 1) vs holdout non-members (label 0)",
    "mean": "mean of the per-sequence value over the forget set",
    "relative": "a function of the metric named by `of`: (value of the model, value of the retain reference)",
}


@dataclass(frozen=True)
class Metric:
    """One metric.

    name: the key in evaluation outputs and tables. label: the table header. direction: a key of
    :data:`DIRECTIONS`; target: the ideal value of a ``target`` metric (``None`` otherwise). tracks:
    the tracks (:data:`qrerase.registry.TRACKS`) it applies to. needs: keys of :data:`NEEDS`.
    aggregate: a key of :data:`AGGREGATES`. fn: for ``auc`` / ``mean`` the per-sequence function, for
    ``relative`` the function of (model value, reference value); a callable or ``"module:attribute"``.
    of: the metric a ``relative`` one is computed from. description: one line for docs and tables.
    fmt: the ``'{:.4f}'``-style format (or ``'sci'``) of its table cells. headline: its position among the privacy
    columns of the track's headline table (smaller first, ties in registry order; ``None``: only in
    the track's metrics table, e.g. ``tofu_mia``). track_fns: ``(track, function)`` pairs, the
    per-example function on a track whose models are not language models (the speech track's
    classifier: ``f(logits (N, C) float64, labels (N,) int) -> (N,) float64``, a member-oriented score
    for ``auc``); ``fn`` elsewhere (:func:`metric_function`).
    """

    name: str
    label: str
    direction: str
    target: float | None
    tracks: tuple[str, ...]
    needs: tuple[str, ...]
    aggregate: str
    fn: Impl
    of: str | None = None
    description: str = ""
    fmt: str = "{:.4f}"
    headline: int | None = None
    track_fns: tuple[tuple[str, Impl], ...] = ()


_METRICS: dict[str, Metric] = {}


def register_metric(
    name: str,
    *,
    label: str,
    direction: str,
    tracks: Iterable[str],
    needs: Iterable[str],
    aggregate: str,
    fn: Impl,
    target: float | None = None,
    of: str | None = None,
    description: str = "",
    fmt: str = "{:.4f}",
    headline: int | None = None,
    track_fns: Mapping[str, Impl] | None = None,
) -> Metric:
    """Register one metric (table order: registration order) and return its record.

    Rejected with a :class:`MetricError` (one line naming it): a name already registered or not an
    identifier, an unknown direction / track / need / aggregate, a ``target`` metric without a finite
    target (or another direction with one), a ``relative`` metric whose ``of`` is not registered, or
    ``of`` given to another aggregate, a ``fmt`` that does not format a float, a ``headline`` that
    is not a non-negative int, a ``track_fns`` key not among its tracks or a value that is no function.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise MetricError(f"metric name {name!r}: expected an identifier")
    if name in _METRICS:
        raise MetricError(f"metric {name!r} is already registered (label {_METRICS[name].label!r})")
    if direction not in DIRECTIONS:
        raise MetricError(f"metric {name!r}: direction must be one of {list(DIRECTIONS)}, got {direction!r}")
    if direction == "target":
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
            raise MetricError(f"metric {name!r}: direction 'target' needs a finite target value, got {target!r}")
        target = float(target)
    elif target is not None:
        raise MetricError(f"metric {name!r}: a target value ({target!r}) needs direction 'target', not {direction!r}")
    tracks = tuple(tracks)
    if not tracks or (bad := [t for t in tracks if t not in TRACKS]):
        raise MetricError(f"metric {name!r}: tracks must be among {list(TRACKS)}, got {list(tracks)}")
    if bad := [t for t in tracks if not TRACKS[t].metrics]:
        raise MetricError(
            f"metric {name!r}: track(s) {bad} compute no registered metric (their evaluations compute their own "
            f"measures); registered metrics apply to {evaluating_tracks()}"
        )
    needs = tuple(needs)
    if bad := [n for n in needs if n not in NEEDS]:
        raise MetricError(f"metric {name!r}: unknown need(s) {bad}; expected among {list(NEEDS)}")
    if aggregate not in AGGREGATES:
        raise MetricError(f"metric {name!r}: aggregate must be one of {list(AGGREGATES)}, got {aggregate!r}")
    if (aggregate == "relative") != (of is not None):
        raise MetricError(f"metric {name!r}: `of` is given exactly for the 'relative' aggregate (got of={of!r})")
    if of is not None and of not in _METRICS:
        raise MetricError(f"metric {name!r}: `of` names an unregistered metric {of!r}")
    if not (callable(fn) or (isinstance(fn, str) and fn.count(":") == 1)):
        raise MetricError(f"metric {name!r}: fn must be a callable or a 'module:attribute' string, got {fn!r}")
    try:
        ok = fmt == "sci" or (isinstance(fmt, str) and isinstance(fmt.format(0.5), str))
    except (ValueError, IndexError, KeyError):
        ok = False
    if not ok:
        raise MetricError(f"metric {name!r}: fmt must format one float (e.g. '{{:.4f}}', or 'sci'), got {fmt!r}")
    if headline is not None and (isinstance(headline, bool) or not isinstance(headline, int) or headline < 0):
        raise MetricError(f"metric {name!r}: headline must be a non-negative int or None, got {headline!r}")
    track_fns = dict(track_fns or {})
    if bad := [t for t in track_fns if t not in tracks]:
        raise MetricError(f"metric {name!r}: track_fns names track(s) {bad} not among its tracks {list(tracks)}")
    for t, f in track_fns.items():
        if not (callable(f) or (isinstance(f, str) and f.count(":") == 1)):
            raise MetricError(f"metric {name!r}: track_fns[{t!r}] must be a callable or a 'module:attribute' string")
    m = Metric(
        name,
        str(label),
        direction,
        target,
        tracks,
        needs,
        aggregate,
        fn,
        of,
        str(description),
        fmt,
        headline,
        tuple(track_fns.items()),
    )
    _METRICS[name] = m
    return m


def metric(name: str) -> Metric:
    """The registry entry of a metric name; :class:`MetricError` for an unknown one."""
    try:
        return _METRICS[name]
    except KeyError:
        raise MetricError(f"unknown metric {name!r}; registered: {list(_METRICS)}") from None


def metric_names() -> tuple[str, ...]:
    """Every registered metric name, in registry order."""
    return tuple(_METRICS)


def metrics_for(track: str, aggregate: str | None = None) -> list[str]:
    """The metrics of a track (optionally only those of one aggregate), in registry order."""
    if track not in TRACKS:
        raise MetricError(f"unknown track {track!r}; expected among {list(TRACKS)}")
    if aggregate is not None and aggregate not in AGGREGATES:
        raise MetricError(f"unknown aggregate {aggregate!r}; expected among {list(AGGREGATES)}")
    return [m.name for m in _METRICS.values() if track in m.tracks and aggregate in (None, m.aggregate)]


def headline_metrics(track: str) -> list[str]:
    """The metrics of a track's headline table (registered with ``headline``), by ``headline`` then
    registry order (TOFU: PrivLeak, then the Min-K%++ AUC)."""
    names = [n for n in metrics_for(track) if _METRICS[n].headline is not None]
    return sorted(names, key=lambda n: _METRICS[n].headline)  # stable: ties keep registry order


def metric_function(name: str, track: str | None = None) -> Callable[..., Any]:
    """The function of metric ``name`` on ``track`` (its ``track_fns`` entry, else ``fn``; a
    ``"module:attribute"`` string is imported now)."""
    fn = dict(metric(name).track_fns).get(track, metric(name).fn)
    if callable(fn):
        return fn
    module, _, attr = fn.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise MetricError(f"metric {name!r}: function {fn!r} cannot be loaded ({exc})") from None


def distance_to_ideal(name: str | Metric, value: float) -> float:
    """How far ``value`` is from the best possible value of the metric: smaller is better, any direction.

    ``higher``: ``-value``; ``lower``: ``value``; ``target``: ``|value - target|``. A non-finite value
    (a missing entry, NaN) is ``+inf`` (never the best). Only differences between values of the same
    metric are meaningful (the ``higher`` / ``lower`` distances are not shifted to be >= 0).
    """
    m = name if isinstance(name, Metric) else metric(name)
    return direction_distance(m.direction, value, m.target, where=f"metric {m.name!r}")


def direction_distance(direction: str, value: float, target: float | None = None, where: str = "value") -> float:
    """:func:`distance_to_ideal` for a bare direction (a table column that is no registered metric).

    ``direction`` a key of :data:`DIRECTIONS`; ``target`` the ideal value, given exactly for
    ``'target'``. ``higher``: ``-value``; ``lower``: ``value``; ``target``: ``|value - target|``;
    a non-finite value is ``+inf``. :class:`MetricError` (one line naming ``where``) otherwise.
    """
    if direction not in DIRECTIONS:
        raise MetricError(f"{where}: direction must be one of {list(DIRECTIONS)}, got {direction!r}")
    if (direction == "target") != (target is not None):
        raise MetricError(f"{where}: a target value is given exactly for direction 'target' (got {target!r})")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise MetricError(f"{where}: value {value!r} is not a number") from None
    if not math.isfinite(x):
        return math.inf
    if direction == "higher":
        return -x
    if direction == "lower":
        return x
    return abs(x - float(target))


def best_of(name: str | Metric, values: Mapping[str, float], rel_tol: float = 0.0) -> list[str]:
    """The keys of ``values`` (row -> value) whose value is best for the metric (ties: all, in input order).

    Best = smallest :func:`distance_to_ideal`; within ``rel_tol`` (relative to the best distance's
    magnitude, absolute when that is 0) counts as a tie. No finite value: an empty list.
    """
    d = {k: distance_to_ideal(name, v) for k, v in values.items()}
    finite = [x for x in d.values() if math.isfinite(x)]
    if not finite:
        return []
    lo = min(finite)
    tol = rel_tol * (abs(lo) if lo else 1.0)
    return [k for k, x in d.items() if math.isfinite(x) and x <= lo + tol]


# ---------------------------------------------------------------------------------------------------
# The built-in metrics.
# ---------------------------------------------------------------------------------------------------
_MIA = "qrerase.metrics.mia"
_MEM = "qrerase.metrics.memorisation"
_MIA_NEEDS = ("forget", "holdout")
#: the tracks whose language models the shared evaluation rule scores (Track.metrics and Track.language_model)
_TEXT = tuple(t.name for t in TRACKS.values() if t.metrics and t.language_model)

#: MIA attack -> (label, per-sequence score function); the registered metric is ``mia_<attack>``.
MIA_ATTACKS: dict[str, tuple[str, str]] = {
    "loss": ("MIA AUC (LOSS)", f"{_MIA}:loss_score"),
    "zlib": ("MIA AUC (ZLib)", f"{_MIA}:zlib_score"),
    "min_k": ("MIA AUC (Min-K%)", f"{_MIA}:min_k_score"),
    "min_k_plus_plus": ("MIA AUC (Min-K%++)", f"{_MIA}:min_k_plus_plus_score"),
}
for _attack, (_label, _fn) in MIA_ATTACKS.items():
    # a track whose models score an attack their own way supplies the function (Track.metric_fns)
    _own = {t.name: t.metric_fns[f"mia_{_attack}"] for t in TRACKS.values() if f"mia_{_attack}" in t.metric_fns}
    register_metric(
        f"mia_{_attack}",
        label=_label,
        direction="target",
        target=0.5,
        tracks=(*_TEXT, *_own),
        needs=_MIA_NEEDS,
        aggregate="auc",
        fn=_fn,
        description=f"{_attack} membership-inference AUC, forget vs holdout (0.5: indistinguishable)",
        headline=1 if _attack == "min_k_plus_plus" else None,  # the TOFU tables' default attack
        track_fns=_own or None,
    )
register_metric(
    "privleak",
    label="PrivLeak",
    direction="target",
    target=0.0,
    tracks=_TEXT,
    needs=(*_MIA_NEEDS, "retain_reference"),
    aggregate="relative",
    of="mia_min_k",
    fn="qrerase.metrics.privleak:privleak",
    fmt="{:.2f}",
    headline=0,
    description="MUSE PrivLeak of the Min-K% AUC relative to the retain reference's (0: like the retain model)",
)
register_metric(
    "extraction_strength",
    label="Extraction Strength",
    direction="lower",
    tracks=_TEXT,
    needs=("forget",),
    aggregate="mean",
    fn=f"{_MEM}:extraction_strength",
    description="1 - (shortest teacher-forced prefix after which argmax reproduces the rest) / answer length",
)
register_metric(
    "exact_memorisation",
    label="Exact Memorisation",
    direction="lower",
    tracks=_TEXT,
    needs=("forget",),
    aggregate="mean",
    fn=f"{_MEM}:exact_memorisation",
    description="fraction of answer tokens the teacher-forced argmax reproduces",
)
