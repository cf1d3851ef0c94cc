"""Paper-layout result tables (CSV + Markdown + LaTeX), shared by all tracks.

The tables of each track are built in :mod:`qrerase.reports.tofu`, :mod:`qrerase.reports.task_level`,
:mod:`qrerase.reports.crosslingual`, :mod:`qrerase.reports.speech` and :mod:`qrerase.reports.cost`;
this module renders and writes them.

A table is a pandas DataFrame with one row per model/method (a label column, by default
``method``) and numeric metric columns, plus a :class:`TableSpec` saying which columns to show and
how. :func:`write_table` writes three files, each atomically, byte-identical for the same input:

CSV (raw numbers)
    Columns, in this order: the label column (raw keys as given), ``display_label`` (the shown
    label), ``reference`` (1 for reference rows, 0 otherwise), then every spec column at full
    precision (shortest round-trip ``repr`` of the float; empty when missing), then one
    ``<column>_mark`` per ranked column holding ``best``, ``second``, ``degenerate`` (see below) or an
    empty string. Rows in the displayed order (reference rows first).
Markdown
    A GitHub table. Best per column is ``**x**``, second best ``<u>x</u>``; a ✓ follows a value
    that passes its ``check_threshold`` (not a degenerate cell's). With column groups, the header
    row holds the group names (in the first column of each span) and the column headers follow as
    the first, bold, row.
LaTeX
    A ``table`` (or ``table*``) float with a booktabs ``tabular`` (needs ``booktabs``; checkmarks
    need ``amssymb``). Best ``\\textbf{x}``, second ``\\underline{x}``, passing values get
    ``$^{\\checkmark}$``. Reference rows come first, followed by a ``\\midrule``. Column groups render
    as ``\\multicolumn{n}{c}{\\textbf{Group}}`` with ``\\cmidrule(lr){a-b}`` below.

Degenerate cells (``TableSpec.degenerate``: a model whose utility collapsed, :func:`degenerate_utility`)
are not ranked and get no ✓; Markdown and LaTeX print ``(degenerate)`` after the value, the CSV mark
is ``degenerate``.

Ranking: per column, among the non-reference, non-degenerate rows with a finite value, in the column's direction
(``higher_is_better``; ``None`` = not ranked). Values that print identically (same formatted text)
are ties and are all marked; the second-best mark goes to the next distinct printed value.

Value formats: a ``str.format`` pattern such as ``'{:.4f}'``, or ``'sci'`` (for p-values):
values with ``sci_threshold <= |x| < 1e4`` print with 3 significant digits (``0.257``,
``0.0291``), smaller ones as ``1.433e-22`` in Markdown and ``$1.433{\\times}10^{-22}$`` in LaTeX;
0 prints as ``0``. Missing values (NaN/None) print as ``---`` (LaTeX) / ``—`` (Markdown).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from ..io import atomic_path, write_text
from ..registry import method_labels, tex_method_labels

__all__ = [
    "METHOD_LABELS",
    "TEX_METHOD_LABELS",
    "Column",
    "TableSpec",
    "format_value",
    "rank_marks",
    "ordered_rows",
    "render_markdown",
    "render_latex",
    "table_csv_frame",
    "write_table",
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
    ``tex_header`` is given). higher_is_better: ranking direction, ``None`` = no ranking (an arrow
    ↑/↓ is appended to the header unless ``arrow=False``). fmt: ``'{:.4f}'``-style pattern or
    ``'sci'``. check_threshold: mark values ``> check_threshold`` with a checkmark (TOFU Forget
    Quality: 0.1). group: spanning group header (consecutive columns with the same group share one);
    tex_group: its raw LaTeX text (default: the escaped ``group``), taken from the span's first column.
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


def _md_escape(text: str) -> str:
    return str(text).replace("|", r"\|")


def _is_missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def format_value(x, fmt: str, target: str = "md", sci_threshold: float = 1e-3) -> str:
    """Format one number for ``target`` ``'md'`` or ``'tex'`` (no marks; missing -> ``''``)."""
    if _is_missing(x):
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


def rank_marks(rows: pd.DataFrame, spec: TableSpec) -> dict[str, list[str]]:
    """Per ranked column, a list (row order of ``rows``) of ``'best'``, ``'second'`` or ``''``.

    ``rows`` as returned by :func:`ordered_rows`. Ties = identical printed values. A degenerate cell
    (``spec.degenerate``) is not ranked and marked ``'degenerate'``.
    """
    marks: dict[str, list[str]] = {}
    for col in spec.columns:
        if col.higher_is_better is None:
            continue
        m = [""] * len(rows)
        groups: dict[str, list[int]] = {}
        gval: dict[str, float] = {}
        for i, (x, ref, label) in enumerate(zip(rows[col.name], rows["reference"], rows[spec.label_column])):
            if spec.is_degenerate(label, col.name):
                m[i] = "degenerate"
                continue
            if ref or _is_missing(x) or not math.isfinite(x):
                continue
            key = _display(col, x)
            groups.setdefault(key, []).append(i)
            gval[key] = max(gval.get(key, -math.inf), x) if col.higher_is_better else min(gval.get(key, math.inf), x)
        ranked = sorted(groups, key=lambda k: (-gval[k] if col.higher_is_better else gval[k], k))
        for tag, key in zip(("best", "second"), ranked):
            for i in groups[key]:
                m[i] = tag
        marks[col.name] = m
    return marks


def _cell(col: Column, x, mark: str, target: str, spec: TableSpec, degenerate: bool = False) -> str:
    if _is_missing(x):
        return spec.missing if target == "tex" else spec.md_missing
    text = format_value(x, col.fmt, target, col.sci_threshold)
    if degenerate:
        return f"{text} (degenerate)"
    if mark == "best":
        text = f"\\textbf{{{text}}}" if target == "tex" else f"**{text}**"
    elif mark == "second":
        text = f"\\underline{{{text}}}" if target == "tex" else f"<u>{text}</u>"
    if col.check_threshold is not None and float(x) > col.check_threshold:
        text += "$^{\\checkmark}$" if target == "tex" else " ✓"
    return text


def _label(raw: str, spec: TableSpec, target: str) -> str:
    if target == "tex":
        if raw in spec.tex_labels:
            return spec.tex_labels[raw]
        return tex_escape(spec.labels.get(raw, raw))
    return _md_escape(spec.labels.get(raw, raw))


def _header(col: Column, target: str, bold: bool) -> str:
    if target == "tex":
        text = col.tex_header if col.tex_header is not None else tex_escape(col.header)
        if bold:
            text = f"\\textbf{{{text}}}"
        if col.arrow and col.higher_is_better is not None:
            text += " $\\uparrow$" if col.higher_is_better else " $\\downarrow$"
        return text
    text = _md_escape(col.header)
    if col.arrow and col.higher_is_better is not None:
        text += " ↑" if col.higher_is_better else " ↓"
    return f"**{text}**" if bold else text


def _spans(spec: TableSpec) -> list[tuple[str | None, int, int]]:
    """Consecutive runs of equal group: (group, first column index, last column index), 0-based."""
    spans: list[tuple[str | None, int, int]] = []
    for j, col in enumerate(spec.columns):
        if spans and spans[-1][0] == col.group and col.group is not None:
            g, a, _ = spans[-1]
            spans[-1] = (g, a, j)
        else:
            spans.append((col.group, j, j))
    return spans


def render_markdown(df: pd.DataFrame, spec: TableSpec) -> str:
    rows = ordered_rows(df, spec)
    marks = rank_marks(rows, spec)
    grouped = any(c.group is not None for c in spec.columns)
    ncol = len(spec.columns) + 1
    lines = []
    if grouped:
        head = [""] + [""] * len(spec.columns)
        for g, a, _ in _spans(spec):
            if g is not None:
                head[a + 1] = f"**{_md_escape(g)}**"
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join([":---"] + [":---:"] * (ncol - 1)) + "|")
        sub = [f"**{_md_escape(spec.label_header)}**"] + [_header(c, "md", bold=True) for c in spec.columns]
        lines.append("| " + " | ".join(sub) + " |")
    else:
        head = [f"**{_md_escape(spec.label_header)}**"] + [_header(c, "md", bold=True) for c in spec.columns]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join([":---"] + [":---:"] * (ncol - 1)) + "|")
    for i in range(len(rows)):
        cells = [_label(rows[spec.label_column].iloc[i], spec, "md")]
        for col in spec.columns:
            label = rows[spec.label_column].iloc[i]
            mark = marks.get(col.name, [""] * len(rows))[i]
            degenerate = spec.is_degenerate(label, col.name)
            cells.append(_cell(col, rows[col.name].iloc[i], mark, "md", spec, degenerate))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_latex(
    df: pd.DataFrame,
    spec: TableSpec,
    caption: str | None = None,
    label: str | None = None,
    environment: str = "table",
    placement: str = "t",
) -> str:
    """A complete LaTeX float (``environment`` ``table`` or ``table*``); ``caption`` is raw LaTeX."""
    rows = ordered_rows(df, spec)
    marks = rank_marks(rows, spec)
    grouped = any(c.group is not None for c in spec.columns)
    spans = _spans(spec)
    colspec = "l" + " ".join("c" * (b - a + 1) for _, a, b in spans) if grouped else "l" + "c" * len(spec.columns)
    out = [f"\\begin{{{environment}}}[{placement}]", "\\centering"]
    if caption is not None:
        out.append(f"\\caption{{{caption}}}")
    if label is not None:
        out.append(f"\\label{{{label}}}")
    out.append(f"\\begin{{tabular}}{{{colspec}}}")
    out.append("\\toprule")
    if grouped:
        head = [""]
        rules = []
        for g, a, b in spans:
            n = b - a + 1
            if g is None:
                head.extend([""] * n)
            else:
                gtex = spec.columns[a].tex_group if spec.columns[a].tex_group is not None else tex_escape(g)
                head.append(f"\\multicolumn{{{n}}}{{c}}{{\\textbf{{{gtex}}}}}")
                rules.append(f"\\cmidrule(lr){{{a + 2}-{b + 2}}}")
        out.append(" & ".join(head) + " \\\\")
        if rules:
            out.append("".join(rules))
        sub = [f"\\textbf{{{tex_escape(spec.label_header)}}}"] + [_header(c, "tex", bold=False) for c in spec.columns]
        out.append(" & ".join(sub) + " \\\\")
    else:
        head = [f"\\textbf{{{tex_escape(spec.label_header)}}}"] + [_header(c, "tex", bold=True) for c in spec.columns]
        out.append(" & ".join(head) + " \\\\")
    out.append("\\midrule")
    nref = int(rows["reference"].sum())
    for i in range(len(rows)):
        if i == nref and nref > 0 and nref < len(rows):
            out.append("\\midrule")
        cells = [_label(rows[spec.label_column].iloc[i], spec, "tex")]
        for col in spec.columns:
            label = rows[spec.label_column].iloc[i]
            mark = marks.get(col.name, [""] * len(rows))[i]
            degenerate = spec.is_degenerate(label, col.name)
            cells.append(_cell(col, rows[col.name].iloc[i], mark, "tex", spec, degenerate))
        out.append(" & ".join(cells) + " \\\\")
    out.append("\\bottomrule")
    out.append("\\end{tabular}")
    out.append(f"\\end{{{environment}}}")
    return "\n".join(out) + "\n"


def table_csv_frame(df: pd.DataFrame, spec: TableSpec) -> pd.DataFrame:
    """The CSV content: label column, ``display_label``, ``reference``, raw metrics, ``<col>_mark``."""
    rows = ordered_rows(df, spec)
    marks = rank_marks(rows, spec)
    out = pd.DataFrame({spec.label_column: rows[spec.label_column]})
    out["display_label"] = [spec.labels.get(x, x) for x in rows[spec.label_column]]
    out["reference"] = rows["reference"].astype("int64")
    for col in spec.columns:
        out[col.name] = rows[col.name]
    for col in spec.columns:
        if col.name in marks:
            out[f"{col.name}_mark"] = marks[col.name]
    return out


def write_table(
    df: pd.DataFrame,
    spec: TableSpec,
    out_csv: str | os.PathLike | None,
    out_md: str | os.PathLike | None,
    out_tex: str | os.PathLike | None,
    caption: str | None = None,
    label: str | None = None,
    environment: str = "table",
) -> None:
    """Write the table as CSV (raw numbers), Markdown and LaTeX; any output given as ``None`` is skipped.

    ``caption`` and ``label`` (raw LaTeX) go into the LaTeX float only; the Markdown file holds just
    the table. ``environment`` is ``"table"`` or ``"table*"``. All outputs are rendered before any is
    written, so bad input writes nothing. See the module docstring for the three formats.
    """
    csv_frame = table_csv_frame(df, spec)
    md = render_markdown(df, spec)
    tex = render_latex(df, spec, caption=caption, label=label, environment=environment)
    if out_csv is not None:
        with atomic_path(out_csv) as tmp:
            # float_format=None: pandas writes repr(float), the shortest round-trip text.
            csv_frame.to_csv(tmp, index=False, lineterminator="\n", na_rep="")
    if out_md is not None:
        write_text(out_md, md)
    if out_tex is not None:
        write_text(out_tex, tex)
