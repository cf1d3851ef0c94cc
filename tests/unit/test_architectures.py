"""Per-architecture module naming, LoRA presets, Conv1D (fan_in_fan_out) erase, chat templates, adapters
trained elsewhere: all on tiny random-weight models of the real transformers classes (no downloads)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.architectures import (
    CAUSAL,
    LLAMA2_CHAT,
    LLAMA3_CHAT,
    as_old_peft,
    build_causal,
    build_tokenizer,
    save_causal,
    save_lora,
)

from qrerase.method.adapters import check_adapter_fits, checkpoint_shapes, read_adapter_config, task_matrices
from qrerase.method.architectures import TARGET_PRESETS, lora_modules, resolve_target_modules
from qrerase.method.discriminate import forget_update, forget_updates
from qrerase.method.erase import apply_updates, save_erase_adapter
from qrerase.method.module_names import block_of, module_kind
from qrerase.text.lm import PromptTemplate, encode_prompts, encode_qa

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def _blocks(model):
    """(prefix, ModuleList of transformer blocks) of a model."""
    for prefix in ("model.layers", "transformer.h", "hubert.encoder.layers"):
        try:
            return prefix, model.get_submodule(prefix)
        except AttributeError:
            continue
    raise AssertionError(f"no block list in {type(model).__name__}")


def _hubert():
    from transformers import HubertConfig, HubertForSequenceClassification

    return HubertForSequenceClassification(
        HubertConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            conv_dim=[16, 16],
            conv_stride=[5, 4],
            conv_kernel=[10, 8],
            num_labels=2,
        )
    )


@pytest.mark.parametrize("arch", [*CAUSAL, "hubert"])
def test_block_index_and_kind_of_every_adaptable_module(arch, tokenizer):
    model = _hubert() if arch == "hubert" else build_causal(arch, tokenizer)
    prefix, blocks = _blocks(model)
    seen = 0
    for i, block in enumerate(blocks):
        for sub, module in block.named_modules():
            if type(module).__name__ in ("Linear", "Conv1D"):
                name = f"{prefix}.{i}.{sub}"
                assert block_of(name) == i and module_kind(name) == sub
                seen += 1
    assert seen >= 4 * len(blocks)
    targets = resolve_target_modules(model, "auto")
    assert targets == list(TARGET_PRESETS[model.config.model_type])
    adapted = [n for n in lora_modules(model) if any(n.endswith("." + t) for t in targets)]
    assert {block_of(n) for n in adapted} == set(range(len(blocks)))  # the preset reaches every block


def test_mixtral_checkpoint_expert_names(tokenizer, tmp_path):
    save_causal("mixtral", tokenizer, tmp_path / "mixtral")
    experts = [k[: -len(".weight")] for k in checkpoint_shapes(tmp_path / "mixtral") if ".experts." in k]
    assert "model.layers.1.block_sparse_moe.experts.1.w1" in experts and len(experts) == 2 * 2 * 3
    assert {block_of(n) for n in experts} == {0, 1}
    assert {module_kind(n) for n in experts} == {f"block_sparse_moe.experts.*.w{i}" for i in (1, 2, 3)}


def test_missing_target_module_is_one_line_naming_the_layers(tokenizer):
    with pytest.raises(
        ValueError,
        match=r"^lora.target_modules: 'q_proj' matches no linear layer of the model "
        r"\(model_type gpt2; its linear layers: c_attn, c_fc, c_proj, lm_head\)$",
    ):
        resolve_target_modules(build_causal("gpt2", tokenizer), ["c_attn", "q_proj"])
    with pytest.raises(ValueError, match="auto has no preset for model_type 'bert'"):
        from transformers import BertConfig, BertModel

        resolve_target_modules(
            BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)),
            "auto",
        )


# ----------------------------------------------------------------------------------- Conv1D (GPT-2)


def _merged_delta(model, adapter_dir):
    """PEFT's own merged delta of every adapted weight (in storage orientation), float64."""
    from peft import PeftModel

    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    out = {}
    for n, p in merged.state_dict().items():
        d = p.detach().double() - before[n].double()
        if n.endswith(".weight") and d.abs().max() > 0:
            out[n[: -len(".weight")]] = d.numpy()
    return out


def test_gpt2_conv1d_task_matrices_erase_and_adapter_equal_dense(tokenizer, tmp_path):
    from peft import PeftModel

    targets = dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"])
    model = build_causal("gpt2", tokenizer, dtype=torch.float64)
    forget = save_lora(model, tmp_path / "forget", seed=1, **targets)
    retain = save_lora(model, tmp_path / "retain", seed=2, **dict(targets, r=6, lora_alpha=3))
    assert read_adapter_config(forget).fan_in_fan_out  # PEFT sets it for Conv1D
    Tf, Tr = task_matrices(forget), task_matrices(retain)
    delta = _merged_delta(build_causal("gpt2", tokenizer, dtype=torch.float64), forget)
    rdelta = _merged_delta(build_causal("gpt2", tokenizer, dtype=torch.float64), retain)
    assert set(Tf) == set(delta) and len(Tf) == 2 * 4
    for m, lr in Tf.items():  # T in the map's orientation (d_out×d_in); the Conv1D weight holds Tᵀ
        np.testing.assert_allclose(lr.dense(), delta[m].T, rtol=0, atol=1e-12)
    updates = forget_updates(Tf, Tr, 2, "cpqr", scale=2.0)
    for m in Tf:  # factored result == the dense computation from PEFT's merged deltas
        dense = forget_update(delta[m].T, rdelta[m].T, 2, "cpqr", scale=2.0)
        np.testing.assert_allclose(updates[m].U @ updates[m].V, dense.U @ dense.V, rtol=0, atol=1e-10)
    base = build_causal("gpt2", tokenizer, dtype=torch.float64)
    before = {n: p.detach().clone() for n, p in base.state_dict().items()}
    apply_updates(base, updates)
    for m, (U, V) in updates.items():
        edit = base.state_dict()[f"{m}.weight"] - before[f"{m}.weight"]
        np.testing.assert_allclose(edit.numpy(), -(U @ V).T, rtol=0, atol=1e-12)
    save_erase_adapter(updates, tmp_path / "erase", "tiny-gpt2", fan_in_fan_out=True, dtype=np.float64)
    assert json.loads((tmp_path / "erase/adapter_config.json").read_text())["fan_in_fan_out"] is True
    peft = PeftModel.from_pretrained(
        build_causal("gpt2", tokenizer, dtype=torch.float64), str(tmp_path / "erase")
    ).eval()
    ids = torch.tensor([[0, 5, 9, 33, 2, 100, 17, 64]])
    with torch.no_grad():
        torch.testing.assert_close(peft(input_ids=ids).logits, base(input_ids=ids).logits, rtol=0, atol=1e-10)
        assert (
            base(input_ids=ids).logits - build_causal("gpt2", tokenizer, dtype=torch.float64)(input_ids=ids).logits
        ).abs().max() > 1e-4


def test_conv1d_state_dict_needs_transposed_names():
    w = {"h.0.attn.c_proj.weight": np.zeros((3, 5))}  # Conv1D: d_in = 3, d_out = 5
    U, V = np.ones((5, 1)), np.arange(3.0)[None, :]
    with pytest.raises(ValueError, match=r"weight is \(3, 5\) but the update U @ V is \(5, 3\)"):
        apply_updates(w, {"h.0.attn.c_proj": (U, V)})
    apply_updates(w, {"h.0.attn.c_proj": (U, V)}, transposed=["h.0.attn.c_proj"])
    np.testing.assert_array_equal(w["h.0.attn.c_proj.weight"], -(U @ V).T)


# ----------------------------------------------------------------------------------- chat templates


@pytest.mark.parametrize(
    "template, prompt_start, sep", [(LLAMA2_CHAT, "[INST] ", " "), (LLAMA3_CHAT, "<|start_header_id|>user", "")]
)
def test_chat_template_prompt_is_the_tokenizers_own(tokenizer, template, prompt_start, sep):
    tokenizer.chat_template = template
    try:
        t = PromptTemplate.from_chat_template(tokenizer)
        q, a = "Who wrote 'The Rainbow Fish'?", "Marcus Pfister."
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        assert rendered.startswith("<s>" + prompt_start) and t.question_start.startswith(prompt_start)
        assert t.answer_separator == sep
        expected = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert encode_prompts(tokenizer, t, [q])[0] == expected  # exactly one BOS, the template's text
        ids, labels = encode_qa(tokenizer, t, q, a, 128)
        assert ids[: len(expected)] == expected and ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode([i for i, lab in zip(ids, labels) if lab != -100]).strip() == a + "</s>"
    finally:
        tokenizer.chat_template = None
    with pytest.raises(ValueError, match="model.template: chat, but tokenizer .* has no chat_template"):
        PromptTemplate.from_chat_template(tokenizer)


# ------------------------------------------------------------------------------ adapters from elsewhere


@pytest.fixture(scope="module")
def llama_dir(tokenizer, tmp_path_factory):
    return save_causal("llama", tokenizer, tmp_path_factory.mktemp("llama") / "model")


def _llama(llama_dir, dtype=torch.float64):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(llama_dir), dtype=dtype).eval()


ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = {
    "rslora": dict(r=4, lora_alpha=6, use_rslora=True, target_modules=ALL),
    "patterns": dict(
        r=4,
        lora_alpha=8,
        target_modules=ALL,
        rank_pattern={"down_proj": 6, "model.layers.1.self_attn.q_proj": 2},
        alpha_pattern={"v_proj": 3},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_adapter_from_elsewhere_equals_peft_merge(case, llama_dir, tmp_path):
    adapter = save_lora(_llama(llama_dir), tmp_path / case, seed=3, **CASES[case])
    delta = _merged_delta(_llama(llama_dir), adapter)
    factors = task_matrices(adapter)
    check_adapter_fits(adapter, factors, llama_dir)
    assert set(factors) == set(delta)
    for m, lr in factors.items():
        np.testing.assert_allclose(lr.dense(), delta[m], rtol=0, atol=1e-12)


def test_adapter_saved_by_another_peft_version(llama_dir, tmp_path):
    from peft import PeftModel

    adapter = save_lora(_llama(llama_dir), tmp_path / "new", seed=4, **CASES["rslora"])
    old = as_old_peft(shutil.copytree(adapter, tmp_path / "old"))
    assert "use_dora" not in json.loads((old / "adapter_config.json").read_text())
    new_f, old_f = task_matrices(adapter), task_matrices(old)
    for m in new_f:
        np.testing.assert_array_equal(old_f[m].dense(), new_f[m].dense())
    ids = torch.tensor([[0, 5, 9, 33]])
    with torch.no_grad():  # PEFT itself reads the old config to the same function
        a = PeftModel.from_pretrained(_llama(llama_dir), str(adapter))(input_ids=ids).logits
        b = PeftModel.from_pretrained(_llama(llama_dir), str(old))(input_ids=ids).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_different_r_for_forget_and_retain_equals_dense(llama_dir, tmp_path):
    forget = task_matrices(save_lora(_llama(llama_dir), tmp_path / "f", seed=5, **CASES["rslora"]))
    retain = task_matrices(save_lora(_llama(llama_dir), tmp_path / "r", seed=6, r=8, lora_alpha=16, target_modules=ALL))
    assert {lr.rank for lr in forget.values()} == {4} and {lr.rank for lr in retain.values()} == {8}
    updates = forget_updates(forget, retain, 3, "cpqr", retain_rank=6)
    for m, up in updates.items():
        dense = forget_update(forget[m].dense(), retain[m].dense(), 3, "cpqr", retain_rank=6)
        np.testing.assert_allclose(up.U @ up.V, dense.U @ dense.V, rtol=0, atol=1e-10)


def test_adapter_model_mismatch_names_both(llama_dir, tokenizer, tmp_path):
    gpt2 = save_lora(
        build_causal("gpt2", tokenizer), tmp_path / "gpt2", seed=1, r=2, lora_alpha=2, target_modules=["c_attn"]
    )
    with pytest.raises(
        ValueError,
        match=rf"^adapter {tmp_path / 'gpt2'} \(trained on .*\) does not fit model {llama_dir}: "
        r"module 'transformer.h.0.attn.c_attn' is not in the model \(no 'transformer.h.0.attn.c_attn.weight'\)$",
    ):
        check_adapter_fits(gpt2, task_matrices(gpt2), llama_dir)
    qwen_dir = save_causal("qwen2", tokenizer, tmp_path / "qwen2")  # same module names, but q/k/v have biases
    from transformers import Qwen2Config, Qwen2ForCausalLM

    wider = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    wrong = save_lora(wider, tmp_path / "wide", seed=1, r=2, lora_alpha=2, target_modules=["q_proj"])
    with pytest.raises(
        ValueError,
        match=r"does not fit model .*qwen2: module 'model.layers.0.self_attn.q_proj' "
        r"has weight \(32, 32\) in the model but \(48, 48\) in the adapter$",
    ):
        check_adapter_fits(wrong, task_matrices(wrong), qwen_dir)
