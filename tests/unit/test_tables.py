"""Paper-layout tables: the paper's own tables are reproduced mark for mark."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import REPO

from qrerase.metrics import log_metrics
from qrerase.reports.tables import (
    METHOD_LABELS,
    Column,
    TableSpec,
    format_value,
    ordered_rows,
    rank_marks,
    render_latex,
    render_markdown,
    table_csv_frame,
    write_table,
)
from qrerase.text import eval_log
from qrerase.tracks.tofu.tables import tofu_table

LOGS = REPO / "data" / "tofu_reference_logs"

# the paper's TOFU table (tab:tofu_results)
PAPER_TOFU = pd.DataFrame(
    {
        "method": ["base", "ga", "graddiff", "npo", "flat", "unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"],
        "model_utility": [0.6227, 0.0, 0.0, 0.2297, 0.6104, 0.6047, 0.6103, 0.5938, 0.6120],
        "forget_quality": [np.nan, 1.433e-22, 2.828e-25, 0.0291, 0.0841, 0.257, 0.281, 0.243, 0.279],
    }
)


def test_method_labels():
    assert METHOD_LABELS["qr_erase_ll"] == "QR-Erase (LL)"
    assert METHOD_LABELS["unlearn_ll"] == "UNLEARN (LL)"
    assert METHOD_LABELS["retain"] == "Retain reference"
    assert METHOD_LABELS["bad_teaching"] == "Bad Teaching"
    assert METHOD_LABELS["qr_erase_ll_control"] == "QR-Erase (LL), retain-adapter control"
    assert METHOD_LABELS["kga"] == "KGA" and METHOD_LABELS["ku"] == "KU"
    assert METHOD_LABELS["simnpo"] == "SimNPO" and METHOD_LABELS["rmu"] == "RMU" and METHOD_LABELS["undial"] == "UNDIAL"
    assert len(METHOD_LABELS) == 23  # 19 methods and reference rows + a control row per subspace method


@pytest.mark.parametrize(
    "x,md,tex",
    [
        (1.433e-22, "1.433e-22", r"$1.433{\times}10^{-22}$"),
        (2.828e-25, "2.828e-25", r"$2.828{\times}10^{-25}$"),
        (5.63e-14, "5.630e-14", r"$5.630{\times}10^{-14}$"),
        (0.257, "0.257", "0.257"),
        (0.0291, "0.0291", "0.0291"),
        (0.0841, "0.0841", "0.0841"),
        (1.0, "1", "1"),
        (0.0, "0", "0"),
    ],
)
def test_sci_format(x, md, tex):
    assert format_value(x, "sci", "md") == md
    assert format_value(x, "sci", "tex") == tex


def test_paper_tofu_table_latex_and_markdown():
    df, spec = tofu_table(PAPER_TOFU)
    tex = render_latex(df, spec, caption="TOFU", label="tab:tofu_results")
    lines = tex.splitlines()
    assert lines[:6] == [
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{TOFU}",
        r"\label{tab:tofu_results}",
        r"\begin{tabular}{lcc}",
        r"\toprule",
    ]
    assert lines[6] == r"\textbf{Method} & \textbf{Model Utility} $\uparrow$ & \textbf{Forget Quality} $\uparrow$ \\"
    body = lines[lines.index(r"\midrule") + 1 : lines.index(r"\bottomrule")]
    assert body == [
        r"Base Model & 0.6227 & --- \\",
        r"\midrule",
        r"Gradient Ascent & 0.0000 & $1.433{\times}10^{-22}$ (degenerate) \\",  # utility collapsed
        r"Gradient Difference & 0.0000 & $2.828{\times}10^{-25}$ (degenerate) \\",
        r"NPO & 0.2297 & 0.0291 \\",
        r"FLAT & \underline{0.6104} & 0.0841 \\",
        r"\textsc{UNLEARN} & 0.6047 & 0.257$^{\checkmark}$ \\",
        r"\textsc{UNLEARN (LL)} & 0.6103 & \textbf{0.281}$^{\checkmark}$ \\",
        r"\textsc{QR-Erase} & 0.5938 & 0.243$^{\checkmark}$ \\",
        r"\textsc{QR-Erase} (LL) & \textbf{0.6120} & \underline{0.279}$^{\checkmark}$ \\",
    ]
    md = render_markdown(df, spec).splitlines()
    assert md[0] == "| **Method** | **Model Utility ↑** | **Forget Quality ↑** |"
    assert md[2] == "| Base Model | 0.6227 | — |"
    assert "| FLAT | <u>0.6104</u> | 0.0841 |" in md
    assert "| UNLEARN (LL) | 0.6103 | **0.281** ✓ |" in md
    assert "| QR-Erase (LL) | **0.6120** | <u>0.279</u> ✓ |" in md
    assert "| Gradient Ascent | 0.0000 | 1.433e-22 (degenerate) |" in md


def test_write_table_outputs_deterministic_and_raw_csv(tmp_path):
    df, spec = tofu_table(PAPER_TOFU.iloc[::-1])  # reference row still first
    paths = [tmp_path / "a" / f"t.{e}" for e in ("csv", "md", "tex")]
    write_table(df, spec, *paths, caption="c", label="l")
    first = [p.read_bytes() for p in paths]
    write_table(df.copy(), spec, *paths, caption="c", label="l")
    assert [p.read_bytes() for p in paths] == first
    csv = pd.read_csv(paths[0], keep_default_na=False)
    assert list(csv.columns) == [
        "method",
        "display_label",
        "reference",
        "model_utility",
        "forget_quality",
        "model_utility_mark",
        "forget_quality_mark",
    ]
    assert csv["method"].iloc[0] == "base" and csv["reference"].tolist() == [1] + [0] * 8
    assert csv.loc[csv.method == "qr_erase_ll", "model_utility_mark"].item() == "best"
    assert csv.loc[csv.method == "flat", "model_utility_mark"].item() == "second"
    assert csv.loc[csv.method == "unlearn_ll", "forget_quality_mark"].item() == "best"
    assert csv.loc[csv.method == "base", "forget_quality"].item() == ""  # missing stays empty
    assert float(csv.loc[csv.method == "ga", "forget_quality"].item()) == 1.433e-22  # full precision
    assert not list(tmp_path.rglob(".*tmp"))


def test_full_precision_in_csv(tmp_path):
    x = 0.1 + 0.2  # 0.30000000000000004
    df = pd.DataFrame({"method": ["a", "b"], "v": [x, 1 / 3]})
    spec = TableSpec(columns=(Column("v", "V"),))
    write_table(df, spec, tmp_path / "t.csv", None, None)
    back = pd.read_csv(tmp_path / "t.csv")
    assert back["v"].tolist() == [x, 1 / 3]
    assert not (tmp_path / "t.md").exists()


# the paper's cross-lingual table (tab:crosslingual_results)
LANGS = ["English", "Spanish", "Italian", "Hindi"]
XL = {
    "base": [0.6227, None, 0.5919, None, 0.6102, None, 0.5293, None],
    "npo": [0.2297, 0.0291, 0.0941, 5.63e-14, 0.0554, 3.118e-16, 0.0473, 5.417e-21],
    "flat": [0.6104, 0.0841, 0.4174, 1.73e-12, 0.4872, 6.28e-9, 0.3399, 8.92e-22],
    "unlearn": [0.6047, 0.257, 0.5105, 0.197, 0.5173, 0.249, 0.4103, 0.174],
    "unlearn_ll": [0.6103, 0.281, 0.5303, 0.218, 0.5736, 0.254, 0.4437, 0.187],
    "qr_erase": [0.5938, 0.243, 0.5006, 0.203, 0.5016, 0.235, 0.3852, 0.153],
    "qr_erase_ll": [0.6120, 0.279, 0.5268, 0.214, 0.5663, 0.257, 0.4391, 0.182],
}


def _xl():
    cols = [f"{lang.lower()}_{m}" for lang in LANGS for m in ("mu", "fq")]
    df = pd.DataFrame([[k] + v for k, v in XL.items()], columns=["method"] + cols)
    spec = TableSpec(
        columns=tuple(
            Column(f"{lang.lower()}_{m}", h, True, fmt, check_threshold=thr, group=lang)
            for lang in LANGS
            for m, h, fmt, thr in (("mu", "Utility", "{:.4f}", None), ("fq", "Forget", "sci", 0.1))
        ),
        reference_rows=("base",),
    )
    return df, spec


def test_cross_lingual_grouped_latex():
    df, spec = _xl()
    tex = render_latex(df, spec, environment="table*").splitlines()
    assert tex[0] == r"\begin{table*}[t]" and tex[-1] == r"\end{table*}"
    assert r"\begin{tabular}{lcc cc cc cc}" in tex
    head = tex[tex.index(r"\toprule") + 1]
    assert head == " & " + " & ".join(rf"\multicolumn{{2}}{{c}}{{\textbf{{{g}}}}}" for g in LANGS) + r" \\"
    assert (
        tex[tex.index(r"\toprule") + 2] == r"\cmidrule(lr){2-3}\cmidrule(lr){4-5}\cmidrule(lr){6-7}\cmidrule(lr){8-9}"
    )
    assert (
        tex[tex.index(r"\toprule") + 3]
        == r"\textbf{Method} & " + " & ".join([r"Utility $\uparrow$ & Forget $\uparrow$"] * 4) + r" \\"
    )
    row = {line.split(" & ")[0]: line for line in tex if " & " in line}
    assert row[r"\textsc{UNLEARN (LL)}"] == (
        r"\textsc{UNLEARN (LL)} & 0.6103 & \textbf{0.281}$^{\checkmark}$ & \textbf{0.5303} & "
        r"\textbf{0.218}$^{\checkmark}$ & \textbf{0.5736} & \underline{0.254}$^{\checkmark}$ & "
        r"\textbf{0.4437} & \textbf{0.187}$^{\checkmark}$ \\"
    )
    assert row[r"\textsc{QR-Erase} (LL)"] == (
        r"\textsc{QR-Erase} (LL) & \textbf{0.6120} & \underline{0.279}$^{\checkmark}$ & \underline{0.5268} & "
        r"\underline{0.214}$^{\checkmark}$ & \underline{0.5663} & \textbf{0.257}$^{\checkmark}$ & "
        r"\underline{0.4391} & \underline{0.182}$^{\checkmark}$ \\"
    )
    assert row["NPO"] == (
        r"NPO & 0.2297 & 0.0291 & 0.0941 & $5.630{\times}10^{-14}$ & 0.0554 & "
        r"$3.118{\times}10^{-16}$ & 0.0473 & $5.417{\times}10^{-21}$ \\"
    )
    assert row["Base Model"].endswith(r"0.5293 & --- \\")


def test_cross_lingual_grouped_markdown():
    df, spec = _xl()
    md = render_markdown(df, spec).splitlines()
    assert md[0] == "|  | **English** |  | **Spanish** |  | **Italian** |  | **Hindi** |  |"
    assert md[1] == "|:---|" + "|".join([":---:"] * 8) + "|"
    assert md[2] == "| **Method** | " + " | ".join(["**Utility ↑** | **Forget ↑**"] * 4) + " |"
    assert md[3].startswith("| Base Model | 0.6227 | — |")


def test_speech_layout_lower_is_better():
    # HuBERT Sample block of the paper's speech table; D_f: lower is better
    df = pd.DataFrame(
        {
            "method": [
                "Fine-Tuned Model",
                "ga",
                "scrub",
                "bad_teaching",
                "unlearn",
                "unlearn_ll",
                "qr_erase",
                "qr_erase_ll",
            ],
            "dt": [84.1, 14.1, 48.2, 53.7, 71.8, 73.4, 73.8, 72.5],
            "df": [84.4, 13.4, 51.1, 51.6, 40.5, 15.3, 40.9, 16.7],
            "dr": [83.7, 17.4, 50.2, 55.9, 69.8, 72.7, 73.1, 69.6],
        }
    )
    # GA's D_f 13.4 is the lowest: the paper leaves collapsed GA unmarked; here it is a plain
    # lower-is-better ranking, so drop GA to reproduce the paper's marks.
    spec = TableSpec(
        columns=(
            Column("dt", "D_t", True, "{:.1f}", group="HuBERT Sample", tex_header="$D_t$"),
            Column("df", "D_f", False, "{:.1f}", group="HuBERT Sample", tex_header="$D_f$"),
            Column("dr", "D_r", True, "{:.1f}", group="HuBERT Sample", tex_header="$D_r$"),
        ),
        reference_rows=("Fine-Tuned Model",),
    )
    tex = render_latex(df[df.method != "ga"], spec)
    assert r"\multicolumn{3}{c}{\textbf{HuBERT Sample}}" in tex and r"\cmidrule(lr){2-4}" in tex
    assert r"$D_f$ $\downarrow$" in tex
    assert r"\textsc{UNLEARN (LL)} & \underline{73.4} & \textbf{15.3} & \underline{72.7} \\" in tex
    assert r"\textsc{QR-Erase} & \textbf{73.8} & 40.9 & \textbf{73.1} \\" in tex
    assert r"\textsc{QR-Erase} (LL) & 72.5 & \underline{16.7} & 69.6 \\" in tex
    assert r"Fine-Tuned Model & 84.1 & 84.4 & 83.7 \\" in tex
    marks = rank_marks(ordered_rows(df, spec), spec)
    rows = list(ordered_rows(df, spec)["method"])
    assert marks["df"][rows.index("ga")] == "best"
    assert render_markdown(df, spec).splitlines()[2] == "| **Method** | **D_t ↑** | **D_f ↓** | **D_r ↑** |"


def test_ties_both_marked_and_display_ties():
    df = pd.DataFrame(
        {
            "method": ["ref", "a", "b", "c", "d", "e"],
            "v": [9.0, 0.5, 0.5, 0.4, 0.40000001, 0.1],
            "w": [0.0, 1.0, 2.0, 3.0, np.nan, 3.0],
        }
    )
    spec = TableSpec(
        columns=(Column("v", "V", True, "{:.4f}"), Column("w", "W", False, "{:.1f}"), Column("n", "N", None)),
        reference_rows=("ref",),
    )
    df["n"] = [1, 2, 3, 4, 5, 6]
    csv = table_csv_frame(df, spec)
    assert csv["v_mark"].tolist() == ["", "best", "best", "second", "second", ""]
    assert csv["w_mark"].tolist() == ["", "best", "second", "", "", ""]
    assert "n_mark" not in csv.columns
    md = render_markdown(df, spec)
    assert "| b | **0.5000** | <u>2.0</u> | 3.0000 |" in md
    assert "| d | <u>0.4000</u> | — | 5.0000 |" in md


def test_bad_table_input():
    spec = TableSpec(columns=(Column("v", "V"),))
    with pytest.raises(ValueError, match="'v'"):
        render_markdown(pd.DataFrame({"method": ["a"], "x": [1.0]}), spec)
    with pytest.raises(ValueError, match="duplicate row label"):
        render_markdown(pd.DataFrame({"method": ["a", "a"], "v": [1.0, 2.0]}), spec)
    with pytest.raises(ValueError, match="not numeric"):
        render_markdown(pd.DataFrame({"method": ["a"], "v": ["high"]}), spec)
    with pytest.raises(ValueError, match="label column"):
        render_markdown(pd.DataFrame({"model": ["a"], "v": [1.0]}), spec)
    with pytest.raises(ValueError, match="duplicate column"):
        TableSpec(columns=(Column("v", "V"), Column("v", "W")))


def test_tex_escaping_of_labels_and_headers():
    df = pd.DataFrame({"method": ["a_b & 50%"], "v": [1.0]})
    spec = TableSpec(columns=(Column("v", "Acc. (%)", True, "{:.1f}"),))
    tex = render_latex(df, spec)
    assert r"a\_b \& 50\% & \textbf{1.0} \\" in tex
    assert r"\textbf{Acc. (\%)} $\uparrow$" in tex


def test_tofu_table_from_real_metrics_frames(tmp_path):
    full = eval_log.load_log(LOGS / "ft_epoch5_lr1e-05_llama2-7b_full_wd0.01.json")
    ret = eval_log.load_log(LOGS / "ft_epoch5_lr1e-05_llama2-7b_retain90_wd0.01.json")
    tidy = pd.concat(
        [
            log_metrics.metrics_frame(ret, ret, model="retain"),
            log_metrics.metrics_frame(full, ret, model="base"),
            log_metrics.metrics_frame(full, ret, model="npo"),  # stand-ins for unlearned models
            log_metrics.metrics_frame(ret, ret, model="qr_erase"),
        ]
    )
    df, spec = tofu_table(tidy)
    assert list(df.columns) == ["method", "model_utility", "forget_quality"]
    md = render_markdown(df, spec).splitlines()
    assert md[2] == "| Base Model | 0.6227 | 1.834e-21 |"  # references in spec order: base, retain
    assert md[3] == "| Retain reference | 0.6137 | 1 ✓ |"
    assert md[4] == "| NPO | **0.6227** | <u>1.834e-21</u> |"
    assert md[5] == "| QR-Erase | <u>0.6137</u> | **1** ✓ |"
    dfw, specw = tofu_table(tidy, wide=True)
    assert len(specw.columns) == 16  # MU, FQ, 12 components, forget / retain ΔNLL against the base row
    assert dfw.loc[dfw.method == "npo", "forget_dnll"].item() == pytest.approx(0.0)
    write_table(dfw, specw, tmp_path / "w.csv", tmp_path / "w.md", tmp_path / "w.tex")
    csv = pd.read_csv(tmp_path / "w.csv", keep_default_na=False)
    assert float(csv.loc[csv.method == "base", "retain_probability"].item()) == pytest.approx(0.9895272273969067)
    assert "forget_probability_mark" not in csv.columns and "retain_rougeL_mark" in csv.columns
    assert r"\multicolumn{3}{c}{\textbf{Real Authors}}" in (tmp_path / "w.tex").read_text()
    with pytest.raises(ValueError, match="duplicate"):
        tofu_table(pd.concat([tidy, tidy]))


finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)  # (no "-0.00" vs "0.00" display pairs)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=8), st.booleans())
def test_rank_property(values, higher):
    df = pd.DataFrame({"method": [f"m{i}" for i in range(len(values))], "v": values})
    spec = TableSpec(columns=(Column("v", "V", higher, "{:.2f}"),))
    marks = table_csv_frame(df, spec)["v_mark"].tolist()
    shown = [float(format_value(v, "{:.2f}")) for v in values]
    key = [s if higher else -s for s in shown]
    best = max(key)
    if len(key) > 1 and len(set(key)) == 1:  # every row ties: no mark calls them all best
        assert marks == [""] * len(key)
        return
    assert all((m == "best") == (k == best) for m, k in zip(marks, key))
    rest = [k for k in key if k != best]
    if rest:
        second = max(rest)
        assert all((m == "second") == (k == second) for m, k in zip(marks, key))
    else:
        assert "second" not in marks
    assert render_markdown(df, spec) == render_markdown(df.copy(), spec)


def test_wide_table_has_the_selectivity_diagnostic():
    rows = pd.DataFrame(
        [
            (m, k, v)
            for m, vals in {
                "base": (0.05, 0.04, 0.9),
                "retain": (6.0, 0.05, 0.9),
                "qr_erase_ll": (2.0, 0.3, 0.8),
                "qr_erase_ll_control": (0.5, 1.5, 0.7),
            }.items()
            for k, v in zip(("forget_nll", "retain_nll", "model_utility"), vals)
        ],
        columns=["model", "metric", "value"],
    )
    df, spec = tofu_table(rows, wide=True)
    got = df.set_index("method")[["forget_dnll", "retain_dnll"]]
    np.testing.assert_allclose(got.loc["qr_erase_ll"], [1.95, 0.26])
    np.testing.assert_allclose(got.loc["qr_erase_ll_control"], [0.45, 1.46])
    np.testing.assert_allclose(got.loc["base"], [0.0, 0.0])
    sel = [c for c in spec.columns if c.group == "Selectivity"]
    assert [c.name for c in sel] == ["forget_dnll", "retain_dnll"] and all(c.higher_is_better is None for c in sel)
    narrow, _ = tofu_table(rows, wide=False)
    assert "forget_dnll" not in narrow.columns


def test_collapsed_utility_marks_forget_quality_degenerate_not_passing(tmp_path):
    """A method whose Model Utility collapsed (below DEGENERATE_UTILITY_FRACTION of the base model's)
    shows Forget Quality 1 as degenerate: no ✓, not ranked, CSV mark 'degenerate'; other rows unchanged."""
    from qrerase.reports.tables import DEGENERATE_UTILITY_FRACTION

    sane = pd.DataFrame(
        {
            "method": ["base", "retain", "qr_erase", "unlearn"],
            "model_utility": [0.90, 0.89, 0.85, 0.80],
            "forget_quality": [1e-5, np.nan, 0.3, 0.05],
        }
    )
    collapsed = pd.concat(
        [sane, pd.DataFrame({"method": ["qr_erase_ll"], "model_utility": [0.0], "forget_quality": [1.0]})],
        ignore_index=True,
    )
    md_sane = render_markdown(*tofu_table(sane)).splitlines()
    md = render_markdown(*tofu_table(collapsed)).splitlines()
    assert md[: len(md_sane)] == md_sane  # the other rows render exactly as before
    assert md[-1] == "| QR-Erase (LL) | 0.0000 | 1 (degenerate) |"
    assert "| QR-Erase | **0.8500** | **0.3** ✓ |" in md  # still the best: the degenerate 1 is not ranked
    tex = render_latex(*tofu_table(collapsed))
    assert r"\textsc{QR-Erase} (LL) & 0.0000 & 1 (degenerate) \\" in tex and tex.count(r"\checkmark") == 1
    df, spec = tofu_table(collapsed)
    csv = table_csv_frame(df, spec).set_index("method")
    assert csv.loc["qr_erase_ll", "forget_quality_mark"] == "degenerate"
    assert csv.loc["qr_erase", "forget_quality_mark"] == "best"
    # the threshold is the stated fraction of the base model's utility
    edge = collapsed.assign(model_utility=[0.90, 0.89, 0.85, 0.80, 0.90 * DEGENERATE_UTILITY_FRACTION * 1.01])
    assert render_markdown(*tofu_table(edge)).splitlines()[-1].endswith("| **1** ✓ |")  # passing, ranked
    below = collapsed.assign(model_utility=[0.90, 0.89, 0.85, 0.80, 0.90 * DEGENERATE_UTILITY_FRACTION * 0.99])
    assert render_markdown(*tofu_table(below)).splitlines()[-1].endswith("| 1 (degenerate) |")
    nan_utility = collapsed.assign(model_utility=[0.90, 0.89, 0.85, 0.80, np.nan])
    assert render_markdown(*tofu_table(nan_utility)).splitlines()[-1].endswith("| 1 (degenerate) |")
    with pytest.raises(ValueError, match="degenerate cells in unknown column"):
        TableSpec(columns=(Column("a", "A"),), degenerate={"b": ("x",)})


def test_cross_lingual_pair_with_collapsed_utility_is_degenerate():
    from qrerase.tracks.crosslingual.tables import matrix_table, pairs_table

    rows = []
    for unlearn, method in (("base", "base"), ("retain", "retain"), ("en", "qr_erase")):
        for y in ("en", "fr"):
            collapsed = unlearn == "en" and y == "fr"
            utility, fq = (0.0, 1.0) if collapsed else (0.8, 0.2)
            rows.append(
                {"unlearn": unlearn, "method": method, "eval": y, "model_utility": utility, "forget_quality": fq}
            )
    metrics = pd.DataFrame(rows)
    md = render_markdown(*pairs_table(metrics, ["qr_erase"], [("en", "en"), ("en", "fr")])).splitlines()
    assert md[-1] == "| QR-Erase | **0.8000** | **0.2** ✓ | **0.0000** | 1 (degenerate) |"
    md = render_markdown(*matrix_table(metrics, "qr_erase", ["en"], ["en", "fr"])).splitlines()
    assert md[-2:] == ["| English → English | 0.8000 | 0.2 ✓ |", "| English → French | 0.0000 | 1 (degenerate) |"]
