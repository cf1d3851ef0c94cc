"""Factored CPQR / SVD equal the dense scipy results; subspace discrimination (eqs. 3–5); diagnostics; bad input."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import scipy.linalg as sla
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import qrerase
from qrerase.method.decompose import decompose, decompose_dense
from qrerase.method.diagnostics import factor_report, max_sin_theta, rrqr_bound
from qrerase.method.discriminate import forget_update, forget_updates
from qrerase.method.lowrank import LowRank

PROPS = settings(max_examples=30, deadline=None, derandomize=True)


def _factors(seed, d_out, d_in, r):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((d_out, r)), rng.standard_normal((r, d_in))


def _proj(Q):
    return Q @ Q.T


def _unpivot(M, piv):
    """Columns of M (given in pivoted order) back in the original order: M Πᵀ."""
    out = np.empty_like(M)
    out[:, piv] = M
    return out


shapes = st.tuples(
    st.integers(0, 2**31 - 1),  # seed
    st.integers(1, 40),  # d_out
    st.integers(1, 40),  # d_in
    st.integers(1, 10),  # r
    st.floats(0, 1),  # k as a fraction of the available rank
)


def _unpack(params):
    seed, d_out, d_in, r, frac = params
    avail = min(d_out, d_in, r)
    k = 1 + int(frac * (avail - 1))
    return seed, d_out, d_in, r, k, avail


# ---------------------------------------------------------------------------------------------- CPQR


@PROPS
@given(shapes)
def test_factored_cpqr_equals_dense_xgeqp3(params):
    seed, d_out, d_in, r, k, avail = _unpack(params)
    B, A = _factors(seed, d_out, d_in, r)
    T = B @ A
    scale = np.linalg.norm(T)
    f = decompose(B, A, k, "cpqr")
    Q, R, P = sla.qr(T, pivoting=True, mode="economic")
    # pivots: all that T determines (beyond rank(T) the dense pivots follow rounding noise)
    assert np.array_equal(f.piv[:avail], P[:avail])
    assert sorted(f.piv.tolist()) == list(range(d_in))
    # subspace (projector distance, eq. 11) and the rank-k product T_k = Q_k R_k Πᵀ
    assert np.allclose(_proj(f.Q), _proj(Q[:, :k]), atol=1e-8)
    assert np.allclose(f.approx(), _unpivot(Q[:, :k] @ R[:k], P), atol=1e-9 * scale)
    # with the sign convention diag(R_11) ≥ 0 the bases agree column by column
    signs = np.where(np.diag(R)[:k] < 0, -1.0, 1.0)
    assert np.allclose(f.Q, Q[:, :k] * signs, atol=1e-7)
    # dense path (the decomposition on a dense T) is scipy's result
    d = decompose_dense(T, k, "cpqr")
    assert np.array_equal(d.piv, P)
    assert np.allclose(d.Q, Q[:, :k] * signs, atol=1e-12)
    assert np.allclose(d.approx(), _unpivot(Q[:, :k] @ R[:k], P), atol=1e-12 * scale)
    assert np.allclose(d.diag, np.abs(np.diag(R)))
    # invariants
    assert f.Q.shape == (d_out, k) and f.R.shape == (k, d_in)
    assert np.allclose(f.Q.T @ f.Q, np.eye(k), atol=1e-10)
    assert math.isclose(f.fro_norm, scale, rel_tol=1e-10)
    assert math.isclose(f.residual_norm, np.linalg.norm(T - f.approx()), rel_tol=1e-6, abs_tol=1e-9 * scale)
    assert np.allclose(f.singular_values, sla.svdvals(T)[:avail], atol=1e-10 * scale)
    assert len(f.diag) == min(avail, d_in) and np.all(np.diff(f.diag[:avail]) <= 1e-9 * scale)


# ----------------------------------------------------------------------------------------------- SVD


@PROPS
@given(shapes)
def test_factored_svd_equals_dense_gesdd(params):
    seed, d_out, d_in, r, k, avail = _unpack(params)
    B, A = _factors(seed, d_out, d_in, r)
    T = B @ A
    scale = np.linalg.norm(T)
    U, s, Vt = sla.svd(T, full_matrices=False, lapack_driver="gesdd")
    assume(k == len(s) or s[k - 1] - s[k] > 1e-6 * s[0])  # the rank-k subspace is well defined
    f = decompose(B, A, k, "svd")
    assert np.allclose(f.singular_values, s[:avail], atol=1e-10 * scale)
    assert np.allclose(f.diag, s[:avail], atol=1e-10 * scale)
    assert f.piv is None
    assert np.allclose(_proj(f.Q), _proj(U[:, :k]), atol=1e-6)
    assert np.allclose(f.approx(), U[:, :k] @ (s[:k, None] * Vt[:k]), atol=1e-8 * scale)
    assert math.isclose(f.residual_norm, np.linalg.norm(T - f.approx()), rel_tol=1e-6, abs_tol=1e-9 * scale)
    d = decompose(T, None, k, "svd")  # dense path via A=None
    assert not d.factored and f.factored
    assert np.allclose(d.approx(), f.approx(), atol=1e-8 * scale)
    assert np.allclose(d.Q, f.Q, atol=1e-6)  # same sign convention on both paths


# -------------------------------------------------------------------------------- discrimination (3–5)


def _dense_forget_update(Tf, Tr, k, kr, decomp):
    """Eqs. 3–5 literally, with dense scipy factorisations and an explicit I − P_r."""
    n = Tf.shape[0]
    if decomp == "cpqr":
        Qf, Rf, Pf = sla.qr(Tf, pivoting=True, mode="economic")
        Qr = sla.qr(Tr, pivoting=True, mode="economic")[0][:, :kr]
        core = _unpivot(Rf[:k], Pf)
    else:
        Qf, sf, Vtf = sla.svd(Tf, full_matrices=False)
        Qr = sla.svd(Tr, full_matrices=False)[0][:, :kr]
        core = sf[:k, None] * Vtf[:k]
    P_r = Qr @ Qr.T
    return (np.eye(n) - P_r) @ Qf[:, :k] @ core


@PROPS
@given(shapes, st.integers(1, 10), st.sampled_from(["cpqr", "svd"]), st.floats(0.1, 3.0))
def test_forget_update_equals_dense_equations(params, r_retain, decomp, lam):
    seed, d_out, d_in, r, k, avail = _unpack(params)
    Bf, Af = _factors(seed, d_out, d_in, r)
    Br, Ar = _factors(seed + 1, d_out, d_in, r_retain)
    kr = min(r_retain, d_out, d_in, k)
    Tf, Tr = Bf @ Af, Br @ Ar
    if decomp == "svd":
        sf = sla.svdvals(Tf)
        sr = sla.svdvals(Tr)
        assume(k == len(sf) or sf[k - 1] - sf[k] > 1e-6 * sf[0])
        assume(kr == len(sr) or sr[kr - 1] - sr[kr] > 1e-6 * sr[0])
    expected = lam * _dense_forget_update(Tf, Tr, k, kr, decomp)
    U, V = forget_update(LowRank(Bf, Af), (Br, Ar), k, decomp, retain_rank=kr, scale=lam)
    assert U.shape == (d_out, k) and V.shape == (k, d_in)
    tol = 1e-7 * lam * np.linalg.norm(Tf)
    assert np.allclose(U @ V, expected, atol=tol)
    # dense inputs go through decompose_dense and give the same edit
    Ud, Vd = forget_update(Tf, Tr, k, decomp, retain_rank=kr, scale=lam)
    assert np.allclose(Ud @ Vd, expected, atol=tol)
    # Q̃_f is orthogonal to the retain basis
    Qr = decompose(Br, Ar, kr, decomp).Q
    assert np.allclose(Qr.T @ U, 0, atol=1e-9 * lam)


def test_forget_update_removes_shared_directions():
    rng = np.random.default_rng(0)
    n, r = 30, 3
    shared = np.linalg.qr(rng.standard_normal((n, r)))[0]
    Tf = shared @ rng.standard_normal((r, n))
    U, V = forget_update(Tf, Tf.copy(), r)  # retain spans the same column space → nothing to erase
    assert np.allclose(U @ V, 0, atol=1e-10)


def test_public_names():
    assert qrerase.decompose is decompose and qrerase.forget_update is forget_update


def test_forget_updates_dict_level_and_modules_subset():
    rng = np.random.default_rng(1)
    names = ["model.layers.1.mlp.up_proj", "model.layers.0.self_attn.q_proj"]
    forget = {m: (rng.standard_normal((12, 4)), rng.standard_normal((4, 10))) for m in names}
    retain = {m: LowRank(rng.standard_normal((12, 4)), rng.standard_normal((4, 10))) for m in reversed(names)}
    ups = forget_updates(forget, retain, 2)
    assert list(ups) == names  # order follows `forget`
    for m in names:
        U, V = ups[m]
        U1, V1 = forget_update(forget[m], retain[m], 2)
        assert np.array_equal(U, U1) and np.array_equal(V, V1)
    sub = forget_updates(forget, retain, 2, modules=[names[1]], scale=2.0)
    assert list(sub) == [names[1]]
    assert np.allclose(sub[names[1]].U, 2 * ups[names[1]].U)


# -------------------------------------------------------------------------------------- diagnostics


def test_max_sin_theta_matches_scipy_subspace_angles():
    rng = np.random.default_rng(2)
    for k in (1, 3, 5):
        Q1 = np.linalg.qr(rng.standard_normal((20, k)))[0]
        Q2 = np.linalg.qr(Q1 + 0.1 * rng.standard_normal((20, k)))[0]
        expected = np.sin(sla.subspace_angles(Q1, Q2).max())
        assert math.isclose(max_sin_theta(Q1, Q2), expected, rel_tol=1e-8)
        assert max_sin_theta(Q1, Q1 @ np.linalg.qr(rng.standard_normal((k, k)))[0]) < 1e-14


def test_rrqr_bound_conventions():
    rng = np.random.default_rng(3)
    B, A = rng.standard_normal((20, 5)), rng.standard_normal((5, 15))
    full = decompose(B, A, 5, "cpqr")
    assert rrqr_bound(full) == 0.0  # k = rank: σ_{k+1} = 0
    d = decompose(B, A, 2, "cpqr")
    s = d.singular_values
    R11 = d.R[:, d.piv[:2]]
    assert np.allclose(np.tril(R11, -1), 0)  # leading block of R in pivoted order is upper triangular
    assert math.isclose(rrqr_bound(d), s[2] * np.linalg.norm(np.linalg.inv(R11), 2), rel_tol=1e-10)
    R = d.R.copy()
    R[1, d.piv[1]] = 0.0  # make R_11 singular
    assert rrqr_bound(dataclasses.replace(d, R=R)) == math.inf
    with pytest.raises(ValueError):
        rrqr_bound(decompose(B, A, 2, "svd"))


def test_factor_report_columns_and_values():
    rng = np.random.default_rng(4)
    names = [f"model.layers.{b}.self_attn.{p}" for b in (1, 0) for p in ("v_proj", "q_proj")]
    forget = {m: LowRank(rng.standard_normal((16, 4)), rng.standard_normal((4, 12))) for m in names}
    retain = {m: LowRank(rng.standard_normal((16, 4)), rng.standard_normal((4, 12))) for m in names}
    df = factor_report(forget, retain, 2, retain_rank=4)
    required = [
        "set", "module", "block", "d_out", "d_in", "lora_rank", "rank", "fro_norm", "energy",
        "recon_err_cpqr", "recon_err_svd", "max_sin_theta_qr_vs_svd", "bound_sigma_k1_r11inv",
    ]  # fmt: skip
    assert all(c in df.columns for c in required)
    assert len(df) == 8
    assert df["set"].tolist() == ["forget"] * 4 + ["retain"] * 4
    order = sorted(names, key=lambda m: (int(m.split(".")[2]), m))
    assert df["module"].tolist() == order * 2
    assert df["block"].tolist() == [0, 0, 1, 1] * 2
    assert (df["rank"] == [2] * 4 + [4] * 4).all()
    f = df[df.set == "forget"]
    assert (f.recon_err_svd <= f.recon_err_cpqr + 1e-12).all()
    assert ((f.recon_err_cpqr > 0) & (f.recon_err_cpqr < 1)).all()
    for _, row in f.iterrows():
        T = forget[row.module].dense()
        Tk = decompose(forget[row.module], None, 2, "cpqr").approx()
        assert math.isclose(row.recon_err_cpqr, np.linalg.norm(T - Tk) / np.linalg.norm(T), rel_tol=1e-8)
        assert math.isclose(row.fro_norm, np.linalg.norm(T), rel_tol=1e-10)
    r = df[df.set == "retain"]  # k = r: exact reconstruction, identical subspaces, bound 0
    assert (r.recon_err_cpqr < 1e-12).all() and (r.max_sin_theta_qr_vs_svd < 1e-10).all()
    assert (r.bound_sigma_k1_r11inv == 0).all()
    assert math.isclose(f.groupby("block")["energy"].first().sum(), 1.0)
    assert df.equals(factor_report(forget, retain, 2, retain_rank=4))  # deterministic


# ----------------------------------------------------------------------------------------- bad input

NAME = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    "B_shape, A_shape, k, pattern",
    [
        ((8, 4), (4, 6), 5, r"k=5 exceeds the available rank 4"),  # k > r
        ((3, 4), (4, 6), 4, r"k=4 exceeds the available rank 3"),  # k > min(d_out, d_in)
        ((8, 4), (4, 6), 0, r"k=0 must be positive"),
        ((8, 4), (4, 6), -2, r"must be positive"),
        ((8, 4), (4, 6), 2.5, r"integer"),
        ((8, 4), (3, 6), 2, r"B \(d_out×r\) and A \(r×d_in\)"),
    ],
)
def test_bad_rank_and_shapes(B_shape, A_shape, k, pattern):
    rng = np.random.default_rng(0)
    B, A = rng.standard_normal(B_shape), rng.standard_normal(A_shape)
    with pytest.raises(ValueError, match=pattern) as ei:
        decompose(B, A, k, "cpqr", name=NAME)
    assert NAME in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("decomp", ["cpqr", "svd"])
@pytest.mark.parametrize("where", ["B", "A"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_factors(decomp, where, bad):
    rng = np.random.default_rng(0)
    B, A = rng.standard_normal((8, 4)), rng.standard_normal((4, 6))
    (B if where == "B" else A)[1, 2] = bad
    with pytest.raises(ValueError, match=rf"{NAME}.*NaN or Inf.*B 8×4, A 4×6"):
        decompose(B, A, 2, decomp, name=NAME)
    with pytest.raises(ValueError, match=NAME):
        forget_updates({NAME: (B, A)}, {NAME: (np.ones((8, 4)), np.ones((4, 6)))}, 1)


@pytest.mark.parametrize("decomp", ["cpqr", "svd"])
def test_zero_task_matrix(decomp):
    with pytest.raises(ValueError, match=rf"{NAME}.*all zero"):
        decompose(np.zeros((8, 4)), np.ones((4, 6)), 2, decomp, name=NAME)
    with pytest.raises(ValueError, match=rf"{NAME}.*all zero"):
        decompose(np.ones((8, 4)) * [1, -1, 0, 0], np.ones((4, 6)), 1, decomp, name=NAME)  # BA = 0, B, A ≠ 0
    with pytest.raises(ValueError, match=rf"{NAME}.*all zero.*T 8×6"):
        decompose_dense(np.zeros((8, 6)), 2, decomp, name=NAME)
    with pytest.raises(ValueError, match="NaN or Inf"):
        decompose_dense(np.full((3, 3), np.nan), 1, decomp, name=NAME)


def test_bad_decomp():
    with pytest.raises(ValueError, match="decomp"):
        decompose(np.ones((3, 1)), np.ones((1, 3)), 1, "lu")


def test_method_is_a_deprecated_alias_of_decomp(tmp_path):
    """``method=`` (the old name of the decomposition) still works for one release, with a DeprecationWarning
    naming ``decomp``; it gives the same result as ``decomp=``; both given and different → TypeError."""
    import json

    from qrerase.io import save_arrays
    from qrerase.method.formats import load_decompositions

    B, A = _factors(3, 9, 7, 4)
    new = decompose(B, A, 2, decomp="svd")
    with pytest.warns(DeprecationWarning, match=r"decompose\(method=\.\.\.\) is deprecated.*decomp="):
        old = decompose(B, A, 2, method="svd")
    assert old.decomp == "svd" and np.array_equal(old.Q, new.Q) and np.array_equal(old.R, new.R)
    with pytest.warns(DeprecationWarning, match=r"Decomposition\.method is deprecated; use Decomposition\.decomp"):
        assert new.method == "svd"
    Tr = _factors(4, 9, 7, 4)
    with pytest.warns(DeprecationWarning, match=r"forget_update\(method="):
        U, V = forget_update((B, A), Tr, 2, method="svd", scale=0.5)
    U2, V2 = forget_update((B, A), Tr, 2, decomp="svd", scale=0.5)
    assert np.array_equal(U, U2) and np.array_equal(V, V2)
    for call in (
        lambda: forget_updates({"m": (B, A)}, {"m": Tr}, 2, method="svd"),
        lambda: decompose_dense(B @ A, 2, method="svd"),
    ):
        with pytest.warns(DeprecationWarning, match=r"\(method=\.\.\.\) is deprecated"):
            call()
    with pytest.raises(TypeError, match=r"decompose: got decomp='svd' and the deprecated method='cpqr'"):
        with pytest.warns(DeprecationWarning):
            decompose(B, A, 2, "svd", method="cpqr")
    # a decompositions file written before the rename (metadata key "method") still loads
    meta = {"m": {"method": "cpqr", "rank": 2, "fro_norm": 1.0, "residual_norm": 0.5, "factored": True}}
    arrays = {"m.Q": np.eye(3)[:, :2], "m.R": np.ones((2, 4)), "m.diag": np.ones(3)}
    save_arrays(tmp_path / "old.safetensors", arrays, metadata={"qrerase": json.dumps(meta)})
    assert load_decompositions(tmp_path / "old.safetensors")["m"].decomp == "cpqr"


def test_forget_retain_mismatch():
    rng = np.random.default_rng(0)
    f = (rng.standard_normal((8, 4)), rng.standard_normal((4, 6)))
    r = (rng.standard_normal((8, 4)), rng.standard_normal((4, 7)))
    with pytest.raises(ValueError, match=rf"{NAME}.*forget task matrix is 8×6 but retain task matrix is 8×7"):
        forget_update(f, r, 2, name=NAME)
    with pytest.raises(ValueError, match=rf"{NAME}.*8×6.*8×7"):
        forget_updates({NAME: f}, {NAME: r}, 2)
    other = "model.layers.1.mlp.up_proj"
    leaf = NAME.rsplit(".", 1)[-1]
    with pytest.raises(
        ValueError, match=rf"only forget has {leaf} \(1 module: {NAME}\); only retain has up_proj \(1 module: {other}\)"
    ):
        forget_updates({NAME: f}, {other: f}, 2)
    with pytest.raises(ValueError, match=rf"{NAME}.*retain rank k=5 exceeds|{NAME}.*k=5 exceeds"):
        forget_updates({NAME: f}, {NAME: f}, 2, retain_rank=5)
    with pytest.raises(ValueError, match="scale"):
        forget_update(f, f, 2, scale=float("nan"), name=NAME)


# ----------------------------------------------------------------------- stored decompositions/updates


def test_discriminate_from_stored_decompositions_equals_forget_update(tmp_path):
    from qrerase.method.discriminate import discriminate
    from qrerase.method.formats import load_decompositions, load_updates, save_decompositions, save_updates

    rng = np.random.default_rng(5)
    names = ["model.layers.1.mlp.up_proj", "model.layers.0.self_attn.q_proj"]
    forget = {m: LowRank(rng.standard_normal((14, 5)), rng.standard_normal((5, 11))) for m in names}
    retain = {m: LowRank(rng.standard_normal((14, 5)), rng.standard_normal((5, 11))) for m in names}
    for decomp in ("cpqr", "svd"):
        fd = {m: decompose(f, None, 3, decomp, name=m) for m, f in forget.items()}
        rd = {m: decompose(f, None, 3, decomp, name=m) for m, f in retain.items()}
        save_decompositions(tmp_path / f"f_{decomp}.safetensors", fd)
        save_decompositions(tmp_path / f"r_{decomp}.safetensors", rd)
        fl = load_decompositions(tmp_path / f"f_{decomp}.safetensors")
        rl = load_decompositions(tmp_path / f"r_{decomp}.safetensors")
        assert list(fl) == sorted(names, key=lambda m: int(m.split(".")[2]))
        for m in names:
            a, b = fd[m], fl[m]
            assert (a.decomp, a.rank, a.fro_norm, a.residual_norm, a.factored) == (
                b.decomp,
                b.rank,
                b.fro_norm,
                b.residual_norm,
                b.factored,
            )
            assert np.array_equal(a.Q, b.Q) and np.array_equal(a.R, b.R) and np.array_equal(a.diag, b.diag)
            assert (a.piv is None) == (b.piv is None) and (a.piv is None or np.array_equal(a.piv, b.piv))
        for kr in (None, 2):
            ups = discriminate(fl, rl, retain_rank=kr, scale=0.5)
            for m in names:
                U, V = forget_update(forget[m], retain[m], 3, decomp, retain_rank=kr or 3, scale=0.5)
                assert np.allclose(ups[m].U @ ups[m].V, U @ V, atol=1e-12)
        save_updates(tmp_path / f"u_{decomp}.safetensors", ups)
        back = load_updates(tmp_path / f"u_{decomp}.safetensors")
        assert all(np.array_equal(back[m].U, ups[m].U) and np.array_equal(back[m].V, ups[m].V) for m in names)
    m = names[1]  # first in block order
    with pytest.raises(ValueError, match=rf"{m}.*retain rank k=4 exceeds the available rank 3"):
        discriminate(fl, rl, retain_rank=4)
    with pytest.raises(ValueError, match=rf"{m}.*forget decomposition is svd but retain decomposition is cpqr"):
        discriminate(fl, load_decompositions(tmp_path / "r_cpqr.safetensors"))
    bad = {m: (np.full((14, 3), np.nan), np.ones((3, 11)))}
    with pytest.raises(ValueError, match=rf"{m}.*NaN or Inf"):
        save_updates(tmp_path / "bad.safetensors", bad)
    assert not (tmp_path / "bad.safetensors").exists()
