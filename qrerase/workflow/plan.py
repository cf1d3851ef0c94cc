"""Memory / GPU plan of a config's jobs, computed from the model's shape and the training recipe.

Pure arithmetic: nothing is downloaded or loaded (a local ``config.json`` is read as JSON). Bytes
throughout; ``GiB = 2**30``. Assumptions (documented in docs/paper-scale.md, checked against measured
tiny models in tests/test_plan.py):

- Static training state, mixed precision with fp32 masters (FSDP / DeepSpeed ZeRO-3): fp32 master
  weights 4 B + fp32 gradients 4 B + AdamW's two fp32 moments 8 B = 16 B per trainable parameter
  (float32 training: the same 16 B), divided by the process count when sharded (processes > 1),
  plus the bf16 compute copy of the largest gathered unit (2 decoder layers, prefetch) per GPU.
- Activations: :func:`layer_activation_bytes` enumerates the tensors transformers' Llama-style decoder
  layer saves for backward per token with SDPA attention (no s x s matrix); gradient checkpointing
  keeps each layer's input and recomputes one layer at a time. The LM head saves the fp32
  log-softmax of the cross-entropy; the peak adds the returned logits and their fp32 gradient.
- Frozen reference models (KL, NPO, DPO; SCRUB / Bad Teaching teachers; KGA's models) hold weights
  only (forward under no_grad), sharded like the trained model.
- Inference (evaluate / generation) splits the weights over the job's GPUs (device_map="auto") and
  adds the KV cache and one teacher-forced forward's logits.
- Host memory: one full copy of the weights in the checkpoint dtype (rank 0 loads and saves; the
  others wait on the meta device) + 3 GiB per process (CUDA context, libraries) + 1 GiB data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import registry

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROCESS_OVERHEAD = 3 * GIB  # per training / inference process on the host (CUDA context, torch, data)
CPU_PROCESS_OVERHEAD = 1 * GIB  # the same for a CPU-only process (no CUDA context)
SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size of a safetensors checkpoint


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


# ---------------------------------------------------------------------------------------------
# Activation memory
# ---------------------------------------------------------------------------------------------
def layer_activation_bytes(shape: ModelShape, compute_bytes: int) -> int:
    """Bytes one decoder layer saves for backward, per token (a = compute dtype bytes, h, kv, i),
    as enumerated on transformers' Llama layer with SDPA (tests/test_plan.py measures it):

    - 2 RMSNorms: the fp32 input (4h), the fp32 rsqrt (4) and the normalised input to the weight
      product (a·h), each, and their outputs, the inputs of q/k/v and of gate/up (a·h each);
    - attention: rotated q and k and v (a·(h + 2·kv)), SDPA's output, which is the o_proj input
      (a·h), and SDPA's fp32 log-sum-exp (4 x heads);
    - MLP, per active expert: gate, SiLU(gate), up and their product, the down_proj input (4·a·i)
      (non-gated: fc1 out and GELU out, 2·a·i).
    Total 8h + 8 + a·(6h + 2·kv) + 4·heads + a·i·(4 | 2)·experts_per_token.
    """
    h, a = shape.hidden, compute_bytes
    mlp = (4 if shape.gated_mlp else 2) * a * shape.intermediate * shape.experts_per_token
    return 8 * h + 8 + a * (6 * h + 2 * shape.kv_dim) + 4 * shape.heads + mlp


def head_activation_bytes(shape: ModelShape, compute_bytes: int) -> int:
    """Per token at the LM head: the final norm (4h + 4 + a·h), lm_head's input (a·h) and the fp32
    log-softmax of the cross-entropy (4·V)."""
    return 4 * shape.hidden + 4 + 2 * compute_bytes * shape.hidden + 4 * shape.vocab


def saved_activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool) -> int:
    """Bytes autograd holds for backward at the end of the forward pass over ``tokens`` tokens
    (micro-batch x length): every layer's saved tensors, or with gradient checkpointing only each
    layer's input (a·h per token); plus the head's."""
    per_layer = compute_bytes * shape.hidden if checkpointing else layer_activation_bytes(shape, compute_bytes)
    return tokens * (shape.layers * per_layer + head_activation_bytes(shape, compute_bytes))


def activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool) -> int:
    """Peak activation bytes of one forward + backward: the saved tensors, the logits the model
    returns (a·V per token) and their fp32 gradient (4·V), and with checkpointing one layer's
    recomputed tensors during backward."""
    peak = saved_activation_bytes(shape, tokens, compute_bytes, checkpointing)
    peak += tokens * (compute_bytes + 4) * shape.vocab
    if checkpointing:
        peak += tokens * layer_activation_bytes(shape, compute_bytes)
    return peak


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """A cluster node: GPUs, their memory, host memory. ``gpus == 0``: a CPU-only job (device cpu)."""

    gpus: int = 8
    gpu_mem_gb: float = 80.0
    host_mem_gb: float = 1000.0


@dataclass(frozen=True)
class JobSpec:
    """One job kind's recipe.

    kind: 'train' (full weights), 'lora', 'infer' (forward / generation) or 'linalg' (CPU, streaming).
    sequences: sequences per example (2: forget + retain batches, or DPO's chosen + rejected).
    references: frozen model copies held during training (KL / NPO / DPO / FLAT: 1).
    """

    name: str
    kind: str
    batch_size: int = 1
    max_length: int = 512
    sequences: int = 1
    references: int = 0
    lora_rank: int = 0
    lora_modules: int = 7  # target modules per layer
    checkpointing: bool = False
    micro_batch_size: int | None = None  # None: the largest power of two that fits
    processes: int = 1
    new_tokens: int = 0  # generation (infer)

    def __post_init__(self):
        if self.kind not in ("train", "lora", "infer", "linalg"):
            raise ValueError(f"job {self.name}: kind must be train | lora | infer | linalg, got {self.kind!r}")
        if self.batch_size < 1 or self.processes < 1 or self.max_length < 1:
            raise ValueError(f"job {self.name}: batch_size, processes and max_length must be >= 1")


@dataclass(frozen=True)
class JobPlan:
    name: str
    processes: int
    gpus: int  # GPUs the job asks for (0: CPU)
    gpus_needed: int  # the fewest GPUs on one node with which it fits (0: none on one node)
    micro_batch: int  # per process; gradient accumulation = batch / (micro_batch x processes)
    accumulation: int
    device_bytes: int  # peak per GPU (CPU jobs: 0)
    host_bytes: int
    fits: bool
    note: str = ""


def lora_params(shape: ModelShape, job: JobSpec) -> int:
    """r x (d_in + d_out) per target module; modules are taken as h x h (an upper bound for k/v, a
    lower bound for the MLP ones, so the average is close for the 7 usual targets)."""
    return shape.layers * job.lora_modules * job.lora_rank * 2 * max(shape.hidden, shape.intermediate // 2)


def device_bytes(shape: ModelShape, job: JobSpec, dtype: str, micro: int, processes: int) -> int:
    """Peak bytes per GPU of ``job`` with ``micro`` sequences per process on ``processes`` GPUs.

    train: 16 B/param (fp32 masters + grads + 2 AdamW moments) / processes + 2 gathered layers (a
    bytes/param) + references (a bytes/param / processes) + activations; lora: base + references at
    a bytes/param / processes + 16 B per LoRA parameter + activations; infer: weights / processes +
    KV cache (2 x layers x kv_dim x a per token) + one forward's logits (a + 4 bytes x V per token).
    """
    a = DTYPE_BYTES[dtype]
    P = shape.count_params()
    tokens = micro * job.sequences * job.max_length
    if job.kind == "infer":
        kv = 2 * shape.layers * shape.kv_dim * a * micro * (job.max_length + job.new_tokens)
        logits = (a + 4) * shape.vocab * micro * job.max_length
        return math.ceil(a * P / processes) + kv + logits + 2 * a * shape.hidden * micro * job.max_length
    acts = activation_bytes(shape, tokens, a, job.checkpointing)
    refs = job.references * a * P // processes
    if job.kind == "train":
        gathered = 2 * a * shape.layer_params() if processes > 1 else 0
        return 16 * P // processes + gathered + refs + acts
    return a * P // processes + refs + 16 * lora_params(shape, job) + acts


def host_bytes(shape: ModelShape, job: JobSpec, dtype: str, processes: int, on_gpu: bool) -> int:
    """Host memory: a GPU job holds one full copy of the weights in the checkpoint dtype (loading and
    saving on rank 0) + 3 GiB per process + 1 GiB of data; a CPU job holds its device bytes + 1 GiB per
    process; linalg: erase_merged streams two shards (read + edited) + 1 GiB; factors (``lora_rank``
    set) hold both adapters' factors and their decompositions in fp32 (3 x 4 B x 2 adapters) + 1 GiB."""
    a = DTYPE_BYTES[dtype]
    P = shape.count_params()
    if job.kind == "linalg" and job.lora_rank:  # factors: both adapters' A, B and their QR / SVD in fp32
        return 3 * 4 * 2 * lora_params(shape, job) + GIB
    if job.kind == "linalg":  # erase_merged: one shard read, one edited
        return 2 * min(a * P, SHARD_BYTES) + GIB
    if on_gpu:
        return a * P * (1 + job.references) + processes * PROCESS_OVERHEAD + GIB
    micro = job.micro_batch_size or job.batch_size
    return device_bytes(shape, job, dtype, min(micro, job.batch_size), 1) + CPU_PROCESS_OVERHEAD + GIB


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def plan_job(shape: ModelShape, job: JobSpec, dtype: str, node: Node) -> JobPlan:
    """Micro-batch, GPUs and peak memory of one job.

    micro-batch: ``job.micro_batch_size`` if set, else the largest power of two <= the per-process
    share of the batch whose peak fits ``node.gpu_mem_gb``; gpus_needed: the fewest of 1, 2, 4, ...,
    node.gpus with which micro-batch 1 fits (0 when none does).
    """
    if job.kind == "linalg" or node.gpus == 0:
        host = host_bytes(shape, job, dtype, job.processes, on_gpu=False)
        micro = min(job.micro_batch_size or job.batch_size, job.batch_size) if job.kind != "linalg" else 0
        fits = host <= node.host_mem_gb * GIB
        note = "" if fits else f"needs {host / GIB:.0f} GiB of host memory"
        return JobPlan(job.name, job.processes, 0, 0, micro, 1, 0, host, fits, note)
    cap = node.gpu_mem_gb * GIB
    per_proc = max(1, job.batch_size // job.processes)

    def micro_for(procs: int) -> int:
        if job.micro_batch_size:
            m = min(job.micro_batch_size, per_proc)
            return m if device_bytes(shape, job, dtype, m, procs) <= cap else 0
        m = _pow2_floor(per_proc) if job.kind != "infer" else _pow2_floor(job.batch_size)
        exact = job.kind != "infer" and job.batch_size % procs == 0  # micro x accum x procs == batch
        while m >= 1 and (device_bytes(shape, job, dtype, m, procs) > cap or (exact and per_proc % m)):
            m //= 2
        return m

    needed = next((g for g in (1 << i for i in range(8)) if g <= node.gpus and micro_for(g)), 0)
    micro = micro_for(job.processes) or 1
    dev = device_bytes(shape, job, dtype, micro, job.processes)
    host = host_bytes(shape, job, dtype, job.processes, on_gpu=True)
    fits = dev <= cap and job.processes <= node.gpus and host <= node.host_mem_gb * GIB
    accum = max(1, math.ceil(job.batch_size / (micro * job.processes))) if job.kind != "infer" else 1
    note = ""
    if not fits:
        if needed == 0:
            note = f"does not fit one node ({node.gpus} x {node.gpu_mem_gb:g} GB)"
            if job.kind == "train":
                stage = job.name.rpartition(":")[2]
                note += (
                    "; use finetune.mode: lora"
                    if stage in ("finetune", "pretrain")
                    else "; use baselines.mode: lora"
                    if stage in registry.baselines_of_kind("text")
                    else "; needs more than one node (this baseline has no LoRA mode)"
                )
        elif needed > job.processes:
            note = f"needs processes >= {needed}"
        else:
            note = "host memory"
    return JobPlan(job.name, job.processes, job.processes, needed, micro, accum, dev, host, fits, note)
