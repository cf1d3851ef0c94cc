"""The construction study's library (qrerase.text.construction, qrerase.reports.construction) against
the paper's equations and hand values."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import scipy.linalg as sla

from qrerase.method.lowrank import LowRank
from qrerase.reports.construction import baseline_rows, module_summary, variant_rows
from qrerase.text.construction import (
    check_construction,
    construction_updates,
    doubling_sweep,
    explaining_rows,
    matching_scale,
    retain_projector_rank,
    with_unedited,
)


def _lowrank(rng, d_out, d_in, r):
    return LowRank(rng.standard_normal((d_out, r)), rng.standard_normal((r, d_in)))


def _eqs_3_to_5(t_f: np.ndarray, t_r: np.ndarray, k: int, columns: int) -> np.ndarray:
    """T̃_f from dense matrices, as the paper writes it: T_f Π = Q R (eq. 1, xGEQP3), Q_r an orthonormal
    basis of T_r's leading ``columns`` pivoted columns (eq. 2), P_r = Q_r Q_rᵀ (eq. 3), Q̃_f =
    (I − P_r) Q_f,k (eq. 4), T̃_f = Q̃_f R_f,k Πᵀ (eq. 5)."""
    q_f, r_f, piv = sla.qr(t_f, pivoting=True, mode="economic")
    q_r, _, _ = sla.qr(t_r, pivoting=True, mode="economic")
    p_r = q_r[:, :columns] @ q_r[:, :columns].T
    q_tilde = (np.eye(t_f.shape[0]) - p_r) @ q_f[:, :k]
    r_k = np.empty((k, t_f.shape[1]))
    r_k[:, piv] = r_f[:k]
    return q_tilde @ r_k


def test_the_full_retain_projector_is_eqs_3_and_4_with_the_whole_retain_basis():
    rng = np.random.default_rng(0)
    forget, retain = {"m": _lowrank(rng, 12, 9, 5)}, {"m": _lowrank(rng, 12, 9, 5)}
    t_f, t_r = forget["m"].B @ forget["m"].A, retain["m"].B @ retain["m"].A
    updates, details = construction_updates(forget, retain, 2, "cpqr", "full")
    (U, V), (_, columns) = updates["m"], details["m"]
    assert columns == 5  # the retain task matrix's rank, not k
    np.testing.assert_allclose(U @ V, _eqs_3_to_5(t_f, t_r, 2, 5), atol=1e-10)
    # P_r spans all of T_r's columns: nothing of the edit is left in the retain subspace
    q_r = sla.orth(t_r)
    assert np.abs(q_r.T @ U).max() < 1e-10
    # the k projector keeps the retain directions past k, so it differs from the full one
    Uk, Vk = construction_updates(forget, retain, 2, "cpqr", "k")[0]["m"]
    np.testing.assert_allclose(Uk @ Vk, _eqs_3_to_5(t_f, t_r, 2, 2), atol=1e-10)
    assert np.abs(q_r.T @ Uk).max() > 1e-3


def test_the_projectors_agree_where_k_is_the_retain_rank_and_the_svd_path_matches_too():
    rng = np.random.default_rng(1)
    forget, retain = {"m": _lowrank(rng, 10, 8, 3)}, {"m": _lowrank(rng, 10, 8, 3)}
    full, _ = construction_updates(forget, retain, 3, "svd", "full")
    at_k, _ = construction_updates(forget, retain, 3, "svd", "k")
    np.testing.assert_allclose(full["m"].U @ full["m"].V, at_k["m"].U @ at_k["m"].V, atol=1e-12)
    t_f, t_r = forget["m"].B @ forget["m"].A, retain["m"].B @ retain["m"].A
    u, s, vt = np.linalg.svd(t_f, full_matrices=False)
    q_r = np.linalg.svd(t_r, full_matrices=False)[0][:, :3]
    expected = (np.eye(10) - q_r @ q_r.T) @ u[:, :3] @ np.diag(s[:3]) @ vt[:3]
    np.testing.assert_allclose(full["m"].U @ full["m"].V, expected, atol=1e-10)


def test_the_retain_rank_is_numerical_and_bad_settings_are_refused():
    rng = np.random.default_rng(2)
    b = rng.standard_normal((6, 3))
    b[:, 2] = b[:, 0] + b[:, 1]  # rank 2 although r = 3
    retain = LowRank(b, rng.standard_normal((3, 5)))
    assert retain_projector_rank("full", 1, retain) == 2
    assert retain_projector_rank("k", 1, retain) == 1
    assert retain_projector_rank("k", 3, retain) == 2
    with pytest.raises(ValueError, match="expected one of"):
        retain_projector_rank("half", 1, retain)
    with pytest.raises(ValueError, match="integer >= 1"):
        retain_projector_rank("k", 0, retain)
    with pytest.raises(ValueError, match="modules not present"):
        construction_updates({"m": retain}, {"m": retain}, 1, "cpqr", "k", modules=["x"])


def test_the_explaining_quantities_on_hand_values():
    # T_f = diag(3, 2, 1) on the first three coordinates: rank-2 SVD keeps (9 + 4) / 14 of the energy
    b_f = np.zeros((4, 3))
    b_f[[0, 1, 2], [0, 1, 2]] = [3.0, 2.0, 1.0]
    forget = {"m": LowRank(b_f, np.eye(3, 5))}
    # T_r spans e_1 only: P_r removes the first forget direction, of norm 3 out of sqrt(13)
    b_r = np.zeros((4, 1))
    b_r[0, 0] = 1.0
    retain = {"m": LowRank(b_r, np.ones((1, 5)))}
    updates, details = construction_updates(forget, retain, 2, "svd", "full")
    (row,) = explaining_rows(forget, updates, details)
    assert row["forget_norm"] == pytest.approx(math.sqrt(14))
    assert row["kept_energy"] == pytest.approx(13 / 14)
    assert row["survives"] == pytest.approx(2 / math.sqrt(13))
    assert row["retain_columns"] == 1 and row["d_out"] == 4


def test_the_doubling_sweep_stops_after_the_first_point_past_the_bound():
    seen = []

    def point(scale):  # a held-out NLL that rises by 0.01 lambda^2 from 2.0
        seen.append(scale)
        return {"tune_retain_nll": 2.0 + 0.01 * scale**2, "forget_nll": 1.0 + scale}

    rows = doubling_sweep(point, [0.5, 1, 2, 4, 8, 16], 2.0, 0.5)
    assert seen == [0.5, 1, 2, 4, 8]  # 8: rise 0.64 > 0.5, so 16 is not evaluated
    assert [r["stopped"] for r in rows] == [False, False, False, False, True]
    assert len(doubling_sweep(point, [1, 2], 2.0, 0.5)) == 2  # never crossed: the whole grid
    with pytest.raises(ValueError, match="ascending"):
        doubling_sweep(point, [2, 1], 2.0, 0.5)
    with pytest.raises(ValueError, match="stop_rise"):
        doubling_sweep(point, [1], 2.0, 0.0)


def test_the_matching_lambda_is_the_first_to_reach_the_target_else_the_largest():
    rows = [{"scale": 4, "forget_rise": 0.3}, {"scale": 1, "forget_rise": 0.05}, {"scale": 2, "forget_rise": 0.12}]
    assert matching_scale(rows, 0.1) == (2.0, True)
    assert matching_scale(rows, 0.3) == (4.0, True)
    assert matching_scale(rows, 1.0) == (4.0, False)
    with pytest.raises(ValueError, match="no points"):
        matching_scale([], 0.1)


def _cfg(**study):
    base = {
        "starts": ["finetuned"],
        "projectors": ["k"],
        "ranks": [4],
        "methods": ["qr_erase"],
        "scales": [1, 2],
        "stop_rise": 0.5,
        "protocol_ranks": [4],
        "baselines": ["npo"],
        "epochs": [1],
    }
    return {
        "tracks": ["tofu"],
        "lora": {"r": 16},
        "tradeoff": {"max_retain_nll_rise": 0.1},
        "construction": {**base, **study},
    }


@pytest.mark.parametrize(
    ("study", "message"),
    [
        ({"ranks": [4, 32]}, "construction.ranks': \\[32\\] exceed lora.r = 16"),
        ({"protocol_ranks": [8]}, "construction.protocol_ranks': \\[8\\] are not in"),
        ({"scales": [2, 1]}, "construction.scales': expected ascending"),
        ({"baselines": ["nope"]}, "construction.baselines': \\['nope'\\] are not text baselines"),
        ({"methods": ["npo"]}, "construction.methods': \\['npo'\\] are not subspace methods"),
    ],
)
def test_bad_construction_settings_are_refused_naming_the_key(study, message):
    with pytest.raises(ValueError, match=message):
        check_construction(_cfg(**study), ["ga", "npo"], ["qr_erase"])
    check_construction(_cfg(), ["ga", "npo"], ["qr_erase"])  # the good one passes
    with pytest.raises(ValueError, match="has a trade-off sweep with a held-out slice"):
        check_construction(_cfg(), ["npo"], ["qr_erase"], tracks=[])


def _sweep(method, values, stopped_last=True):
    rows = []
    for i, (scale, f, t) in enumerate(values):
        rows.append(
            {
                "start": "finetuned",
                "projector": "k",
                "rank": 4,
                "method": method,
                "scale": scale,
                "forget_nll": 1.0 + f,
                "retain_nll": 2.0,
                "tune_retain_nll": 3.0 + t,
                "forget_rise": f,
                "tune_retain_rise": t,
                "stopped": stopped_last and i == len(values) - 1,
            }
        )
    return pd.DataFrame(rows)


def test_variant_rows_read_the_rule_and_the_selectivity_from_the_sweep_alone():
    unedited = {"forget_nll": 1.0, "retain_nll": 2.0, "tune_retain_nll": 3.0}
    sweep = _sweep("qr_erase", [(1, 0.1, 0.05), (2, 0.4, 0.15), (4, 1.0, 0.6)])
    picks = pd.DataFrame(
        [
            {
                "start": "finetuned",
                "projector": "k",
                "rank": 4,
                "method": "qr_erase",
                "model_utility": 0.4,
                "forget_quality": 0.02,
            }
        ]
    )
    (row,) = variant_rows(sweep, picks, unedited, 0.1).to_dict("records")
    assert row["pick"] == 1 and row["forget_rise"] == pytest.approx(0.1)
    # held-out rise 0.1 is crossed halfway between lambda 1 and 2: forget rise 0.25 there, / 0.1
    assert row["selectivity"] == pytest.approx(2.5)
    assert row["largest_scale"] == 4 and row["stopped"] and row["max_forget_rise"] == pytest.approx(1.0)
    assert (row["model_utility"], row["forget_quality"]) == (0.4, 0.02)
    frame = with_unedited(sweep, unedited)
    assert list(frame["scale"]) == [0, 1, 2, 4] and frame["tune_retain_nll"].iloc[0] == 3.0


def test_baseline_rows_pick_the_most_epochs_within_the_bound_and_fill_the_main_tables_point():
    unedited = {"forget_nll": 1.0, "retain_nll": 2.0, "tune_retain_nll": 3.0}
    sweep = pd.DataFrame(
        [
            {"method": "npo", "epochs": e, "forget_nll": 1.0 + f, "tune_retain_nll": 3.0 + t}
            for e, f, t in [(1, 0.2, 0.02), (2, 0.5, 0.08), (5, 2.0, 0.4)]
        ]
    )
    points = pd.DataFrame([{"method": "npo", "epochs": 1, "model_utility": 0.5, "forget_quality": 0.01}])
    metrics = {
        "npo": pd.DataFrame({"model": "npo", "metric": ["model_utility", "forget_quality"], "value": [0.3, 0.2]})
    }
    rows = baseline_rows(sweep, points, metrics, unedited, 0.1)
    assert list(rows["picked"]) == [False, True, False]
    assert rows["forget_rise"].tolist() == pytest.approx([0.2, 0.5, 2.0])
    assert rows["model_utility"].iloc[0] == 0.5 and math.isnan(rows["model_utility"].iloc[1])
    assert (rows["model_utility"].iloc[2], rows["forget_quality"].iloc[2]) == (0.3, 0.2)


def test_module_summary_averages_per_variant_and_module_type():
    modules = pd.DataFrame(
        [
            {
                "start": "finetuned",
                "projector": "k",
                "rank": 4,
                "method": "qr_erase",
                "module": f"model.layers.{i}.{kind}",
                "forget_norm": n,
                "kept_energy": e,
                "survives": s,
                "retain_columns": 4,
            }
            for i, kind, n, e, s in [
                (0, "q_proj", 1.0, 0.8, 0.9),
                (1, "q_proj", 3.0, 0.6, 0.7),
                (0, "v_proj", 2.0, 1.0, 0.5),
            ]
        ]
    )
    out = module_summary(modules).set_index("kind")
    assert out.loc["q_proj", "modules"] == 2 and out.loc["q_proj", "forget_norm"] == pytest.approx(2.0)
    assert out.loc["q_proj", "kept_energy"] == pytest.approx(0.7) and out.loc["v_proj", "survives"] == 0.5
