"""The method and track registry: every unlearning method and experiment track, in one place.

Pure data (standard library only, no torch): the config schema's method and track enums
(:func:`qrerase.workflow.validation.load_schema`), the workflow's ``DECOMP`` and localised-method logic
(``rules/common.smk``), the table labels (:data:`qrerase.reports.tables.METHOD_LABELS`) and each
track's target function (``all_targets`` in ``rules/common.smk``) are all derived from it.

Adding a method: one :class:`Method` entry below (plus its implementation and, for a baseline, its
config section in ``schemas/config.schema.yaml``); README "Adding a method / adding a track".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Method",
    "Track",
    "METHODS",
    "TRACKS",
    "DECOMPOSITIONS",
    "DECOMP",
    "SUBSPACE_METHODS",
    "REFERENCE_LABELS",
    "RANK_PAIRS",
    "CONTROL_SUFFIX",
    "method",
    "methods_for",
    "baselines_for",
    "is_localised",
    "global_method",
    "method_labels",
    "tex_method_labels",
]


@dataclass(frozen=True)
class Method:
    """One unlearning method.

    name: the config and path name. decomp: ``'svd'`` (UNLEARN) or ``'cpqr'`` (QR-Erase) for a
    closed-form subspace method (eqs. 1-6), ``None`` for an optimisation baseline. localised: the
    edit touches only the layers selected by task energy (eqs. 14-16, the ``(LL)`` variants).
    label / tex_label: the table row label (Markdown, CSV, plots) and the LaTeX one (``None``: the
    escaped ``label``). tracks: the tracks whose ``methods.<track>`` may list it.
    """

    name: str
    decomp: str | None
    localised: bool
    label: str
    tex_label: str | None
    tracks: tuple[str, ...]

    @property
    def subspace(self) -> bool:
        return self.decomp is not None


@dataclass(frozen=True)
class Track:
    """One experiment track: its config name, its rules file, the file of its constants and input
    functions (``rules/<track>_common.smk``: the Snakemake linter keeps functions out of rules files),
    and the name of the function there that lists its default targets (``all_targets``)."""

    name: str
    rules: str
    functions: str
    targets: str


_ALL = ("tofu", "crosslingual", "speech", "task_level")
_TEXT = ("tofu", "crosslingual")

#: Every method, in table order: the subspace methods, then the baselines of each track.
METHODS: tuple[Method, ...] = (
    Method("unlearn", "svd", False, "UNLEARN", r"\textsc{UNLEARN}", _ALL),
    Method("unlearn_ll", "svd", True, "UNLEARN (LL)", r"\textsc{UNLEARN (LL)}", _ALL),
    Method("qr_erase", "cpqr", False, "QR-Erase", r"\textsc{QR-Erase}", _ALL),
    Method("qr_erase_ll", "cpqr", True, "QR-Erase (LL)", r"\textsc{QR-Erase} (LL)", _ALL),
    Method("ga", None, False, "Gradient Ascent", None, _ALL),
    Method("graddiff", None, False, "Gradient Difference", None, _TEXT),
    Method("kl", None, False, "KL Minimization", None, _TEXT),
    Method("npo", None, False, "NPO", None, _TEXT),
    Method("dpo", None, False, "DPO", None, _TEXT),
    Method("flat", None, False, "FLAT", None, _TEXT),
    Method("scrub", None, False, "SCRUB", None, ("speech",)),
    Method("bad_teaching", None, False, "Bad Teaching", None, ("speech",)),
    Method("kga", None, False, "KGA", None, ("task_level",)),
    Method("ku", None, False, "KU", None, ("task_level",)),
)

#: Every track, in config order.
TRACKS: dict[str, Track] = {
    t.name: t
    for t in (
        Track("tofu", "rules/tables.smk", "rules/tofu_common.smk", "tofu_targets"),
        Track("crosslingual", "rules/crosslingual.smk", "rules/crosslingual_common.smk", "crosslingual_targets"),
        Track("speech", "rules/speech.smk", "rules/speech_common.smk", "speech_targets"),
        Track("task_level", "rules/task_level.smk", "rules/task_level_common.smk", "task_level_targets"),
    )
}

#: The decompositions, in report order: column-pivoted QR (QR-Erase) and SVD (UNLEARN).
DECOMPOSITIONS: tuple[str, ...] = ("cpqr", "svd")
#: subspace method -> its decomposition.
DECOMP: dict[str, str] = {m.name: m.decomp for m in METHODS if m.decomp is not None}
SUBSPACE_METHODS: tuple[str, ...] = tuple(DECOMP)
#: '<method>_control': the same edit built with the adapters' roles swapped (selectivity control).
CONTROL_SUFFIX = "_control"
#: Rows that are no method: the fine-tuned model and the retain-only reference.
REFERENCE_LABELS: dict[str, str] = {"base": "Base Model", "retain": "Retain reference"}

_BY_NAME = {m.name: m for m in METHODS}


def method(name: str) -> Method:
    """The registry entry of a method name (KeyError for an unknown one)."""
    return _BY_NAME[name]


def methods_for(track: str) -> list[str]:
    """The method names a track's ``methods.<track>`` may list, in registry order."""
    if track not in TRACKS:
        raise KeyError(f"unknown track {track!r}")
    return [m.name for m in METHODS if track in m.tracks]


def baselines_for(track: str) -> list[str]:
    """A track's optimisation baselines (its methods without a decomposition)."""
    return [m for m in methods_for(track) if _BY_NAME[m].decomp is None]


def is_localised(name: str) -> bool:
    """True for a layer-localised subspace method (or its control): eq. 16 on the selected layers."""
    return _BY_NAME[name.removesuffix(CONTROL_SUFFIX)].localised


def global_method(decomp: str) -> str:
    """The all-layer subspace method of a decomposition: 'cpqr' -> 'qr_erase', 'svd' -> 'unlearn'."""
    (name,) = [m.name for m in METHODS if m.decomp == decomp and not m.localised]
    return name


#: (decomposition, its all-layer method) in report order: the rank sweep's two curves (speech track).
RANK_PAIRS: tuple[tuple[str, str], ...] = tuple((d, global_method(d)) for d in DECOMPOSITIONS)


def method_labels() -> dict[str, str]:
    """Raw key -> display label: every method, the reference rows, each subspace method's control."""
    labels = {m.name: m.label for m in METHODS if m.subspace}
    labels.update(REFERENCE_LABELS)
    labels.update({m.name: m.label for m in METHODS if not m.subspace})
    labels.update({f"{m.name}{CONTROL_SUFFIX}": f"{m.label}, retain-adapter control" for m in METHODS if m.subspace})
    return labels


def tex_method_labels() -> dict[str, str]:
    """Raw key -> LaTeX label, for the methods typeset specially in the paper (others: escaped label)."""
    return {m.name: m.tex_label for m in METHODS if m.tex_label is not None}
