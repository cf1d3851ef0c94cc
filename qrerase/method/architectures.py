"""Per-architecture knowledge: LoRA target-module presets and checks that target modules exist.

``lora.target_modules: auto`` (and ``speech.lora.target_modules: auto``) picks the preset of the
model's ``config.model_type`` (:data:`TARGET_PRESETS`): every attention projection and, where the
MLP is made of ``nn.Linear`` layers, the MLP projections, i.e. the modules the paper adapts. Names
follow PEFT's ``target_modules`` rule: a target ``t`` matches module ``m`` when ``m == t`` or ``m``
ends with ``"." + t``.

Mixture-of-experts models in transformers ≥ 5 (Mixtral, Qwen2-MoE, Qwen3-MoE) hold each layer's
experts as fused 3-D parameters (``mlp.experts.gate_up_proj``), which are not modules and so cannot
be PEFT ``target_modules``; their preset adapts the attention projections. Checkpoints still store
experts under their per-expert names (``model.layers.N.block_sparse_moe.experts.E.w1.weight``), and
:func:`qrerase.method.module_names.block_of` / :func:`qrerase.method.module_names.module_kind` map
such names to block N and kind ``block_sparse_moe.experts.*.w1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ATTENTION", "TARGET_PRESETS", "lora_modules", "preset_for", "resolve_target_modules"]

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_LLAMA_LIKE = (*ATTENTION, "gate_proj", "up_proj", "down_proj")

#: model_type → LoRA target modules picked by ``target_modules: auto``.
TARGET_PRESETS: dict[str, tuple[str, ...]] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "cohere": _LLAMA_LIKE,  # Aya-23
    "cohere2": _LLAMA_LIKE,
    "gemma": _LLAMA_LIKE,
    "gemma2": _LLAMA_LIKE,
    "olmo": _LLAMA_LIKE,
    "olmo2": _LLAMA_LIKE,
    "mixtral": ATTENTION,  # experts are fused parameters in transformers >= 5 (see module docstring)
    "qwen2_moe": ATTENTION,
    "qwen3_moe": ATTENTION,
    "phi": ("q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"),  # Phi-1.5 / Phi-2
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "gpt2": ("c_attn", "c_proj", "c_fc"),  # Conv1D layers: PEFT sets fan_in_fan_out
    "hubert": ("q_proj", "k_proj", "v_proj", "out_proj"),  # the encoder's attention projections
    "wav2vec2": ("q_proj", "k_proj", "v_proj", "out_proj"),
}


def preset_for(model_type: str) -> tuple[str, ...]:
    """The preset of a ``model_type``; ValueError listing the known types when there is none."""
    try:
        return TARGET_PRESETS[model_type]
    except KeyError:
        raise ValueError(
            f"target_modules: auto has no preset for model_type {model_type!r} "
            f"(presets: {', '.join(sorted(TARGET_PRESETS))}); list the module names instead"
        ) from None


def lora_modules(model: Any) -> list[str]:
    """Names of the modules PEFT LoRA can adapt with ``target_modules``: ``nn.Linear`` and transformers
    ``Conv1D`` layers (the output head and PEFT-wrapped layers' internals excluded)."""
    out = []
    for name, module in model.named_modules():
        if type(module).__name__ in ("Linear", "Conv1D") and ".lora_" not in name and name:
            out.append(name)
    return out


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def resolve_target_modules(model: Any, targets: str | Sequence[str], where: str = "lora.target_modules") -> list[str]:
    """The target-module list for ``model``: the preset of its ``config.model_type`` for ``"auto"``,
    else ``targets``; each one checked to match at least one adaptable layer.

    A target that matches nothing is a one-line ValueError naming the config key (``where``), the
    target, the model type and the model's adaptable layer kinds (last name component).
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    if isinstance(targets, str) and targets != "auto":
        raise ValueError(f"{where}: expected 'auto' or a list of module names, got {targets!r}")
    chosen = list(preset_for(model_type)) if targets == "auto" else list(targets)
    names = lora_modules(model)
    for t in chosen:
        if not any(_matches(n, t) for n in names):
            kinds = sorted({n.rsplit(".", 1)[-1] for n in names})
            raise ValueError(
                f"{where}: {t!r} matches no linear layer of the model (model_type {model_type}; "
                f"its linear layers: {', '.join(kinds)})"
            )
    return chosen
