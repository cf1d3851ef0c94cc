"""Speech track training and evaluation of the speaker classifier (paper §4.3).

:func:`train_classifier` trains it (cross-entropy, AdamW, warmup + linear decay, deterministic);
:func:`train_speech_lora` trains LoRA adapters on the attention projections
(e.g. HuBERT's ``hubert.encoder.layers.N.attention.{q,k,v,out}_proj``); :func:`evaluate_sets` reports top-k
accuracy on D_t, D_f and D_r. Arrays as in :mod:`qrerase.tracks.speech.data`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "batches",
    "as_tensors",
    "classifier_logits",
    "train_classifier",
    "speech_lora_config",
    "train_speech_lora",
    "predict_logits",
    "topk_accuracy",
    "evaluate_sets",
]


def batches(n: int, batch_size: int, seed: int | None) -> list[np.ndarray]:
    """Index batches over ``range(n)``: a permutation seeded by ``seed`` (None: in order)."""
    order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def as_tensors(arrays: Mapping[str, np.ndarray], mask: np.ndarray | None, device) -> tuple:
    """``(input_values, attention_mask, labels)`` tensors of the utterances selected by ``mask`` (all: None),
    on ``device``."""
    import torch

    sel = slice(None) if mask is None else np.flatnonzero(mask)
    x = torch.from_numpy(np.array(arrays["input_values"][sel])).to(device)  # copies: safetensors arrays are read-only
    m = torch.from_numpy(np.array(arrays["attention_mask"][sel])).to(device)
    y = torch.from_numpy(np.array(arrays["labels"][sel])).to(device)
    if len(y) == 0:
        raise ValueError("no utterances selected")
    return x, m, y


def classifier_logits(model, x, m):
    """Speaker logits (N, n_speakers) of waveforms ``x`` (N, L) with attention mask ``m``."""
    return model(input_values=x, attention_mask=m).logits


def train_classifier(
    model,
    arrays: Mapping[str, np.ndarray],
    mask: np.ndarray | None,
    cfg,
    desc: str = "train",
    loss_fn: Callable | None = None,
) -> pd.DataFrame:
    """Train the trainable parameters of a sequence classifier on the selected utterances.

    ``cfg`` is a :class:`qrerase.text.training.TrainConfig` (epochs, lr, batch_size, weight_decay,
    warmup_ratio, max_grad_norm, seed, threads): AdamW, linear warmup then linear decay to 0, gradient
    clipping (the loop of :func:`qrerase.engine.train_steps`), batches drawn by a generator seeded
    with (seed, epoch). ``loss_fn(model, x, m, y)``
    defaults to the cross-entropy of the speaker labels; it must be a mean over the batch's utterances
    (micro-batches are weighted by their share of the batch, :func:`qrerase.engine.example_mean_split`).
    Returns the loss curve (``step, epoch, loss, lr``, one row per update); the model is left in eval mode.
    """
    import torch
    import torch.nn.functional as F

    from ...engine import example_mean_split, train_steps
    from ...engine.determinism import epoch_seed, set_determinism
    from ...engine.placement import model_device

    set_determinism(cfg.seed, cfg.threads)
    x, m, y = as_tensors(arrays, mask, model_device(model))
    if loss_fn is None:

        def loss_fn(model, xb, mb, yb):
            return F.cross_entropy(classifier_logits(model, xb, mb), yb)

    steps = [
        (epoch + 1, idx)
        for epoch in range(cfg.epochs)
        for idx in batches(len(y), cfg.batch_size, epoch_seed(cfg.seed, epoch))
    ]

    def step_loss(idx):
        b = torch.from_numpy(idx)
        return loss_fn(model, x[b], m[b], y[b]), {}

    rows = train_steps(model, cfg, steps, step_loss, desc=desc, split=example_mean_split(lambda idx: step_loss(idx)))
    return pd.DataFrame(rows, columns=["step", "epoch", "loss", "lr"])


def speech_lora_config(r: int, alpha: float, dropout: float, target_modules: Sequence[str]):
    """A PEFT ``LoraConfig`` for the encoder's attention projections (no task head is added or trained)."""
    from peft import LoraConfig

    return LoraConfig(
        r=int(r), lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), bias="none"
    )


def train_speech_lora(model, arrays: Mapping[str, np.ndarray], mask: np.ndarray, cfg, desc: str = "lora"):
    """Wrap ``model`` with LoRA adapters (``cfg``: :class:`qrerase.text.training.LoraTrainConfig`; its A init
    seeded by ``cfg.train.seed``, B = 0 so training starts at the model) and train only them with
    cross-entropy on the selected utterances. Returns ``(peft_model, loss_curve)``."""
    import torch
    from peft import get_peft_model

    from ...engine.determinism import set_determinism

    set_determinism(cfg.train.seed, cfg.train.threads)
    lora = speech_lora_config(cfg.r, cfg.alpha, cfg.dropout, cfg.target_modules)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        peft_model = get_peft_model(model, lora)
    curve = train_classifier(peft_model, arrays, mask, cfg.train, desc=desc)
    return peft_model, curve


# --------------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------------


def predict_logits(
    model, arrays: Mapping[str, np.ndarray], mask: np.ndarray | None = None, batch_size: int = 64
) -> np.ndarray:
    """Logits (N, n_speakers) float32 of the selected utterances (eval mode, no grad), in order."""
    import torch

    from ...engine.placement import model_device

    x, m, _ = as_tensors(arrays, mask, model_device(model))
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            out.append(classifier_logits(model, x[i : i + batch_size], m[i : i + batch_size]).float().cpu())
    return torch.cat(out).numpy()


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int = 1) -> float:
    """Fraction of rows whose label is among the k largest logits.

    Ties at the k-th value count in the label's favour only when it is strictly among the top k by
    ``argsort`` order (stable, lower class index first), so the result is deterministic.
    """
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels)
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"topk_accuracy: logits must be (N, C) and labels (N,), got {logits.shape} and {labels.shape}")
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"topk_accuracy: k={k} must lie in [1, {logits.shape[1]}] (number of classes)")
    if logits.shape[0] == 0:
        raise ValueError("topk_accuracy: no rows")
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return float(np.mean((top == labels[:, None]).any(axis=1)))


def evaluate_sets(
    model, arrays: Mapping[str, np.ndarray], masks: Mapping[str, np.ndarray], k: int = 1, batch_size: int = 64
) -> pd.DataFrame:
    """Top-k accuracy per evaluation set: frame with columns ``set, n, k, accuracy`` (one row per mask)."""
    rows = []
    for name, mask in masks.items():
        mask = np.asarray(mask, dtype=bool)
        if not mask.any():
            raise ValueError(f"evaluation set {name!r} is empty")
        logits = predict_logits(model, arrays, mask, batch_size)
        rows.append((name, int(mask.sum()), int(k), topk_accuracy(logits, arrays["labels"][mask], k)))
    return pd.DataFrame(rows, columns=["set", "n", "k", "accuracy"])
