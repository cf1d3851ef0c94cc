"""Model shapes for the memory plan: the numbers memory depends on, read from a config's
``model.shape``, a local ``config.json`` or the paper's models (:data:`KNOWN_SHAPES`), without
downloading or loading anything (:func:`resolve_shape`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The numbers memory depends on. ``params`` None: counted from the shape (:meth:`count_params`)."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    experts: int = 1  # MoE experts per layer (Mixtral: 8); all of them hold memory
    experts_per_token: int = 1  # experts each token runs through (Mixtral: 2); scales activations/FLOPs
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs fc1/fc2
    tied_embeddings: bool = False
    frames_per_second: int = 0  # speech encoders: sequence positions per second of audio (HuBERT: 50)
    params: int | None = None

    def __post_init__(self):
        for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "experts", "experts_per_token"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise ValueError(
                    f"model shape {self.name!r}: {key} must be an integer >= 1, got {getattr(self, key)!r}"
                )
        if self.vocab < 0 or self.heads % self.kv_heads:
            raise ValueError(f"model shape {self.name!r}: vocab must be >= 0 and heads a multiple of kv_heads")

    @property
    def kv_dim(self) -> int:
        return self.hidden // self.heads * self.kv_heads

    def layer_params(self) -> int:
        """One decoder layer: q/o (h x h each), k/v (h x kv_dim each), experts x (2 or 3) h x i MLP
        matrices, the router (h x experts, MoE only), two norms (h each)."""
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate * self.experts
        router = self.hidden * self.experts if self.experts > 1 else 0
        return 2 * self.hidden**2 + 2 * self.hidden * self.kv_dim + mlp + router + 2 * self.hidden

    def count_params(self) -> int:
        """``params`` if declared, else embeddings (V x h, twice unless tied) + layers + final norm."""
        if self.params is not None:
            return self.params
        emb = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return emb + self.layers * self.layer_params() + self.hidden

    def root_params(self) -> int:
        """Parameters outside the decoder layers: embeddings, LM head, final norm (a declared
        ``params`` count: whatever it holds beyond ``layers x layer_params``; never below 0). FSDP2
        wraps the layers one by one; these stay in the root group, gathered as one unit."""
        return max(0, self.count_params() - self.layers * self.layer_params())


# The paper's models (from their published config.json files; params as published where the
# architecture has parts the shape above does not count: biases, conv feature encoders).
KNOWN_SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in (
        ModelShape("meta-llama/Meta-Llama-3-8B", 32, 4096, 14336, 128256, 32, 8),
        ModelShape("meta-llama/Meta-Llama-3-70B", 80, 8192, 28672, 128256, 64, 8),
        ModelShape("mistralai/Mixtral-8x7B-v0.1", 32, 4096, 14336, 32000, 32, 8, experts=8, experts_per_token=2),
        ModelShape("CohereForAI/aya-23-8B", 32, 4096, 14336, 256000, 32, 8, tied_embeddings=True),
        ModelShape("meta-llama/Llama-2-7b-chat-hf", 32, 4096, 11008, 32000, 32, 32),
        ModelShape("microsoft/phi-1_5", 24, 2048, 8192, 51200, 32, 32, gated_mlp=False, params=1_418_270_720),
        ModelShape(
            "facebook/hubert-xlarge-ll60k",
            48,
            1280,
            5120,
            0,
            16,
            16,
            gated_mlp=False,
            frames_per_second=50,
            params=964_000_000,
        ),
    )
}


#: config.json keys of each shape field, in the spellings transformers' architectures use
HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim"),
}


def shape_from_hf_config(cfg: Mapping[str, Any], name: str) -> ModelShape:
    """A shape from a transformers ``config.json`` dict (Llama, Mistral, Mixtral, Cohere, Phi, GPT-2,
    HuBERT, ...): the fields under any of their :data:`HF_KEYS` spellings; a missing MLP width is
    4 x hidden (GPT-2's ``n_inner: null``)."""

    def first(field):
        return next((cfg[k] for k in HF_KEYS[field] if cfg.get(k) is not None), None)

    layers, hidden, heads = first("layers"), first("hidden"), first("heads")
    for field, value in (("layers", layers), ("hidden", hidden), ("heads", heads)):
        if value is None:
            raise ValueError(f"{name}: config.json has none of {HF_KEYS[field]}; declare model.shape in the config")
    model_type = str(cfg.get("model_type", ""))
    return ModelShape(
        name=name,
        layers=layers,
        hidden=hidden,
        intermediate=first("intermediate") or 4 * hidden,
        vocab=0 if model_type == "hubert" else int(cfg.get("vocab_size") or 0),
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads") or heads,
        experts=cfg.get("num_local_experts") or cfg.get("num_experts") or 1,
        experts_per_token=cfg.get("num_experts_per_tok") or 1,
        gated_mlp=model_type not in ("phi", "hubert", "gpt2", "gpt_neox", "opt"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", model_type == "gpt2")),
        frames_per_second=50 if model_type == "hubert" else 0,
    )


def resolve_shape(model_cfg: Mapping[str, Any], tiny_vocab: int | None = None) -> ModelShape:
    """The model's shape, without downloading: ``model.shape`` (declared), else a local directory's
    ``config.json``, else :data:`KNOWN_SHAPES`, else (``name_or_path: null``) the embedded tiny model."""
    name = model_cfg.get("name_or_path")
    declared = model_cfg.get("shape")
    if declared:
        return ModelShape(name=str(name), **dict(declared))
    if name is None:
        t = model_cfg.get("tiny") or {}
        return ModelShape(
            "tiny",
            t.get("num_hidden_layers", 3),
            t.get("hidden_size", 128),
            t.get("intermediate_size", 512),
            tiny_vocab or 3000,
            t.get("num_attention_heads", 4),
            t.get("num_key_value_heads", t.get("num_attention_heads", 4)),
            tied_embeddings=bool(t.get("tie_word_embeddings", False)),
        )
    local = Path(str(name)) / "config.json"
    if local.is_file():
        return shape_from_hf_config(json.loads(local.read_text()), str(name))
    if name in KNOWN_SHAPES:
        return KNOWN_SHAPES[name]
    raise ValueError(
        f"model.name_or_path {name!r}: no local config.json and not a known model "
        f"({', '.join(sorted(KNOWN_SHAPES))}); declare model.shape in the config"
    )
