"""Deterministic causal-LM training on QA pairs: full fine-tuning and LoRA.

* :func:`train_causal_lm` trains all trainable parameters of a model with AdamW, linear warmup and
  decay, gradient clipping and the TOFU answer-only loss, on length-bucketed batches.
* :func:`train_lora` wraps a model with PEFT LoRA adapters (:func:`add_lora`) and trains only those;
  :func:`save_adapter` writes ``adapter_config.json`` + ``adapter_model.safetensors`` atomically.

Both run the engine's optimisation loop, :func:`qrerase.engine.train_steps`. Runs are reproducible:
:func:`qrerase.engine.set_determinism` seeds every RNG, fixes the thread count and turns on
``torch.use_deterministic_algorithms``; batch composition and order come from seeded RNGs. Two runs
with the same seed, data and thread count give bit-identical weights.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import from_mapping
from ..engine import epoch_seed, set_determinism, train_steps
from ..hparams import ENGINE_KEYS, TrainConfig
from ..io import atomic_dir
from .lm import PromptTemplate, answer_token_nll, bucketed_batches, collate, encode_qa_many, pad_token_id, qa_pair
from .losses import token_mean_split

__all__ = [
    "ENGINE_KEYS",
    "TrainConfig",
    "LoraTrainConfig",
    "epoch_batches",
    "epoch_steps",
    "train_causal_lm",
    "add_lora",
    "train_lora",
    "save_adapter",
]


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
    def from_dict(cls, d: Mapping[str, Any]) -> LoraTrainConfig:
        return from_mapping(cls, d, "LoRA training config")


def epoch_batches(lengths: Sequence[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The shuffled, length-bucketed batches of one epoch (0-based), seeded by ``seed`` and ``epoch``."""
    return bucketed_batches(lengths, batch_size, epoch_seed(seed, epoch), shuffle=True)


def epoch_steps(lengths: Sequence[int], batch_size: int, epochs: int, seed: int) -> list[tuple[int, list[int]]]:
    """One ``(epoch, batch)`` per optimiser step over ``epochs`` epochs (1-based in the result) of
    :func:`epoch_batches`: the ``steps`` of :func:`train_steps` for training on one example set."""
    return [(epoch + 1, idx) for epoch in range(epochs) for idx in epoch_batches(lengths, batch_size, seed, epoch)]


def train_causal_lm(
    model,
    tokenizer,
    records: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    cfg: TrainConfig,
    desc: str = "train",
    on_epoch_end: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """Train ``model`` on QA ``records`` (``question``/``answer`` keys) with the answer-only loss.

    Each epoch draws new length-bucketed batches (seeded by ``cfg.seed`` and the epoch); the loss of a
    batch is the mean NLL over its answer tokens (EOS included). Only parameters with
    ``requires_grad`` are trained (:func:`train_steps`). Returns a frame with one row per optimiser
    step: ``step`` (1-based), ``epoch`` (1-based), ``loss`` (of that batch, before the update) and
    ``lr`` (used for that update). The model is left in eval mode. ``on_epoch_end(epoch)`` (1-based),
    when given, runs after the last update of each epoch, without gradients (the ``stop`` hook of
    :func:`train_steps`; it never stops training), e.g. to score the model mid-run
    (:func:`qrerase.text.probe.memorisation_probe`).
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

    stop = None
    if on_epoch_end is not None:
        last = {i: epoch for i, (epoch, _) in enumerate(steps, start=1)}  # step -> its epoch; later steps overwrite
        ends = {i: e for i, e in last.items() if i == len(steps) or last[i + 1] != e}

        def stop(step: int) -> bool:
            if step in ends:
                on_epoch_end(ends[step])
            return False

    rows = train_steps(
        model, cfg, steps, loss_fn, desc=desc, split=token_mean_split(model, examples, pad_id), stop=stop
    )
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


def train_lora(
    model,
    tokenizer,
    records: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    cfg: LoraTrainConfig,
    desc: str = "lora",
):
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
