"""Layer energy (eq. 14) and selection (eq. 15) against hand-computed numbers; block parsing; bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

import qrerase
from qrerase.method.energy import (
    SELECT_RTOL,
    energy_from_norms,
    layer_energy,
    module_norms,
    modules_for_layers,
    select_layers,
    select_modules,
    selected_updates,
)
from qrerase.method.lowrank import LowRank
from qrerase.method.module_names import block_index, block_of


def _with_norm(norm: float, d_out: int = 6, d_in: int = 5, r: int = 2, seed: int = 0) -> LowRank:
    """Random factors B, A rescaled so that ‖B A‖_F = norm exactly (up to rounding)."""
    rng = np.random.default_rng(seed)
    B, A = rng.standard_normal((d_out, r)), rng.standard_normal((r, d_in))
    return LowRank(B * (norm / np.linalg.norm(B @ A)), A)


# Hand computation: module norms 3 and 4 in block 0 → ‖T^0‖ = 5; block 1: 12; block 2: 3.
# Block energies: 5/20 = 0.25, 12/20 = 0.6, 3/20 = 0.15; 1/|L| = 1/3 → only block "1" selected.
# Module energies: total 3 + 4 + 12 + 3 = 22 → 3/22, 4/22, 12/22, 3/22; 1/|L| = 0.25 → only the 12.
FACTORS = {
    "model.layers.2.mlp.up_proj": _with_norm(3.0, seed=3),
    "model.layers.0.self_attn.q_proj": _with_norm(3.0, seed=1),
    "model.layers.1.mlp.down_proj": _with_norm(12.0, seed=4),
    "model.layers.0.self_attn.v_proj": _with_norm(4.0, seed=2),
}


def test_block_energy_hand_computed():
    e = layer_energy(FACTORS, granularity="block")
    assert list(e) == ["0", "1", "2"]  # ordered by block index
    assert e == pytest.approx({"0": 0.25, "1": 0.6, "2": 0.15}, rel=1e-12)
    assert select_layers(e) == ["1"]
    assert modules_for_layers(["1"], FACTORS) == ["model.layers.1.mlp.down_proj"]
    assert modules_for_layers(["0", "2"], FACTORS) == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.2.mlp.up_proj",
    ]


def test_module_energy_hand_computed():
    e = layer_energy(FACTORS, granularity="module")
    assert list(e) == [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.1.mlp.down_proj",
        "model.layers.2.mlp.up_proj",
    ]
    assert list(e.values()) == pytest.approx([3 / 22, 4 / 22, 12 / 22, 3 / 22], rel=1e-12)
    assert select_layers(e) == ["model.layers.1.mlp.down_proj"]
    assert select_modules(FACTORS, "module") == ["model.layers.1.mlp.down_proj"]


def test_norms_from_factors_equal_dense_and_trace_formula():
    norms = module_norms(FACTORS)
    for m, lr in FACTORS.items():
        dense = np.linalg.norm(lr.dense())
        trace = math.sqrt(np.trace((lr.B.T @ lr.B) @ (lr.A @ lr.A.T)))
        assert norms[m] == pytest.approx(dense, rel=1e-12) == pytest.approx(trace, rel=1e-12)
    assert module_norms({"x": (np.ones((2, 1)), np.ones((1, 3)))}) == {"x": pytest.approx(math.sqrt(6))}


def test_uniform_energy_selects_all_layers_despite_rounding():
    # ten equal blocks: every E_ℓ is 1/10 mathematically; rounding must not drop any of them
    norms = {f"model.layers.{i}.mlp.up_proj": 0.1 for i in range(10)}
    e = energy_from_norms(norms)
    assert select_layers(e) == [str(i) for i in range(10)]
    # the tolerance is tiny: a layer 1e-6 below average is not selected
    almost = {"a.layers.0.x": 1.0 - 1e-6, "a.layers.1.x": 1.0 + 1e-6}
    assert select_layers(energy_from_norms(almost)) == ["1"]
    assert select_layers({"0": (1 - SELECT_RTOL / 2) / 2, "1": 0.5}) == ["0", "1"]


@pytest.mark.parametrize(
    "name, block",
    [
        ("model.layers.3.mlp.up_proj", 3),
        ("hubert.encoder.layers.2.attention.q_proj", 2),
        ("transformer.h.5.attn.c_attn", 5),
        ("bert.encoder.layer.11.attention.self.query", 11),
        ("vision.blocks.7.mlp.fc1", 7),
        ("layers.0.q", 0),
        ("model.layers.12.mlp.experts.3.w1", 12),
    ],
)
def test_block_of(name, block):
    assert block_of(name) == block == block_index(name)


@pytest.mark.parametrize("name", ["lm_head", "model.embed_tokens", "model.hidden.3.q", "model.layers.x.q"])
def test_unmappable_block_names(name):
    assert block_of(name) is None
    with pytest.raises(ValueError, match=rf"module '{name}': cannot map to a transformer block"):
        block_index(name)
    factors = {"model.layers.0.mlp.up_proj": _with_norm(1.0), name: _with_norm(2.0)}
    with pytest.raises(ValueError, match=rf"'{name}'"):
        layer_energy(factors, granularity="block")
    e = layer_energy(factors, granularity="module")  # fine per module
    assert e[name] == pytest.approx(2 / 3)


def test_zero_energy():
    zero = {
        "model.layers.0.q_proj": (np.zeros((4, 2)), np.ones((2, 3))),
        "model.layers.1.q_proj": (np.ones((4, 2)), np.zeros((2, 3))),
    }
    with pytest.raises(ValueError, match=r"all 2 task matrices are zero.*model.layers.0.q_proj"):
        layer_energy(zero)
    # one zero layer among non-zero ones is fine (energy 0, not selected)
    ok = dict(zero, **{"model.layers.2.q_proj": _with_norm(1.0, 4, 3)})
    e = layer_energy(ok)
    assert e == {"0": 0.0, "1": 0.0, "2": 1.0} and select_layers(e) == ["2"]


def test_bad_inputs():
    with pytest.raises(ValueError, match="no modules"):
        layer_energy({})
    with pytest.raises(ValueError, match="granularity"):
        layer_energy(FACTORS, granularity="head")
    bad = {"model.layers.0.q_proj": (np.array([[np.nan], [1.0]]), np.ones((1, 3)))}
    with pytest.raises(ValueError, match=r"model.layers.0.q_proj.*NaN or Inf"):
        layer_energy(bad)
    with pytest.raises(ValueError, match="no layers"):
        select_layers({})


def test_selected_updates_keeps_the_modules_of_the_selected_layers(tmp_path):
    """Eq. 16 on rule energy's own output: the selection file written from FACTORS' energies keeps
    the updates of the selected layers' modules, in the file's order; None keeps all (eq. 6)."""
    from qrerase.io import write_json

    selected = select_layers(layer_energy(FACTORS))
    modules = modules_for_layers(selected, FACTORS)
    path = tmp_path / "selected.json"
    write_json(path, {"granularity": "block", "layers": selected, "modules": modules})
    updates = {name: f"update of {name}" for name in reversed(list(FACTORS))}
    kept = selected_updates(updates, path)
    assert modules == ["model.layers.1.mlp.down_proj"] and list(kept) == modules and set(kept) < set(updates)
    assert all(kept[m] == f"update of {m}" for m in modules)
    assert selected_updates(updates, None) == updates
    with pytest.raises(ValueError, match=r"selected.json: selected modules \['model.layers"):
        selected_updates({"model.layers.9.q_proj": 0}, path)
    (tmp_path / "bad.json").write_text('{"layers": ["0"]}')
    with pytest.raises(ValueError, match=r'bad.json: expected a "modules" list'):
        selected_updates(updates, tmp_path / "bad.json")


def test_public_names():
    assert qrerase.layer_energy is layer_energy and qrerase.select_layers is select_layers
