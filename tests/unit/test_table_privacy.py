"""Closest-to-target ranking of table columns, the TOFU privacy columns and the speech LOSS attack."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from qrerase.metrics.registry import MetricError, direction_distance, distance_to_ideal
from qrerase.reports.tables import Column, TableSpec, ordered_rows, rank_marks, render_latex, render_markdown
from qrerase.tracks.speech.privacy import attack_masks, attack_metrics, clip_losses, loss_attack_auc, loss_score
from qrerase.tracks.speech.tables import speech_mia_table
from qrerase.tracks.tofu.tables import privacy_frame, privacy_metrics, tofu_table


def marks(values, col: Column, reference=()):
    df = pd.DataFrame({"method": [f"m{i}" for i in range(len(values))], col.name: values})
    spec = TableSpec(columns=(col,), reference_rows=tuple(reference))
    rows = ordered_rows(df, spec)
    return dict(zip(rows["method"], rank_marks(rows, spec)[col.name]))


def test_target_column_ranks_by_distance_with_ties_nan_and_reference():
    col = Column("auc", "AUC", None, target=0.5)
    got = marks([0.9, 0.55, 0.45, 0.3, np.nan, 0.5, math.inf], col, reference=("m5",))
    # 0.55 and 0.45 are both 0.05 from 0.5 (a tie), 0.3 is next; NaN, inf and the reference are not ranked
    assert got == {"m5": "", "m0": "", "m1": "best", "m2": "best", "m3": "second", "m4": "", "m6": ""}
    privleak = Column.for_metric("privleak", fmt="{:.2f}")
    assert privleak.target == 0.0 and privleak.higher_is_better is None and privleak.direction == "target"
    assert marks([-100.0, 5.0, -5.0, 20.0], privleak) == {"m0": "", "m1": "best", "m2": "best", "m3": "second"}


def test_a_column_where_every_ranked_row_ties_has_no_mark():
    # the default run's PrivLeak: every unlearned model at -100, the retain reference at 0
    privleak = Column.for_metric("privleak", fmt="{:.2f}")
    got = marks([-100.0, -100.0, -100.0, 0.0], privleak, reference=("m3",))
    assert got == {"m0": "", "m1": "", "m2": "", "m3": ""}
    # one ranked row alone is still its column's best; two distinct values still rank
    assert marks([-100.0, 0.0], privleak, reference=("m1",)) == {"m0": "best", "m1": ""}
    assert marks([-100.0, -100.0, -50.0], privleak) == {"m0": "second", "m1": "second", "m2": "best"}


def test_higher_and_lower_columns_rank_as_before():
    assert marks([0.2, 0.1, 0.1, 0.3], Column.for_metric("extraction_strength")) == {
        "m0": "second",
        "m1": "best",
        "m2": "best",
        "m3": "",
    }
    assert marks([0.2, 0.1, np.nan, 0.3], Column("u", "U", True)) == {"m0": "second", "m1": "", "m2": "", "m3": "best"}
    assert Column("u", "U", None).direction is None and Column("u", "U", False).direction == "lower"


def test_target_column_headers_and_cells():
    df = pd.DataFrame({"method": ["base", "a", "b"], "auc": [1.0, 0.6, 0.8]})
    spec = TableSpec(columns=(Column("auc", "AUC", None, target=0.5),), reference_rows=("base",))
    md = render_markdown(df, spec)
    assert "**AUC (→ 0.5)**" in md
    assert "| a | **0.6000** |" in md and "| b | <u>0.8000</u> |" in md and "| Base Model | 1.0000 |" in md
    assert "\\textbf{AUC} ($\\to 0.5$)" in render_latex(df, spec)


def test_column_and_distance_validation():
    with pytest.raises(ValueError, match="target column has higher_is_better=None"):
        Column("x", "X", True, target=0.5)
    with pytest.raises(ValueError, match="target must be a finite number"):
        Column("x", "X", None, target=float("nan"))
    with pytest.raises(MetricError, match="direction must be one of"):
        direction_distance("closest", 1.0)
    with pytest.raises(MetricError, match="given exactly for direction 'target'"):
        direction_distance("target", 1.0)
    for name, x in (("mia_min_k", 0.7), ("privleak", -30.0), ("extraction_strength", 0.2)):
        assert Column.for_metric(name).distance(x) == distance_to_ideal(name, x)
    assert direction_distance("higher", 0.3) == -0.3 and direction_distance("lower", float("nan")) == math.inf


SEQUENCE = {
    "base": {"mia_min_k": 0.9, "mia_min_k_plus_plus": 0.95},
    "retain": {"mia_min_k": 0.2, "mia_min_k_plus_plus": 0.25},
    "ga": {"mia_min_k": 0.4, "mia_min_k_plus_plus": 0.5},
    "qr_erase": {"mia_min_k": 0.1, "mia_min_k_plus_plus": 0.6},
}
TOFU_ROWS = pd.DataFrame(
    {
        "method": ["base", "retain", "ga", "qr_erase", "imported_x"],
        "model_utility": [0.6, 0.62, 0.3, 0.58, 0.5],
        "forget_quality": [0.01, np.nan, 0.2, 0.3, 0.05],
        "forget_nll": [1.0, 2.0, 3.0, 1.5, 1.1],
        "retain_nll": [1.0, 1.0, 1.4, 1.05, 1.0],
    }
)


def test_privacy_frame_is_privleak_and_the_default_attack():
    frame = privacy_frame(SEQUENCE).set_index("method")
    assert list(frame.columns) == list(privacy_metrics()) == ["privleak", "mia_min_k_plus_plus"]
    # MUSE PrivLeak = (r - a) / (1 - r) * 100, r = the retain row's Min-K% AUC (0.2)
    assert frame.loc["ga", "privleak"] == pytest.approx((0.2 - 0.4) / 0.8 * 100)
    assert frame.loc["qr_erase", "privleak"] == pytest.approx((0.2 - 0.1) / 0.8 * 100)
    assert frame.loc["retain", "privleak"] == 0.0
    assert frame.loc["qr_erase", "mia_min_k_plus_plus"] == 0.6
    with pytest.raises(ValueError, match="reference row 'retain'"):
        privacy_frame({"ga": SEQUENCE["ga"]})


@pytest.mark.parametrize("wide", [False, True])
def test_tofu_table_privacy_columns(wide):
    plain_df, plain_spec = tofu_table(TOFU_ROWS, wide=wide)
    df, spec = tofu_table(TOFU_ROWS, wide=wide, privacy=privacy_frame(SEQUENCE))
    assert [c.name for c in spec.columns] == [c.name for c in plain_spec.columns] + list(privacy_metrics())
    pd.testing.assert_frame_equal(df[plain_df.columns], plain_df)  # the existing columns are unchanged
    spec = TableSpec(**{**spec.__dict__, "reference_rows": ("base", "retain", "imported_x")})
    rows = ordered_rows(df, spec)
    got = rank_marks(rows, spec)
    by = dict(zip(rows["method"], zip(got["privleak"], got["mia_min_k_plus_plus"])))
    # PrivLeak: qr_erase 12.5 is closer to 0 than ga -25; AUC: ga 0.5 is ideal, qr_erase 0.6 next
    assert by["qr_erase"] == ("best", "second") and by["ga"] == ("second", "best")
    md = render_markdown(df, spec)
    assert "PrivLeak (→ 0)" in md and "MIA AUC (Min-K%++) (→ 0.5)" in md
    imported = next(line for line in md.splitlines() if line.startswith("| imported_x "))
    assert imported.endswith("| — | — |")  # no forward pass: no privacy values
    retain = next(line for line in md.splitlines() if line.startswith("| Retain reference "))
    assert retain.endswith("| 0.00 | 0.2500 |")
    if wide:
        assert "**Privacy**" in md


def test_tofu_table_rejects_a_bad_privacy_frame():
    with pytest.raises(ValueError, match="lacks column"):
        tofu_table(TOFU_ROWS, privacy=pd.DataFrame({"method": ["ga"], "privleak": [1.0]}))
    dup = pd.concat([privacy_frame(SEQUENCE)] * 2)
    with pytest.raises(ValueError, match="duplicate privacy row"):
        tofu_table(TOFU_ROWS, privacy=dup)


def test_attack_metrics_compute_the_registered_speech_metrics_with_their_track_function():
    rng = np.random.default_rng(0)
    members = (rng.normal(size=(6, 3)), np.array([0, 1, 2, 0, 1, 2]))
    nonmembers = (rng.normal(size=(4, 3)), np.array([2, 2, 1, 0]))
    got = attack_metrics(members, nonmembers)
    assert list(got) == ["mia_loss"]  # the speech track's registered metrics
    # independently: the LOSS attack on the per-clip cross-entropy, from the logits by hand
    ce = [float(np.log(np.exp(z).sum()) - z[y]) for z, y in zip(*members)]
    ce_n = [float(np.log(np.exp(z).sum()) - z[y]) for z, y in zip(*nonmembers)]
    pairs = [1.0 if -a > -b else 0.5 if a == b else 0.0 for a in ce for b in ce_n]
    assert got["mia_loss"] == pytest.approx(sum(pairs) / len(pairs), abs=1e-12)
    assert got["mia_loss"] == loss_attack_auc(clip_losses(*members), clip_losses(*nonmembers))
    np.testing.assert_array_equal(loss_score(*members), -clip_losses(*members))


def test_clip_losses_and_the_loss_attack_auc():
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    want = [math.log(math.exp(2) + 1 + math.exp(-1)) - 2.0, math.log(3.0)]
    np.testing.assert_allclose(clip_losses(logits, np.array([0, 2])), want, rtol=1e-12)
    # members' losses 0.1, 0.2, 0.9 vs held-out 0.5, 0.9: 4 of 6 pairs lower, one tie (½): AUC 0.75
    assert loss_attack_auc([0.1, 0.2, 0.9], [0.5, 0.9]) == pytest.approx(4.5 / 6)
    assert loss_attack_auc([1.0, 2.0], [0.5]) == 0.0 and loss_attack_auc([0.3], [0.3]) == 0.5
    with pytest.raises(ValueError, match="labels must be integers"):
        clip_losses(logits, np.array([0, 3]))
    with pytest.raises(ValueError, match="finite"):
        loss_attack_auc([float("nan")], [0.1])


def test_attack_masks_are_the_forgotten_speakers_train_vs_held_out_clips():
    index = pd.DataFrame(
        {
            "speaker": ["a", "a", "a", "a", "b", "b", "b"],
            "split": ["train", "train", "val", "test", "train", "val", "test"],
            "class_partition": ["forget", "forget", "forget", "forget", "retain", "val", "test"],
            "sample_partition": ["retain", "forget", "val", "test", "forget", "val", "test"],
        }
    )
    members, held = attack_masks(index, "class")
    assert members.tolist() == [True, True, False, False, False, False, False]
    assert held.tolist() == [False, False, True, True, False, False, False]
    members, held = attack_masks(index, "sample")  # speakers a and b have a clip in D_f
    assert members.tolist() == [False, True, False, False, True, False, False]
    assert held.tolist() == [False, False, True, True, False, True, True]
    with pytest.raises(ValueError, match="lacks column"):
        attack_masks(index.drop(columns="split"), "class")
    with pytest.raises(ValueError, match="0 non-member"):
        attack_masks(index.assign(split="train"), "class")


def test_speech_mia_table_ranks_by_distance_to_half():
    auc = {("class", "base"): 0.9, ("class", "ga"): 0.3, ("class", "qr_erase_k2"): 0.55, ("class", "scrub"): 0.8}
    values = {k: {"mia_loss": v} for k, v in auc.items()}
    df, spec = speech_mia_table(values, ["class"], ["base", "ga", "qr_erase_k2", "scrub"], row_key=lambda m: m[:8])
    rows = ordered_rows(df, spec)
    assert dict(zip(rows["method"], rank_marks(rows, spec)["class_mia_loss"])) == {
        "base": "",
        "ga": "second",
        "qr_erase": "best",
        "scrub": "",
    }
    assert "**Class**" in render_markdown(df, spec) and "LOSS AUC (→ 0.5)" in render_markdown(df, spec)
    with pytest.raises(ValueError, match="no mia_loss of model 'ga' in setting 'sample'"):
        speech_mia_table(values, ["sample"], ["ga"])


def test_results_pages_name_the_registered_metrics_of_a_table(tmp_path):
    from qrerase.reports.pages import metric_notes

    csv = tmp_path / "speech_mia.csv"
    csv.write_text(
        "method,reference,class_mia_loss,privleak,extraction_strength_mark,model_utility\nbase,1,0.9,0,,0.5\n"
    )
    notes = metric_notes(csv)
    # registry order: the LOSS AUC, then PrivLeak; a *_mark column alone names no metric
    assert [n.split(" (`")[0] for n in notes] == ["- MIA AUC (LOSS)", "- PrivLeak"]
    assert "closest to 0.5 is best" in notes[0] and "closest to 0 is best" in notes[1]
    (tmp_path / "plain.csv").write_text("method,model_utility\n")
    assert metric_notes(tmp_path / "plain.csv") == []
