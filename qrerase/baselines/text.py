"""Optimisation-based unlearning baselines: GA, Gradient Difference, KL, NPO, DPO and FLAT.

Each baseline fine-tunes the fine-tuned model (all weights, or LoRA adapters merged back at the end)
with an unlearning objective built from answer-token log-likelihoods. Notation, for a QA pair
``(x, y)`` with answer tokens ``y_1..y_n`` (EOS included, as in TOFU):

* ``log π(y|x) = Σ_t log π(y_t | x, y_<t)`` — the sequence log-likelihood (the negative of
  :func:`qrerase.text.lm.sequence_nll`'s sums), ``n`` its token count;
* ``π_ref`` — the frozen fine-tuned model the run starts from;
* ``D_f`` / ``D_r`` — the forget / retain set; ``B_f`` / ``B_r`` a batch of them;
* ``ℓ_tok(B) = Σ_{i∈B} −log π(y_i|x_i) / Σ_{i∈B} n_i`` — the token-mean answer NLL (the fine-tuning loss).

Objectives (minimised; one function each below):

=========  ==================================================================================
ga         ``L = −ℓ_tok(B_f)``  (gradient *ascent* on the forget NLL; Jang et al. 2023)
graddiff   ``L = −ℓ_tok(B_f) + w · ℓ_tok(B_r)``  (Liu et al. 2022)
kl         ``L = −ℓ_tok(B_f) + w · KL(π_ref ‖ π_θ)`` on the retain answer tokens
npo        ``L = (2/β) · mean_{B_f} log(1 + (π_θ(y|x) / π_ref(y|x))^β)``  (Zhang et al. 2024)
dpo        ``L = −mean_{B_f} log σ(β[(log π_θ(y_w|x) − log π_ref(y_w|x)) − (log π_θ(y_l|x) − log π_ref(y_l|x))])``
           with ``y_w`` a refusal ("I don't know"-style) and ``y_l`` the forget answer (Rafailov et al. 2023)
flat       ``L = −g*(P̄_e) + f*(g*(P̄_f))`` with ``P̄`` the batch mean of the per-sequence mean token
           probability of the template (refusal) answer ``e`` and of the forget answer ``f``, and
           ``(g*, f*)`` the variational pair of an f-divergence (Wang et al. 2025; forget data only)
=========  ==================================================================================

:func:`train_baseline` runs one of them deterministically (:func:`qrerase.engine.train_steps`:
AdamW, linear warmup/decay, clipping, seeded length-bucketed batches) and returns the unlearned
model and its loss curve. Each objective is a :class:`qrerase.baselines.objective.TextObjective`
subclass, registered as the method's ``text`` implementation in :mod:`qrerase.registry`
(:func:`objective_of`) with the dataclass of its own hyperparameters (``w``: ``retain_weight``, ``β``:
``beta``, FLAT's ``divergence``: :mod:`qrerase.baselines.settings`), which it reads as
``cfg.hparams``; a plug-in text baseline registers its own subclass and dataclass. Its job config is
a :class:`~qrerase.baselines.settings.TextBaselineConfig`: the shared training keys plus those.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .. import registry
from ..engine import train_steps
from ..engine.determinism import set_determinism
from ..text.lm import (
    PromptTemplate,
    collate,
    encode_qa_many,
    pad_token_id,
    qa_pair,
    sequence_nll,
)
from ..text.training import add_lora, epoch_batches, epoch_steps
from .losses import (
    DIVERGENCES,
    dpo_loss,
    flat_loss,
    ga_loss,
    graddiff_loss,
    kl_divergence,
    kl_loss,
    npo_loss,
    token_mean_nll,
)
from .settings import TextBaselineConfig

__all__ = [
    "TEXT_BASELINES",
    "DIVERGENCES",
    "TextBaselineConfig",
    "token_mean_nll",
    "ga_loss",
    "graddiff_loss",
    "kl_divergence",
    "kl_loss",
    "npo_loss",
    "dpo_loss",
    "flat_loss",
    "objective_of",
    "read_refusals",
    "freeze",
    "AdapterDisabled",
    "reference",
    "loads_sharded",
    "retain_stream",
    "train_baseline",
]

#: The built-in text baselines, in the paper's table order (from :mod:`qrerase.registry`).
TEXT_BASELINES = tuple(m for m in registry.baselines_of_runner("text") if registry.method(m) in registry.METHODS)


def objective_of(method: str):
    """The :class:`~qrerase.baselines.objective.TextObjective` subclass of a text baseline (its
    registered ``text`` implementation); ``ValueError`` naming the method when it has none."""
    return registry.implementation(method, "text")


# --------------------------------------------------------------------------------------------------
# Losses. Inputs are per-sequence answer NLL sums ``nll`` (= −log π(y|x), float, shape (B,)) and
# token counts ``n`` (shape (B,)), unless stated otherwise. Each returns a scalar tensor.
# --------------------------------------------------------------------------------------------------


def read_refusals(path) -> list[str]:
    """Refusal answers, one per non-empty line (TOFU's ``idontknow.txt``); ``ValueError`` when none."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{path}: refusal file not found")
    from ..io import read_text

    lines = [line.strip() for line in read_text(p).splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: no refusal answers (expected one per line)")
    return lines


def freeze(model):
    """Eval mode and ``requires_grad=False`` on every parameter (a frozen reference model); returns it."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class AdapterDisabled:
    """π_ref of a LoRA-mode run: the PEFT model being trained, evaluated with its adapter disabled
    (the frozen base it started from), so the reference costs no second copy of the model.
    Evaluate it through :func:`reference`."""

    def __init__(self, peft_model):
        self.peft_model = peft_model


@contextlib.contextmanager
def reference(ref_model):
    """The model to evaluate as π_ref (under ``torch.no_grad``): ``ref_model`` itself, or for an
    :class:`AdapterDisabled` its PEFT model inside PEFT's ``disable_adapter()`` (LoRA layers skipped)."""
    if isinstance(ref_model, AdapterDisabled):
        with ref_model.peft_model.disable_adapter():
            yield ref_model.peft_model
    else:
        yield ref_model


def loads_sharded(cfg: TextBaselineConfig) -> tuple[bool, bool]:
    """How a baseline job loads its models (:func:`qrerase.text.models.load_model` ``sharded``):
    ``(model, reference)``, True where only rank 0 reads the weights: both under FSDP2 over several
    processes (:func:`qrerase.engine.sharded`), for every method; False otherwise.

    A reference kept during training (KL) is sharded with the model; π_ref's NLLs computed once
    (the objective's ``reference_nll``, NPO / DPO) are computed after the engine's preparation, on
    the sharded reference (:func:`train_baseline`'s prelude), which is then dropped. In LoRA mode no
    separate reference is loaded (π_ref is the adapter-disabled model).
    """
    from ..engine import sharded

    return sharded(cfg.backend), sharded(cfg.backend)


@torch.no_grad()
def _reference_nll(ref_model, examples, pad_id: int, batch_size: int) -> torch.Tensor:
    """Per-example answer NLL sums ``−log π_ref(y|x)`` (float32, shape ``(len(examples),)``, on the
    CPU) under the frozen reference, in length-sorted batches of ``batch_size`` (computed once, in
    :func:`train_baseline`'s prelude; every rank computes every example, in the same order)."""
    out = torch.empty(len(examples), dtype=torch.float32)
    order = np.argsort([len(e[0]) for e in examples], kind="stable")
    with reference(ref_model) as ref:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size].tolist()
            sums, _ = sequence_nll(ref, collate([examples[i] for i in idx], pad_id))
            out[idx] = sums.float().cpu()
    return out


def retain_stream(lengths: Sequence[int], batch_size: int, seed: int):
    """Endless seeded retain batches: successive shuffled bucketed passes over the retain set."""
    stream_seed = (int(seed) + 0x5EED) % (2**63)
    k = 0
    while True:
        yield from epoch_batches(lengths, batch_size, stream_seed, k)
        k += 1


def train_baseline(
    model,
    ref_model,
    tokenizer,
    forget: Sequence[Mapping[str, Any]],
    retain: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    cfg: TextBaselineConfig,
    refusals: Sequence[str] | None = None,
    desc: str | None = None,
):
    """Unlearn ``forget`` from ``model`` with baseline ``cfg.method``; returns ``(model, curve)``.

    ``model``: the fine-tuned causal LM (trained in place in ``full`` mode; in ``lora`` mode LoRA
    adapters are added, trained and merged, so the result is always a plain ``PreTrainedModel``).
    ``ref_model``: a frozen copy of the same fine-tuned model (π_ref), required in ``full`` mode by
    methods whose objective has ``needs_reference``, ignored otherwise; in ``lora`` mode π_ref is
    the model with its adapter disabled (:class:`AdapterDisabled`, no second copy) and
    ``ref_model`` is not used (None is fine). An objective with ``reference_nll`` (NPO, DPO) gets
    π_ref's per-example NLL sums from :func:`qrerase.engine.train_steps`' prelude: computed
    after the engine's preparation (under FSDP2 on the sharded reference, so every model can be
    loaded sharded: :func:`loads_sharded`), before the first step and again on a resumed run; the
    full-mode reference is then dropped (meta device). ``forget`` / ``retain``: QA records
    (``question``/``answer`` or TOFU keys); ``retain`` is used by ``needs_retain`` methods.
    ``refusals``: template answers for methods registered with the ``refusals`` input; each forget question gets
    one, drawn once with the configured seed. The objective is the method's registered
    :class:`~qrerase.baselines.objective.TextObjective` (:func:`objective_of`).

    One epoch = one pass over the forget set in shuffled length-bucketed batches of
    ``cfg.batch_size`` (retain batches of the same size are drawn from an endless seeded stream).
    Returns the model in eval mode and the loss curve: one dict per step with ``step``, ``epoch``,
    ``loss``, ``lr``, ``forget_nll`` (token-mean NLL of the forget batch) and the method's own terms
    (``retain_nll``, ``retain_kl``, ``refusal_nll``, ``forget_prob``, ``refusal_prob``).
    """
    method = cfg.method
    objective = objective_of(method)
    needs_refusals = "refusals" in registry.method(method).inputs
    desc = desc or method
    if not forget:
        raise ValueError(f"{desc}: the forget set is empty")
    if objective.needs_retain and not retain:
        raise ValueError(f"{desc}: method {method!r} needs a non-empty retain set")
    if objective.needs_reference and ref_model is None and cfg.mode != "lora":
        raise ValueError(f"{desc}: method {method!r} needs the reference (fine-tuned) model")
    if needs_refusals and not refusals:
        raise ValueError(f"{desc}: method {method!r} needs refusal answers (one per line, e.g. idontknow.txt)")
    set_determinism(cfg.seed, cfg.threads)
    pad_id = pad_token_id(tokenizer)
    forget_pairs = [qa_pair(r) for r in forget]
    forget_ex = encode_qa_many(tokenizer, template, forget_pairs, cfg.max_length)
    retain_ex = (
        encode_qa_many(tokenizer, template, [qa_pair(r) for r in retain], cfg.max_length)
        if objective.needs_retain
        else []
    )
    refusal_ex = []
    if needs_refusals:
        rng = np.random.default_rng(cfg.seed)
        picks = rng.integers(len(refusals), size=len(forget_pairs))
        refusal_ex = encode_qa_many(
            tokenizer, template, [(q, refusals[int(j)]) for (q, _), j in zip(forget_pairs, picks)], cfg.max_length
        )
    lora = cfg.mode == "lora"
    if lora:  # π_ref is the base: the adapter-disabled model itself (B = 0, so it starts equal to it)
        model = add_lora(model, cfg.lora_config())
        ref_model = AdapterDisabled(model) if objective.needs_reference else None
    elif objective.needs_reference:
        freeze(ref_model)
    set_determinism(cfg.seed, cfg.threads)
    lengths = [len(x[0]) for x in forget_ex]
    steps = epoch_steps(lengths, cfg.batch_size, cfg.epochs, cfg.seed)
    retain_batches = retain_stream([len(x[0]) for x in retain_ex], cfg.batch_size, cfg.seed) if retain_ex else None
    # payload of a step: (forget batch, retain batch or None), drawn up front so a resumed run sees the same
    steps = [(epoch, (idx, next(retain_batches) if retain_batches is not None else None)) for epoch, idx in steps]
    losses = objective(cfg, model, ref_model, pad_id, forget_ex, retain_ex, refusal_ex, None, None)
    by_ref = objective.reference_nll

    def prelude(evaluate):  # π_ref's NLLs, after preparation (FSDP2: on the sharded reference)
        nll = {"forget": forget_ex, "refusal": refusal_ex}
        done = {k: evaluate(lambda ex=nll[k]: _reference_nll(ref_model, ex, pad_id, cfg.batch_size)) for k in by_ref}
        losses.ref_forget, losses.ref_refusal = done.get("forget"), done.get("refusal")

    rows = train_steps(
        model,
        cfg.train_config(),
        steps,
        losses.full,
        desc=desc,
        split=losses.split,
        frozen=[ref_model] if objective.keeps_reference() and not lora else [],
        run_settings=cfg,
        prelude=prelude if by_ref else None,
        prelude_models=[ref_model] if by_ref and not lora else [],  # dropped after the prelude
    )
    if lora:  # on rank 0's CPU after a sharded run (the other ranks merge empty storage)
        model = model.merge_and_unload()
    model.eval()
    return model, rows
