"""Table specifications, value formatting and best / second ranking (see :mod:`qrerase.reports.tables`).

:class:`Column` (one metric column: direction higher / lower / closest to a target, format, ✓
threshold, group), :class:`TableSpec` (the columns, reference rows, labels, degenerate cells),
:func:`format_value`, :func:`ordered_rows` (validated numeric rows, reference rows first) and
:func:`rank_marks` (best / second per ranked column by :meth:`Column.distance`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from ..metrics.registry import direction_distance, metric
from ..registry import method_labels, tex_method_labels

__all__ = [
    "METHOD_LABELS",
    "TEX_METHOD_LABELS",
    "Column",
    "TableSpec",
    "tex_escape",
    "md_escape",
    "is_missing",
    "format_value",
    "ordered_rows",
    "rank_marks",
    "DEGENERATE_UTILITY_FRACTION",
    "degenerate_utility",
]

#: raw method key -> display name (Markdown, CSV ``display_label``, plots) of the built-in methods, from
#: :mod:`qrerase.registry` (:func:`~qrerase.registry.method_labels` also has the plug-ins' labels).
METHOD_LABELS: dict[str, str] = method_labels()

#: raw method key -> LaTeX label, as typeset in the paper (others are escaped display names).
TEX_METHOD_LABELS: dict[str, str] = tex_method_labels()


#: Below this fraction of the base model's utility (or not finite) a model is degenerate: no ✓, not
#: ranked, never the λ rule's pick (the paper's NPO keeps 0.37; GA and ``unlearn.scale: 1e6`` keep 0).
DEGENERATE_UTILITY_FRACTION = 0.25


def degenerate_utility(utility, base_utility) -> bool:
    """Whether ``utility`` collapsed: NaN (a model whose evaluation is not finite), infinite, or below
    :data:`DEGENERATE_UTILITY_FRACTION` × ``base_utility`` (when that is finite)."""
    u = float(utility)
    if not math.isfinite(u):
        return True
    b = float(base_utility)
    return math.isfinite(b) and u < DEGENERATE_UTILITY_FRACTION * b


@dataclass(frozen=True)
class Column:
    """One metric column.

    name: the DataFrame column. header: display header (plain text; LaTeX-escaped unless
    ``tex_header`` is given). higher_is_better: ranking direction, ``None`` = no ranking unless
    ``target`` is given. target: the ideal value of a closest-to-target column (an MIA AUC: 0.5,
    PrivLeak: 0), ranked by ``|x − target|`` (``higher_is_better`` must then be ``None``). The header
    gets an arrow ↑/↓, or ``(→ target)`` for a target column, unless ``arrow=False``. fmt:
    ``'{:.4f}'``-style pattern or ``'sci'``. check_threshold: mark values ``> check_threshold`` with a
    checkmark (TOFU Forget Quality: :data:`qrerase.metrics.log_metrics.FORGET_QUALITY_THRESHOLD`). group:
    spanning group header (consecutive columns with the same group share one); tex_group: its raw
    LaTeX text (default: the escaped ``group``), taken from the span's first column.
    :meth:`for_metric` builds a column from a registered metric (:mod:`qrerase.metrics.registry`).
    """

    name: str
    header: str
    higher_is_better: bool | None = True
    fmt: str = "{:.4f}"
    check_threshold: float | None = None
    group: str | None = None
    tex_header: str | None = None
    arrow: bool = True
    sci_threshold: float = 1e-3
    tex_group: str | None = None
    target: float | None = None

    def __post_init__(self):
        if self.target is not None:
            t = self.target
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise ValueError(f"table column {self.name!r}: target must be a finite number, got {t!r}")
            if self.higher_is_better is not None:
                raise ValueError(f"table column {self.name!r}: a target column has higher_is_better=None")
            object.__setattr__(self, "target", float(t))

    @property
    def direction(self) -> str | None:
        """``'higher'``, ``'lower'``, ``'target'`` (:data:`qrerase.metrics.registry.DIRECTIONS`) or
        ``None`` (not ranked)."""
        if self.target is not None:
            return "target"
        if self.higher_is_better is None:
            return None
        return "higher" if self.higher_is_better else "lower"

    def distance(self, x) -> float:
        """How far ``x`` is from the column's ideal (smaller is better;
        :func:`qrerase.metrics.registry.direction_distance`); ``+inf`` for a missing value."""
        if self.direction is None:
            raise ValueError(f"table column {self.name!r} is not ranked")
        return direction_distance(self.direction, x, self.target, where=f"table column {self.name!r}")

    @classmethod
    def for_metric(cls, metric_name: str, name: str | None = None, **kw) -> Column:
        """The column of a registered metric: ``name`` (default: the metric's) holds its values, the
        header is its label, the format, direction (and target) are its registry entry's; ``kw`` other
        fields (or overrides of header and fmt)."""
        m = metric(metric_name)
        kw.setdefault("header", m.label)
        kw.setdefault("fmt", m.fmt)
        if m.direction == "target":
            return cls(name or m.name, higher_is_better=None, target=m.target, **kw)
        return cls(name or m.name, higher_is_better=m.direction == "higher", **kw)


@dataclass(frozen=True)
class TableSpec:
    """Which columns to show and how.

    label_column: the DataFrame column naming the row (method key or label). label_header: its
    header. reference_rows: label-column values of reference rows (e.g. ``("base", "retain")``),
    shown first in this order, separated by a rule and excluded from ranking; those absent from the
    frame are skipped. labels / tex_labels: display-name maps (raw value -> shown text; unmapped
    values are shown as they are). missing: LaTeX text of a missing value. degenerate: column name →
    label-column values of the rows whose value in that column is degenerate (not ranked, no ✓,
    printed with ``(degenerate)``; see the module docstring).
    """

    columns: tuple[Column, ...]
    label_column: str = "method"
    label_header: str = "Method"
    reference_rows: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=method_labels)
    tex_labels: Mapping[str, str] = field(default_factory=tex_method_labels)
    missing: str = "---"
    md_missing: str = "—"
    degenerate: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "reference_rows", tuple(self.reference_rows))
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"table spec: duplicate column(s) {dup}")
        if self.label_column in names:
            raise ValueError(f"table spec: label column {self.label_column!r} is also a metric column")
        unknown = sorted(set(self.degenerate) - set(names))
        if unknown:
            raise ValueError(f"table spec: degenerate cells in unknown column(s) {unknown}")
        object.__setattr__(self, "degenerate", {k: tuple(v) for k, v in self.degenerate.items()})

    def is_degenerate(self, label, column: str) -> bool:
        """Whether row ``label``'s value in ``column`` is degenerate."""
        return label in self.degenerate.get(column, ())


# --------------------------------------------------------------------------------------------------
# formatting

_TEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex_escape(text: str) -> str:
    return "".join(_TEX_SPECIALS.get(ch, ch) for ch in str(text))


def md_escape(text: str) -> str:
    return str(text).replace("|", r"\|")


def is_missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def format_value(x, fmt: str, target: str = "md", sci_threshold: float = 1e-3) -> str:
    """Format one number for ``target`` ``'md'`` or ``'tex'`` (no marks; missing -> ``''``)."""
    if is_missing(x):
        return ""
    x = float(x)
    if fmt != "sci":
        return fmt.format(x)
    if x == 0.0:
        return "0"
    if not math.isfinite(x):
        return ("$\\infty$" if target == "tex" else "∞") if x > 0 else ("$-\\infty$" if target == "tex" else "-∞")
    if sci_threshold <= abs(x) < 1e4:
        return f"{x:.3g}"
    text = f"{x:.3e}"  # e.g. 1.433e-22
    if target == "tex":
        mant, exp = text.split("e")
        return f"${mant}{{\\times}}10^{{{int(exp)}}}$"
    return text


def _numeric(df: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    if spec.label_column not in df.columns:
        raise ValueError(f"table: label column {spec.label_column!r} not in the frame (columns {list(df.columns)})")
    missing = [c.name for c in spec.columns if c.name not in df.columns]
    if missing:
        raise ValueError(f"table: metric column(s) {missing} not in the frame (columns {list(df.columns)})")
    labels = df[spec.label_column].astype(str)
    dup = sorted(set(labels[labels.duplicated()]))
    if dup:
        raise ValueError(f"table: duplicate row label(s) {dup} in column {spec.label_column!r}")
    out = pd.DataFrame({spec.label_column: labels.to_numpy()})
    for c in spec.columns:
        try:
            out[c.name] = pd.to_numeric(df[c.name], errors="raise").astype("float64").to_numpy()
        except (ValueError, TypeError) as exc:
            raise ValueError(f"table: column {c.name!r} is not numeric ({exc})") from exc
    return out


def ordered_rows(df: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """Validated numeric copy of ``df``: reference rows first (spec order), then the rest (frame order)."""
    num = _numeric(df, spec)
    labels = list(num[spec.label_column])
    refs = [r for r in spec.reference_rows if r in labels]
    order = [labels.index(r) for r in refs] + [i for i, lab in enumerate(labels) if lab not in refs]
    num = num.iloc[order].reset_index(drop=True)
    num.insert(1, "reference", [1 if lab in refs else 0 for lab in num[spec.label_column]])
    return num


def _display(col: Column, x) -> str:
    return format_value(x, col.fmt, "md", col.sci_threshold)


def _tie_key(col: Column, x: float) -> str:
    """Ranking ties: a higher/lower column's printed value; a target column's printed distance to the
    target (0.45 and 0.55 tie around 0.5)."""
    if col.direction == "target":
        assert col.target is not None  # a target column has one (Column's check)
        return format_value(abs(x - col.target), col.fmt, "md", col.sci_threshold)
    return _display(col, x)


def rank_marks(rows: pd.DataFrame, spec: TableSpec) -> dict[str, list[str]]:
    """Per ranked column, a list (row order of ``rows``) of ``'best'``, ``'second'`` or ``''``.

    ``rows`` as returned by :func:`ordered_rows`. Best = smallest :meth:`Column.distance` (highest,
    lowest or closest to the target). Ties = identical printed values (target columns: identical
    printed distances to the target); the second mark goes to the next distinct one. A degenerate
    cell (``spec.degenerate``) is not ranked and marked ``'degenerate'``; reference rows and missing
    or non-finite values are not ranked. A column whose ranked rows all tie (one printed value, two or
    more rows) is left unmarked: a mark there would call every method best.
    """
    marks: dict[str, list[str]] = {}
    for col in spec.columns:
        if col.direction is None:
            continue
        m = [""] * len(rows)
        groups: dict[str, list[int]] = {}
        gdist: dict[str, float] = {}
        for i, (x, ref, label) in enumerate(zip(rows[col.name], rows["reference"], rows[spec.label_column])):
            if spec.is_degenerate(label, col.name):
                m[i] = "degenerate"
                continue
            if ref or is_missing(x) or not math.isfinite(x):
                continue
            key = _tie_key(col, x)
            groups.setdefault(key, []).append(i)
            gdist[key] = min(gdist.get(key, math.inf), col.distance(x))
        ranked = sorted(groups, key=lambda k: (gdist[k], k))
        if len(ranked) == 1 and len(groups[ranked[0]]) > 1:
            ranked = []
        for tag, key in zip(("best", "second"), ranked):
            for i in groups[key]:
                m[i] = tag
        marks[col.name] = m
    return marks
