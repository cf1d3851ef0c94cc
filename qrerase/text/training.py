"""Deterministic causal-LM training on QA pairs: full fine-tuning and LoRA.

* :func:`train_causal_lm` trains all trainable parameters of a model with AdamW, linear warmup and
  decay, gradient clipping and the TOFU answer-only loss, on length-bucketed batches.
* :func:`train_lora` wraps a model with PEFT LoRA adapters (:func:`add_lora`) and trains only those;
  :func:`save_adapter` writes ``adapter_config.json`` + ``adapter_model.safetensors`` atomically.
* :func:`train_steps` is the optimisation loop itself (any per-step loss), shared with the
  unlearning baselines of :mod:`qrerase.baselines.text`.

Runs are reproducible: :func:`qrerase.determinism.set_determinism` seeds every RNG, fixes the thread count and turns on
``torch.use_deterministic_algorithms``; batch composition and order come from seeded RNGs. Two runs
with the same seed, data and thread count give bit-identical weights.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..config import from_mapping
from ..determinism import epoch_seed, set_determinism
from ..io import atomic_dir
from .lm import PromptTemplate, answer_token_nll, bucketed_batches, collate, encode_qa_many, pad_token_id, qa_pair

__all__ = [
    "TrainConfig",
    "LoraTrainConfig",
    "train_steps",
    "epoch_batches",
    "epoch_steps",
    "train_causal_lm",
    "add_lora",
    "train_lora",
    "save_adapter",
]


@dataclass
class TrainConfig:
    """Optimisation settings of one training run.

    ``lr`` is the peak learning rate (reached after ``warmup_ratio`` of the steps, then decayed
    linearly to 0); ``weight_decay`` applies to matrices only (not to norms/biases), as in HF
    ``Trainer``; ``max_grad_norm <= 0`` disables clipping; ``max_length`` caps the tokens per
    example (answers are truncated); ``threads`` is passed to ``torch.set_num_threads``.
    """

    epochs: int
    lr: float
    batch_size: int
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = 128
    seed: int = 0
    threads: int = 2

    def __post_init__(self):
        if self.epochs < 0 or self.batch_size < 1 or self.lr < 0 or not 0 <= self.warmup_ratio <= 1:
            raise ValueError(f"invalid training config: {self}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        return from_mapping(cls, d, "training config")


def _default_lora_train() -> TrainConfig:
    return TrainConfig(epochs=5, lr=1e-3, batch_size=16)


@dataclass
class LoraTrainConfig:
    """LoRA adapter shape (``r``, ``alpha``, ``dropout``, ``target_modules``) and its training run."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    train: TrainConfig = field(default_factory=_default_lora_train)

    def __post_init__(self):
        if isinstance(self.train, Mapping):
            self.train = TrainConfig.from_dict(self.train)
        self.target_modules = tuple(self.target_modules)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LoraTrainConfig":
        return from_mapping(cls, d, "LoRA training config")


def _optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise ValueError("model has no trainable parameters")
    groups = [g for g in ({"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    kwargs = dict(lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8)
    try:  # fused CPU/GPU kernel (torch >= 2.4): much less per-step overhead for many small tensors
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, **kwargs)


def train_steps(model, cfg: TrainConfig, steps: Sequence[tuple[int, Any]],
                loss_fn: Callable[[Any], tuple[torch.Tensor, Mapping[str, float]]], desc: str = "train",
                stop: Callable[[int], bool] | None = None) -> list[dict]:
    """The optimisation loop shared by fine-tuning, LoRA and the unlearning baselines.

    ``steps`` lists one ``(epoch, payload)`` per optimiser step (epoch 1-based); ``loss_fn(payload)``
    returns ``(loss, terms)``: the scalar to minimise and extra floats to log. Each step: AdamW
    (:func:`_optimizer`; weight decay on matrices only) with linear warmup over ``cfg.warmup_ratio``
    of the steps then linear decay to 0, gradient clipping at ``cfg.max_grad_norm`` (``<= 0``: off).
    Only parameters with ``requires_grad`` are trained. Returns one dict per step: ``step``
    (1-based), ``epoch``, ``loss`` (before the update), ``lr`` (used for that update), then the
    terms. The model is left in eval mode; a tqdm bar on stderr shows progress. ``stop(step)``,
    when given, is called after each update (model in train mode on return) and ends training
    early when it returns ``True`` (the learning-rate schedule still spans all of ``steps``).
    """
    total = len(steps)
    warmup = int(round(cfg.warmup_ratio * total))

    def lr_factor(step: int) -> float:  # step = number of updates done so far
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    optimizer = _optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    rows: list[dict] = []
    model.train()
    bar = tqdm(total=total, desc=desc, file=sys.stderr, mininterval=1.0, dynamic_ncols=True, leave=False)
    try:
        for step, (epoch, payload) in enumerate(steps, start=1):
            loss, terms = loss_fn(payload)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.max_grad_norm and cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"{desc}: loss is {value} at step {step} (lower the learning rate)")
            rows.append({"step": step, "epoch": int(epoch), "loss": value, "lr": float(lr), **{k: float(v) for k, v in terms.items()}})
            bar.update(1)
            if step % 10 == 0 or step == total:
                bar.set_postfix(epoch=epoch, loss=f"{value:.3f}", refresh=False)
            if stop is not None and stop(step):
                break
    finally:
        bar.close()
        model.eval()
    return rows


def epoch_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The shuffled, length-bucketed batches of one epoch (0-based), seeded by ``seed`` and ``epoch``."""
    return bucketed_batches(lengths, batch_size, epoch_seed(seed, epoch), shuffle=True)


def epoch_steps(lengths: Sequence[int], batch_size: int, epochs: int, seed: int) -> list[tuple[int, list[int]]]:
    """One ``(epoch, batch)`` per optimiser step over ``epochs`` epochs (1-based in the result) of
    :func:`epoch_batches`: the ``steps`` of :func:`train_steps` for training on one example set."""
    return [(epoch + 1, idx) for epoch in range(epochs) for idx in epoch_batches(lengths, batch_size, seed, epoch)]


def train_causal_lm(model, tokenizer, records: Sequence[Mapping[str, Any]], template: PromptTemplate,
                    cfg: TrainConfig, desc: str = "train") -> pd.DataFrame:
    """Train ``model`` on QA ``records`` (``question``/``answer`` keys) with the answer-only loss.

    Each epoch draws new length-bucketed batches (seeded by ``cfg.seed`` and the epoch); the loss of a
    batch is the mean NLL over its answer tokens (EOS included). Only parameters with
    ``requires_grad`` are trained (:func:`train_steps`). Returns a frame with one row per optimiser
    step: ``step`` (1-based), ``epoch`` (1-based), ``loss`` (of that batch, before the update) and
    ``lr`` (used for that update). The model is left in eval mode.
    """
    set_determinism(cfg.seed, cfg.threads)
    if not records:
        raise ValueError(f"{desc}: no training records")
    pad_id = pad_token_id(tokenizer)
    examples = encode_qa_many(tokenizer, template, [qa_pair(r) for r in records], cfg.max_length)
    lengths = [len(x[0]) for x in examples]
    steps = epoch_steps(lengths, cfg.batch_size, cfg.epochs, cfg.seed)

    def loss_fn(idx):
        nll, _ = answer_token_nll(model, collate([examples[i] for i in idx], pad_id))
        return nll.mean(), {}

    rows = train_steps(model, cfg, steps, loss_fn, desc=desc)
    return pd.DataFrame(rows, columns=["step", "epoch", "loss", "lr"])


def add_lora(model, cfg: LoraTrainConfig):
    """Wrap ``model`` with PEFT LoRA adapters of shape ``cfg`` (base modified in place and frozen).

    The adapters' random ``A`` init is seeded by ``cfg.train.seed``; ``B`` starts at zero (PEFT
    default), so the wrapped model starts exactly at the base model.
    """
    from peft import LoraConfig, get_peft_model

    set_determinism(cfg.train.seed, cfg.train.threads)
    lora = LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def train_lora(model, tokenizer, records: Sequence[Mapping[str, Any]], template: PromptTemplate,
               cfg: LoraTrainConfig, desc: str = "lora"):
    """Add LoRA adapters to ``model`` (:func:`add_lora`; the base is modified in place and frozen)
    and train them on ``records``. Returns ``(peft_model, loss_frame)``.
    """
    peft_model = add_lora(model, cfg)
    frame = train_causal_lm(peft_model, tokenizer, records, template, cfg.train, desc=desc)
    return peft_model, frame


def save_adapter(peft_model, out_dir: str | os.PathLike) -> None:
    """Write the LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``) atomically.

    PEFT keeps ``target_modules`` as a set and writes it in hash order, which differs between
    processes; the list is sorted here so that two runs write byte-identical configs.
    """
    import json

    with atomic_dir(out_dir) as tmp:
        peft_model.save_pretrained(str(tmp), safe_serialization=True)
        config_path = Path(tmp) / "adapter_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if isinstance(config.get("target_modules"), list):
            config["target_modules"] = sorted(config["target_modules"])
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
