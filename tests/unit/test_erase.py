"""Erase outputs: merged checkpoint (W' = W − U V) and the equivalent PEFT adapter give the same logits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support.tiny_llama import build_tiny_llama

from qrerase.io import load_arrays
from qrerase.method.adapters import task_matrices
from qrerase.method.discriminate import forget_update, forget_updates
from qrerase.method.energy import layer_energy, modules_for_layers, select_layers
from qrerase.method.erase import (
    EraseAdapterWriter,
    apply_updates,
    erase_adapter_config,
    save_erase_adapter,
    save_merged,
)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

IDS = torch.tensor([[1, 5, 9, 33, 2, 100, 17, 64, 3, 127], [7, 7, 8, 0, 45, 3, 99, 12, 6, 1]])


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits.double()


def _updates(lora_pair, case):
    forget, retain = (task_matrices(d) for d in lora_pair)
    if case == "cpqr-all":
        return forget_updates(forget, retain, 2, "cpqr", scale=1.5)
    if case == "svd-localized":
        sel = modules_for_layers(select_layers(layer_energy(forget, "module")), forget, "module")
        assert 0 < len(sel) < len(forget)
        return forget_updates(forget, retain, 3, "svd", retain_rank=4, modules=sel)
    # mixed ranks per module → rank_pattern / alpha_pattern
    return {m: forget_update(forget[m], retain[m], 1 + i % 3, "cpqr", name=m) for i, m in enumerate(forget)}


@pytest.mark.parametrize("case", ["cpqr-all", "svd-localized", "mixed-ranks"])
def test_erase_adapter_equals_merged_checkpoint(lora_pair, tmp_path, case):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    updates = _updates(lora_pair, case)
    base_logits = _logits(build_tiny_llama())

    merged = apply_updates(build_tiny_llama(), updates)
    save_merged(merged, None, tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "merged").eval()
    merged_logits = _logits(reloaded)

    save_erase_adapter(updates, tmp_path / "erase", base_model_name_or_path="tiny-llama")
    peft_model = PeftModel.from_pretrained(build_tiny_llama(), tmp_path / "erase").eval()
    adapter_logits = _logits(peft_model)

    assert (merged_logits - base_logits).abs().max() > 1e-3  # the edit does something
    torch.testing.assert_close(adapter_logits, merged_logits, rtol=1e-5, atol=1e-5)

    # the adapter's files: exact module names, PEFT key format, scale 1, per-module ranks
    cfg = json.loads((tmp_path / "erase" / "adapter_config.json").read_text())
    assert cfg["target_modules"] == list(updates) and cfg["base_model_name_or_path"] == "tiny-llama"
    assert cfg["lora_alpha"] == cfg["r"] and cfg["rank_pattern"] == cfg["alpha_pattern"]
    ranks = {m: U.shape[1] for m, (U, V) in updates.items()}
    assert all(cfg["rank_pattern"].get(m, cfg["r"]) == k for m, k in ranks.items())
    assert bool(cfg["rank_pattern"]) == (case == "mixed-ranks")
    keys = set(load_arrays(tmp_path / "erase" / "adapter_model.safetensors"))
    assert keys == {f"base_model.model.{m}.lora_{w}.weight" for m in updates for w in "AB"}
    # reading it back as task matrices gives −U V (the adapter adds s·B·A = −U V)
    back = task_matrices(tmp_path / "erase")
    for m, (U, V) in updates.items():
        np.testing.assert_allclose(back[m].dense(), -(U @ V), atol=1e-6)


def test_apply_updates_sign_and_dtypes(lora_pair):
    updates = _updates(lora_pair, "cpqr-all")
    m = "model.layers.1.self_attn.v_proj"
    U, V = updates[m]
    model = build_tiny_llama()
    W = model.get_submodule(m).weight.detach().double().clone()
    apply_updates(model, {m: (U, V)})
    np.testing.assert_allclose(model.get_submodule(m).weight.detach().double().numpy(), W.numpy() - U @ V, atol=1e-6)
    # state dicts: torch (bf16: one rounding of W − UV) and numpy
    sd = {f"{m}.weight": W.to(torch.bfloat16).clone()}
    apply_updates(sd, {m: (U, V)})
    expected = (W.to(torch.bfloat16).float() - torch.from_numpy(U @ V).float()).to(torch.bfloat16)
    assert torch.equal(sd[f"{m}.weight"], expected)
    nd = {f"{m}.weight": W.numpy().copy()}
    apply_updates(nd, {m: (U, V)})
    np.testing.assert_allclose(nd[f"{m}.weight"], W.numpy() - U @ V, atol=1e-12)


def test_erase_adapter_config_patterns():
    cfg = erase_adapter_config({"a.layers.0.q": 4, "a.layers.0.k": 4, "a.layers.1.q": 2}, None)
    assert (cfg["r"], cfg["lora_alpha"]) == (4, 4)
    assert cfg["rank_pattern"] == cfg["alpha_pattern"] == {"a.layers.1.q": 2}


# ----------------------------------------------------------------------------------------- bad input

M = "model.layers.0.self_attn.q_proj"


def _ok(d_out=64, d_in=64, k=2):
    rng = np.random.default_rng(0)
    return rng.standard_normal((d_out, k)), rng.standard_normal((k, d_in))


@pytest.mark.parametrize(
    "updates, pattern",
    [
        ({M: _ok(d_in=32)}, rf"{M}.*weight is \(64, 64\) but the update U @ V is \(64, 32\)"),
        ({"model.layers.0.self_attn.nope": _ok()}, r"model.layers.0.self_attn.nope.*not found"),
        ({M: (np.full((64, 2), np.nan), np.ones((2, 64)))}, rf"{M}.*NaN or Inf"),
        ({M: (np.ones((64, 2)), np.ones((3, 64)))}, rf"{M}.*U \(64, 2\) and V \(3, 64\)"),
    ],
)
def test_bad_updates_change_and_write_nothing(tmp_path, updates, pattern):
    model = build_tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=pattern):
        apply_updates(model, {"model.layers.1.mlp.up_proj": _ok(128, 64), **updates})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    if "not found" not in pattern and "weight is" not in pattern:  # the adapter writer cannot know the model
        with pytest.raises(ValueError, match=M):
            save_erase_adapter(updates, tmp_path / "erase", None)
        assert not (tmp_path / "erase").exists()
    assert not any(tmp_path.iterdir())


def test_streaming_writer_is_all_or_nothing(tmp_path):
    out = tmp_path / "erase"
    shapes = {M: (64, 64, 2), "model.layers.1.mlp.up_proj": (128, 64, 2)}
    with pytest.raises(ValueError, match=r"'model.layers.1.mlp.up_proj': update not written"):
        with EraseAdapterWriter(out, shapes, None) as w:
            w.write(M, *_ok())
    assert not out.exists()
    with pytest.raises(ValueError, match=r"written out of order"):
        with EraseAdapterWriter(out, shapes, None) as w:
            w.write("model.layers.1.mlp.up_proj", *_ok(128, 64))
    with pytest.raises(ValueError, match=rf"'{M}': declared"):
        with EraseAdapterWriter(out, shapes, None) as w:
            w.write(M, *_ok(k=3))
    assert not out.exists() and not any(tmp_path.iterdir())
    with EraseAdapterWriter(out, shapes, None) as w:
        w.write(M, *_ok())
        w.write("model.layers.1.mlp.up_proj", *_ok(128, 64))
    arrays = load_arrays(out / "adapter_model.safetensors")
    assert arrays[f"base_model.model.{M}.lora_A.weight"].shape == (2, 64)
    assert arrays[f"base_model.model.{M}.lora_B.weight"].dtype == np.float32


def test_save_merged_rejects_peft_model(lora_pair, tmp_path):
    from peft import PeftModel

    pm = PeftModel.from_pretrained(build_tiny_llama(), lora_pair[0])
    with pytest.raises(ValueError, match="merge_and_unload"):
        save_merged(pm, None, tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("writer", ["merged", "streamed", "adapter"])
def test_non_finite_edit_is_an_error_naming_the_output_and_writes_nothing(lora_pair, tmp_path, writer):
    """A degenerate scale (1e40: finite in float64, past float32's range) makes W − U V non-finite:
    each erase writer fails with one line naming its output and leaves nothing under that name."""
    from qrerase.method.stream_erase import check_edited_weights, erase_checkpoint

    updates = {m: (U * 1e40, V) for m, (U, V) in _updates(lora_pair, "cpqr-all").items()}
    base = tmp_path / "base"
    build_tiny_llama().save_pretrained(base)
    out = tmp_path / "erased"
    with pytest.raises(ValueError) as err:
        if writer == "merged":
            save_merged(apply_updates(build_tiny_llama(), updates), None, out)
        elif writer == "streamed":
            erase_checkpoint(base, updates, out)
        else:
            check_edited_weights(base, updates, out)  # what rule erase_adapter checks first
    message = str(err.value)
    assert message.startswith(f"{out}: ") and "not finite" in message and "\n" not in message
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["base"]
    if writer == "adapter":  # the adapter writer itself: the edit U V overflows float32
        with pytest.raises(ValueError, match=r"the edit U V of module .* is not finite"):
            save_erase_adapter(updates, out, base_model_name_or_path=str(base))
        assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["base"]
    # the same edit at a sane scale is written by all of them
    sane = _updates(lora_pair, "cpqr-all")
    check_edited_weights(base, sane, out)
    assert erase_checkpoint(base, sane, out).is_dir()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_edit_check_reads_half_precision_checkpoints_without_torch(lora_pair, tmp_path, dtype):
    """rule erase_adapter's check (numpy only) on bf16 / fp16 weights agrees with the merged erase."""
    from qrerase.method.stream_erase import check_edited_weights, erase_checkpoint

    base = tmp_path / "base"
    build_tiny_llama().to(dtype).save_pretrained(base)
    sane = _updates(lora_pair, "cpqr-all")
    check_edited_weights(base, sane, tmp_path / "out")
    # 1e9 overflows float16 (max 65504) but not bfloat16: both checks say the same
    big = {m: (U * 1e9, V) for m, (U, V) in sane.items()}
    outcomes = []
    for check in (check_edited_weights, erase_checkpoint):
        try:
            check(base, big, tmp_path / "out")
            outcomes.append("ok")
        except ValueError as exc:
            assert "not finite" in str(exc)
            outcomes.append("degenerate")
    assert outcomes == ["degenerate" if dtype == torch.float16 else "ok"] * 2
