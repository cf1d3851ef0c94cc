"""erase_merged streams the checkpoint shard by shard: same weights as the in-memory merge."""

import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from qrerase.method.erase import apply_updates, save_merged
from qrerase.method.stream_erase import checkpoint_shards, erase_checkpoint


def _tensors(directory):
    out = {}
    for shard in checkpoint_shards(directory):
        out.update(load_file(shard))
    return out


@pytest.mark.parametrize("shard_size", [None, "100KB"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_erase_equals_in_memory(tmp_path, shard_size, dtype):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        vocab_size=300,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(cfg).to(dtype)
    src = tmp_path / "base"
    model.save_pretrained(src, **({"max_shard_size": shard_size} if shard_size else {}))
    assert (len(checkpoint_shards(src)) > 1) == bool(shard_size)
    rng = np.random.default_rng(0)
    names = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.v_proj"]
    updates = {}
    for n in names:
        d_out, d_in = model.get_submodule(n).weight.shape
        updates[n] = (
            rng.standard_normal((d_out, 4)).astype(np.float32),
            rng.standard_normal((4, d_in)).astype(np.float32),
        )

    erase_checkpoint(src, updates, tmp_path / "streamed")
    reference = LlamaForCausalLM.from_pretrained(src, dtype=dtype)
    save_merged(apply_updates(reference, updates), None, tmp_path / "in_memory")

    streamed, in_memory, base = _tensors(tmp_path / "streamed"), _tensors(tmp_path / "in_memory"), _tensors(src)
    assert set(streamed) == set(base)
    for key, value in streamed.items():
        assert value.dtype == dtype
        assert torch.equal(value, in_memory[key]), key
    assert not torch.equal(streamed[f"{names[0]}.weight"], base[f"{names[0]}.weight"])  # the edit happened
    assert (tmp_path / "streamed" / "config.json").is_file()
    umask = os.umask(0)
    os.umask(umask)
    for f in (tmp_path / "streamed").iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f  # the umask is honoured


def test_missing_module_is_an_error_before_writing(tmp_path):
    LlamaForCausalLM(
        LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, vocab_size=300, num_attention_heads=4)
    ).save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match="no weight for modules"):
        erase_checkpoint(
            tmp_path / "base", {"model.layers.7.mlp.up_proj": (np.ones((64, 1)), np.ones((1, 32)))}, tmp_path / "out"
        )
    assert not (tmp_path / "out").exists()
