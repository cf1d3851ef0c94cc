"""task_matrices on real PEFT-saved adapters equals PEFT's own merged delta; factor files; bad input."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from support.tiny_llama import build_tiny_llama, save_random_lora

import qrerase
from qrerase.method.adapters import load_factors, lora_scale, pattern_key, save_factors, task_matrices
from qrerase.method.lowrank import LowRank
from qrerase.method.module_names import module_sort_key

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

VARIANTS = {
    "plain": {},
    "patterns": dict(
        target_modules=["q_proj", "v_proj", "down_proj", "up_proj"],
        rank_pattern={"model.layers.1.self_attn.q_proj": 2, "down_proj": 6},
        alpha_pattern={"v_proj": 3, "model.layers.0.mlp.up_proj": 20},
    ),
    "rslora": dict(r=8, lora_alpha=4, use_rslora=True, target_modules=["k_proj", "o_proj", "gate_proj"]),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def saved(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"adapter_{request.param}") / "adapter"
    path, delta = save_random_lora(out, seed=7, **VARIANTS[request.param])
    return request.param, path, delta


def test_task_matrices_equal_peft_merged_delta(saved):
    variant, path, delta = saved
    factors = task_matrices(path)
    assert set(factors) == set(delta)
    base = build_tiny_llama()
    modules = dict(base.named_modules())
    state = base.state_dict()
    for name, lr in factors.items():
        assert isinstance(lr, LowRank) and lr.B.dtype == np.float64 and lr.A.dtype == np.float64
        assert name in modules and f"{name}.weight" in state
        assert lr.shape == tuple(state[f"{name}.weight"].shape)
        np.testing.assert_allclose(lr.dense(), delta[name], rtol=1e-5, atol=1e-6)
    assert list(factors) == sorted(factors, key=module_sort_key)
    assert list(factors)[0].startswith("model.layers.0.")


def test_pattern_ranks_and_scales(tmp_path):
    path, _ = save_random_lora(tmp_path / "a", **VARIANTS["patterns"])
    f = task_matrices(path)
    assert f["model.layers.1.self_attn.q_proj"].rank == 2
    assert f["model.layers.0.self_attn.q_proj"].rank == 4
    assert f["model.layers.1.mlp.down_proj"].rank == 6
    raw = qrerase.io.load_arrays(path / "adapter_model.safetensors")
    key = "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"
    np.testing.assert_allclose(f["model.layers.0.mlp.up_proj"].B, raw[key].astype(np.float64) * (20 / 4), rtol=1e-12)
    assert pattern_key({"v_proj": 1}, "model.layers.0.self_attn.v_proj") == "v_proj"
    assert pattern_key({"v_proj": 1}, "model.layers.0.self_attn.kv_proj") is None
    assert lora_scale(8, 4) == 2.0 and lora_scale(4, 16, use_rslora=True) == 1.0


def test_public_name_and_factor_file_roundtrip(lora_pair, tmp_path):
    factors = qrerase.task_matrices(lora_pair[0])
    out = tmp_path / "factors.safetensors"
    save_factors(out, factors)
    keys = set(qrerase.io.load_arrays(out))
    assert keys == {f"{m}.{w}" for m in factors for w in ("A", "B")}
    back = load_factors(out)
    assert list(back) == list(factors)
    for m in factors:
        assert np.array_equal(back[m].B, factors[m].B) and np.array_equal(back[m].A, factors[m].A)


def test_save_factors_bad_input_writes_nothing(tmp_path):
    out = tmp_path / "sub" / "f.safetensors"
    bad = {"model.layers.0.mlp.up_proj": (np.array([[np.inf, 1.0]]), np.ones((2, 3)))}
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.up_proj.*NaN or Inf"):
        save_factors(out, bad)
    assert not out.exists()


# ----------------------------------------------------------------------------------------- bad input


def test_missing_adapter(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        task_matrices(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        task_matrices(tmp_path / "empty")


def test_missing_or_unreadable_weights(lora_pair, tmp_path):
    d = tmp_path / "a"
    shutil.copytree(lora_pair[0], d)
    (d / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"adapter_model.safetensors"):
        task_matrices(d)
    (d / "adapter_model.safetensors").write_bytes(b"\x08\x00garbage")
    with pytest.raises(ValueError, match=r"adapter_model.safetensors.*not a readable"):
        task_matrices(d)
    (d / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"adapter_config.json.*JSON"):
        task_matrices(d)


def _rewrite(src, dst, edit_cfg=None, edit_weights=None):
    shutil.copytree(src, dst)
    if edit_cfg:
        cfg = json.loads((dst / "adapter_config.json").read_text())
        edit_cfg(cfg)
        (dst / "adapter_config.json").write_text(json.dumps(cfg))
    if edit_weights:
        w = qrerase.io.load_arrays(dst / "adapter_model.safetensors")
        edit_weights(w)
        qrerase.io.save_arrays(dst / "adapter_model.safetensors", w)
    return dst


def test_non_finite_adapter(lora_pair, tmp_path):
    key = "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight"

    def poison(w):
        w[key] = w[key].copy()
        w[key][0, 0] = np.nan

    d = _rewrite(lora_pair[0], tmp_path / "a", edit_weights=poison)
    with pytest.raises(ValueError, match=r"module 'model.layers.1.mlp.up_proj'.*NaN or Inf.*B 128×4, A 4×64"):
        task_matrices(d)


def test_unsupported_and_inconsistent_adapters(lora_pair, tmp_path):
    d = _rewrite(lora_pair[0], tmp_path / "dora", edit_cfg=lambda c: c.update(use_dora=True))
    with pytest.raises(ValueError, match="DoRA"):
        task_matrices(d)
    d = _rewrite(lora_pair[0], tmp_path / "rank", edit_cfg=lambda c: c.update(r=8))
    with pytest.raises(ValueError, match=r"module 'model.layers.0.mlp.down_proj'.*rank 4.*says 8"):
        task_matrices(d)
    d = _rewrite(
        lora_pair[0],
        tmp_path / "half",
        edit_weights=lambda w: w.pop("base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"),
    )
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.k_proj.*lora_A but no lora_B"):
        task_matrices(d)
    d = _rewrite(
        lora_pair[0],
        tmp_path / "emb",
        edit_weights=lambda w: w.update({"base_model.model.model.embed_tokens.lora_embedding_A": np.ones((4, 128))}),
    )
    with pytest.raises(ValueError, match="lora_embedding_A"):
        task_matrices(d)


def test_dense_only_when_asked(lora_pair):
    f = task_matrices(lora_pair[0])
    lr = f["model.layers.0.mlp.down_proj"]
    assert lr.B.shape == (64, 4) and lr.A.shape == (4, 128) and lr.rank == 4 and lr.shape == (64, 128)
    assert math.isclose(lr.fro_norm(), np.linalg.norm(lr.dense()), rel_tol=1e-12)


def test_adapters_with_different_target_modules_name_both_directories(tmp_path):
    # issue 34: a forget / retain pair that adapts different modules is refused at factor_report in
    # one line naming both adapter directories and the differing target modules
    from qrerase.method.diagnostics import factor_report

    forget, _ = save_random_lora(tmp_path / "forget", seed=1, target_modules=["q_proj", "v_proj"])
    retain, _ = save_random_lora(tmp_path / "retain", seed=2, target_modules=["q_proj", "k_proj"])
    with pytest.raises(ValueError) as err:
        factor_report(task_matrices(forget), task_matrices(retain), 2, names=(str(forget), str(retain)))
    assert str(err.value) == (
        f"forget adapter {forget} and retain adapter {retain} adapt different modules: "
        "only forget has v_proj (2 modules: model.layers.0.self_attn.v_proj, model.layers.1.self_attn.v_proj); "
        "only retain has k_proj (2 modules: model.layers.0.self_attn.k_proj, model.layers.1.self_attn.k_proj)"
    )
