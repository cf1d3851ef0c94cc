"""The trade-off sweep's library part: scale names, rescaled updates, the λ rule, the sweep frame."""

import numpy as np
import pandas as pd
import pytest

from qrerase.text.tradeoff import (
    curves,
    mean_answer_nll,
    scale_name,
    scaled_updates,
    select_scale,
    share_unedited,
    tradeoff_frame,
)


def test_scale_name_is_the_path_form():
    assert [scale_name(x) for x in (0, 0.5, 2.0, 3, 1.25)] == ["0", "0.5", "2", "3", "1.25"]
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale: expected a finite number >= 0"):
            scale_name(bad)


def test_scaled_updates_rescale_the_product_exactly():
    rng = np.random.default_rng(0)
    U, V = rng.standard_normal((6, 2)), rng.standard_normal((2, 5))
    out = scaled_updates({"m": (U, V)}, 2.5)
    np.testing.assert_allclose(out["m"][0] @ out["m"][1], 2.5 * (U @ V), rtol=1e-14)
    assert out["m"][1] is V
    with pytest.raises(ValueError, match="factor must be finite"):
        scaled_updates({"m": (U, V)}, float("inf"))


def test_mean_answer_nll_is_the_mean_per_token_loss():
    assert mean_answer_nll([(2.0, 4), (3.0, 1)]) == pytest.approx((0.5 + 3.0) / 2)
    with pytest.raises(ValueError, match="no answers"):
        mean_answer_nll([])
    with pytest.raises(ValueError, match="has no tokens"):
        mean_answer_nll([(1.0, 0)])


def _points():
    rows = []
    for method, rises in (("qr_erase_ll", [0, 0.02, 0.05, 0.3]), ("unlearn", [0, 0.2, 0.4, 0.9])):
        for scale, rise in zip([0, 1, 2, 4], rises):
            rows.append(
                {
                    "group": "tofu",
                    "method": method,
                    "family": "subspace",
                    "rank": 4,
                    "scale": scale,
                    "epochs": None,
                    "tune_retain_nll": 0.5 + rise,
                    "model_utility": 0.8 - rise,
                    "forget_quality": 1e-3 * (1 + scale),
                }
            )
    rows.append(
        {
            "group": "tofu",
            "method": "ga",
            "family": "baseline",
            "rank": None,
            "scale": None,
            "epochs": 5,
            "tune_retain_nll": 9.0,
            "model_utility": 0.4,
            "forget_quality": 0.2,
        }
    )
    return pd.DataFrame(rows)


def test_select_scale_takes_the_largest_lambda_within_the_rise():
    sel = select_scale(_points(), max_rise=0.1)
    assert sel.set_index("method")["selected_scale"].to_dict() == {"qr_erase_ll": 2.0, "unlearn": 0.0}
    assert sel.set_index("method").loc["qr_erase_ll", "selected_nll"] == pytest.approx(0.55)
    # the rule does not read Forget Quality: changing it changes nothing
    pts = _points().assign(forget_quality=0.5)
    pd.testing.assert_frame_equal(select_scale(pts, 0.1), sel)


def test_select_scale_on_nll_protocol_points_reads_the_nll_alone():
    # protocol nll: no Model Utility was measured, so the column is NaN at every point, λ = 0 included;
    # that is not a collapsed utility (the rule once rejected every λ > 0 here and always picked 0)
    pts = _points().assign(model_utility=float("nan"), forget_quality=float("nan"))
    sel = select_scale(pts, max_rise=0.1)
    assert sel.set_index("method")["selected_scale"].to_dict() == {"qr_erase_ll": 2.0, "unlearn": 0.0}
    assert select_scale(pts, max_rise=10.0)["selected_scale"].tolist() == [
        float(pts[pts["method"] == m]["scale"].max()) for m in ("qr_erase_ll", "unlearn")
    ]
    # a utility measured at λ = 0 but NaN at a λ > 0 is still a degenerate point
    one = _points()
    one.loc[(one["method"] == "qr_erase_ll") & (one["scale"] == 2.0), "model_utility"] = float("nan")
    assert select_scale(one, 0.1).set_index("method").loc["qr_erase_ll", "selected_scale"] < 2.0


def test_select_scale_skips_points_without_a_held_out_slice():
    pts = _points()
    pts.loc[pts["method"] == "unlearn", "tune_retain_nll"] = np.nan
    assert list(select_scale(pts, 0.1)["method"]) == ["qr_erase_ll"]


def test_select_scale_needs_the_unedited_point():
    pts = _points()
    with pytest.raises(ValueError, match="no scale-0 point"):
        select_scale(pts[pts["scale"] != 0], 0.1)
    with pytest.raises(ValueError, match="max_rise must be >= 0"):
        select_scale(pts, -1)


def test_tradeoff_frame_orders_points_and_relates_utility_to_the_unedited_model():
    frame = tradeoff_frame(_points().sample(frac=1, random_state=0))
    sub = frame[frame["family"] == "subspace"]
    assert list(sub.groupby("method", sort=False)["scale"].apply(list).iloc[0]) == [0, 1, 2, 4]
    assert frame.loc[frame["method"] == "ga", "utility_rel"].item() == pytest.approx(0.5)
    c = curves(frame, "forget_quality", "utility_rel", {"qr_erase_ll": "QR-Erase (LL)"})
    assert set(c) == {"QR-Erase (LL)", "unlearn", "ga"}
    np.testing.assert_allclose(c["QR-Erase (LL)"][1], [1.0, 0.975, 0.9375, 0.625])
    with pytest.raises(ValueError, match="no scale-0 point"):
        tradeoff_frame(_points().query("scale != 0"))
    assert tradeoff_frame(_points().assign(model_utility=0.0))["utility_rel"].isna().all()
    # two groups (unlearning languages): each relative to its own unedited model, labelled by pair
    two = pd.concat([_points(), _points().assign(group="hi", model_utility=lambda d: d["model_utility"] / 2)])
    frame2 = tradeoff_frame(two)
    np.testing.assert_allclose(frame2.groupby("group")["utility_rel"].max(), [1.0, 1.0])
    assert "QR-Erase (LL) (hi→hi)" in curves(frame2, "forget_quality", "utility_rel", {"qr_erase_ll": "QR-Erase (LL)"})


def test_nll_rises_are_measured_from_each_groups_unedited_model():
    from qrerase.text.tradeoff import nll_rises

    frame = pd.DataFrame(
        {
            "group": ["a", "a", "a", "b", "b"],
            "family": ["subspace", "subspace", "baseline", "subspace", "subspace"],
            "method": ["qr_erase", "qr_erase", "npo", "qr_erase", "qr_erase"],
            "scale": [0.0, 1.0, np.nan, 0.0, 2.0],
            "forget_nll": [1.0, 3.0, 2.5, 10.0, 10.5],
            "tune_retain_nll": [0.5, 0.6, 0.55, 2.0, 2.25],
        }
    )
    out = nll_rises(frame)
    assert out["forget_rise"].tolist() == pytest.approx([0.0, 2.0, 1.5, 0.0, 0.5])
    assert out["tune_retain_rise"].tolist() == pytest.approx([0.0, 0.1, 0.05, 0.0, 0.25])


def test_the_nll_protocol_point_measures_the_same_nlls_as_the_full_protocol(tmp_path):
    """protocol nll skips generation and the perturbed answers; its three NLLs equal the full protocol's."""
    from support.tiny_text import DATA, TINY, TPL

    from qrerase.io import read_jsonl
    from qrerase.text.data import normalise
    from qrerase.text.evaluation import EvalConfig
    from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
    from qrerase.text.tradeoff import evaluate_text_point

    def rows(name, n):
        return [normalise(r, name) for r in read_jsonl(DATA / f"{name}.jsonl")[:n]]

    sets = {"forget": rows("forget10_perturbed", 6), "retain": rows("retain_perturbed", 6)}
    sets["real_authors"], sets["world_facts"] = rows("real_authors_perturbed", 4), rows("world_facts_perturbed", 4)
    tune = rows("retain90", 5)
    texts = [r["question"] + " " + r["answer"] for rs in sets.values() for r in rs]
    tok = train_bpe_tokenizer(texts, 300, tmp_path / "tok")
    model, template = build_tiny_llama(TINY, tok, seed=0), TPL
    cfg = EvalConfig(batch_size=8, max_new_tokens=4)
    meta = {"group": "tofu", "method": "qr_erase", "family": "subspace", "rank": 2, "scale": 0.0, "epochs": None}
    full = evaluate_text_point(model, tok, template, sets, tune, None, cfg, meta).iloc[0]
    nll = evaluate_text_point(model, tok, template, sets, tune, None, cfg, meta, protocol="nll").iloc[0]
    for col in ("forget_nll", "retain_nll", "tune_retain_nll"):
        assert nll[col] == pytest.approx(full[col], rel=1e-6), col
    assert np.isnan(nll["model_utility"]) and np.isnan(nll["forget_quality"])
    assert np.isfinite(full["model_utility"])
    with pytest.raises(ValueError, match="tradeoff.protocol"):
        evaluate_text_point(model, tok, template, sets, tune, None, cfg, meta, protocol="rouge")


def _with_point(method, scale, nll, utility):
    row = {"group": "tofu", "method": method, "family": "subspace", "rank": 4, "scale": scale, "epochs": None}
    extra = pd.DataFrame([{**row, "tune_retain_nll": nll, "model_utility": utility, "forget_quality": 1.0}])
    return pd.concat([_points(), extra], ignore_index=True)


@pytest.mark.parametrize(
    "nll,utility",
    [(0.5, 0.0), (0.5, np.nan), (-np.inf, 0.8), (0.5, 0.8 * 0.2)],
    ids=["utility-collapsed", "utility-nan", "nll-non-finite", "utility-below-fraction"],
)
def test_select_scale_never_picks_a_degenerate_point(nll, utility):
    """λ = 8 with no NLL rise but a collapsed (or non-finite) utility, or a non-finite NLL: not picked."""
    sel = select_scale(_with_point("qr_erase_ll", 8, nll, utility), max_rise=0.1)
    assert sel.set_index("method")["selected_scale"].to_dict() == {"qr_erase_ll": 2.0, "unlearn": 0.0}
    # at utility just above the fraction of the unedited model's (0.8), λ = 8 is a fair pick
    fair = select_scale(_with_point("qr_erase_ll", 8, 0.5, 0.8 * 0.3), max_rise=0.1)
    assert fair.set_index("method").loc["qr_erase_ll", "selected_scale"] == 8.0


def test_one_unedited_point_serves_every_sweep_of_its_group():
    full = _points()
    # the workflow evaluates λ = 0 once per group, for the first sweep (qr_erase_ll at k = 4)
    planned = pd.concat([full, full.assign(group="hi")], ignore_index=True)
    planned = planned[~((planned["method"] == "unlearn") & (planned["scale"] == 0))]
    shared = share_unedited(planned, [("qr_erase_ll", 4), ("unlearn", 4), ("unlearn", 8)])
    for group in ("tofu", "hi"):
        zero = shared[(shared["group"] == group) & (shared["scale"] == 0)].set_index(["method", "rank"])
        assert sorted(zero.index) == [("qr_erase_ll", 4), ("unlearn", 4), ("unlearn", 8)]
        assert (zero["model_utility"] == 0.8).all() and (zero["tune_retain_nll"] == 0.5).all()
    # the shared rows give the same frame and the same λ rule as evaluating λ = 0 for every sweep
    pd.testing.assert_frame_equal(
        tradeoff_frame(share_unedited(planned, [("qr_erase_ll", 4), ("unlearn", 4)])),
        tradeoff_frame(pd.concat([full, full.assign(group="hi")], ignore_index=True)),
        check_dtype=False,
    )
    # nothing to copy: the points unchanged; a group without λ = 0 is left for tradeoff_frame to name
    pd.testing.assert_frame_equal(share_unedited(full, [("qr_erase_ll", 4), ("unlearn", 4)]), full)
    assert len(share_unedited(full.query("scale != 0"), [("unlearn", 4)])) == len(full) - 2
    with pytest.raises(ValueError, match="points need columns"):
        share_unedited(full.drop(columns="rank"), [])
