"""Markdown and LaTeX rendering of a table (formats: :mod:`qrerase.reports.tables`)."""

from __future__ import annotations

import pandas as pd

from .table_spec import Column, TableSpec, format_value, is_missing, md_escape, ordered_rows, rank_marks, tex_escape

__all__ = ["render_markdown", "render_latex"]


def _cell(col: Column, x, mark: str, target: str, spec: TableSpec, degenerate: bool = False) -> str:
    if is_missing(x):
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
    return md_escape(spec.labels.get(raw, raw))


def _header(col: Column, target: str, bold: bool) -> str:
    if target == "tex":
        text = col.tex_header if col.tex_header is not None else tex_escape(col.header)
        if bold:
            text = f"\\textbf{{{text}}}"
        if col.arrow and col.direction == "target":
            text += f" ($\\to {col.target:g}$)"
        elif col.arrow and col.direction is not None:
            text += " $\\uparrow$" if col.higher_is_better else " $\\downarrow$"
        return text
    text = md_escape(col.header)
    if col.arrow and col.direction == "target":
        text += f" (→ {col.target:g})"
    elif col.arrow and col.direction is not None:
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
                head[a + 1] = f"**{md_escape(g)}**"
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join([":---"] + [":---:"] * (ncol - 1)) + "|")
        sub = [f"**{md_escape(spec.label_header)}**"] + [_header(c, "md", bold=True) for c in spec.columns]
        lines.append("| " + " | ".join(sub) + " |")
    else:
        head = [f"**{md_escape(spec.label_header)}**"] + [_header(c, "md", bold=True) for c in spec.columns]
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
