"""The task-level track's optimisation baselines beyond Gradient Ascent: KGA and KU.

Notation as in :mod:`qrerase.baselines.text`: ``π_θ`` the model being unlearned (initialised from the
fine-tuned model), ``π_D`` the frozen fine-tuned model, ``D_f`` / ``D_r`` / ``D_n`` the forget,
retain and *new* (never trained) sets, ``KL_tok(P ‖ Q)`` the mean over answer tokens of the
next-token KL divergence (:func:`qrerase.baselines.text.kl_divergence`).

KGA — knowledge gap alignment (Wang et al., ACL 2023)
    Two auxiliary models start from the same initial checkpoint as the fine-tuned model: ``A_f``
    trained on ``D_f`` and ``A_n`` trained on ``D_n``. The gap between a model that learnt some data
    and one that did not, measured on data only the second one saw, is ``g_n = KL_tok(π_D ‖ A_n)`` on
    ``D_n``; unlearning makes the gap of ``π_θ`` to ``A_f`` on ``D_f`` equal to it, while ``π_θ``
    stays close to ``π_D`` on the retain data::

        L = | g_n(B_n) − KL_tok(π_θ ‖ A_f)(B_f) | + α · KL_tok(π_D ‖ π_θ)(B_r)

    (:func:`kga_loss`; the paper sums the absolute gap difference over pairs of forget and new
    samples, here over pairs of batches of token means.)
KU — knowledge unlearning (Jang et al., ACL 2023)
    Gradient ascent on the *whole* token sequences of ``D_f`` (prompt and answer: the LM loss, not
    the answer-only loss), ``L = −mean_t NLL(x_t | x_<t)`` (:func:`ku_loss`), until the forget
    sequences count as forgotten: their memorisation accuracy
    ``MA(x) = mean_t 1[argmax_v π_θ(v | x_<t) = x_t]`` (:func:`memorization_accuracy`) falls to
    the average MA of the fine-tuned model on unseen sequences (``D_n``), or a fixed threshold.
    KU's second criterion, the extraction likelihood EL_10 (10-gram overlap of greedy continuations),
    needs sequences longer than this track's answers and is not used.

A job's config is a :class:`~qrerase.tracks.task_level.settings.TaskLevelBaselineConfig`: the shared training
keys and the method's own hyperparameters (:class:`~qrerase.tracks.task_level.settings.KgaHparams`: ``α`` =
``alpha``, the auxiliary runs; :class:`~qrerase.tracks.task_level.settings.KuHparams`: ``check_every``,
``ma_threshold``), read as ``cfg.hparams``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

from ... import engine, registry
from ...baselines.text import freeze, kl_divergence, retain_stream, token_mean_nll
from ...engine import train_steps
from ...engine.determinism import set_determinism
from ...text.lm import (
    PromptTemplate,
    answer_token_logits,
    collate,
    encode_qa_many,
    pad_token_id,
    per_sequence,
    qa_pair,
    sequence_nll,
)
from ...text.losses import answer_tokens, token_mean_split
from ...text.training import epoch_steps, train_causal_lm
from .settings import KgaHparams, KuHparams, TaskLevelBaselineConfig

__all__ = [
    "TASK_LEVEL_BASELINES",
    "KgaHparams",
    "KuHparams",
    "TaskLevelBaselineConfig",
    "kga_loss",
    "ku_loss",
    "memorization_accuracy",
    "full_sequence",
    "train_kga",
    "train_ku",
]

#: The task-level track's built-in baselines (from :mod:`qrerase.registry`): Gradient Ascent
#: (qrerase.baselines.text), KGA and KU; their runners: :mod:`qrerase.tracks.task_level.runners`.
TASK_LEVEL_BASELINES = tuple(
    m for m in registry.baselines_of_runner("task_level") if registry.method(m) in registry.METHODS
)


# --------------------------------------------------------------------------------------------------
# Losses and the memorisation criterion
# --------------------------------------------------------------------------------------------------


def kga_loss(
    gap_new: torch.Tensor | float,
    logits_f: torch.Tensor,
    aux_logits_f: torch.Tensor,
    ref_logits_r: torch.Tensor,
    logits_r: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """KGA: ``L = |g_n − KL_tok(π_θ ‖ A_f)| + α · KL_tok(π_D ‖ π_θ)``.

    ``gap_new``: ``g_n = KL_tok(π_D ‖ A_n)`` on a D_n batch (a constant: both models are frozen).
    ``logits_f`` / ``aux_logits_f``: ``(n_tokens, vocab)`` answer-token logits of ``π_θ`` and ``A_f`` on
    a D_f batch; ``ref_logits_r`` / ``logits_r``: those of ``π_D`` and ``π_θ`` on a D_r batch.
    """
    if alpha < 0:
        raise ValueError(f"kga_loss: alpha must be >= 0, got {alpha}")
    gap_forget = kl_divergence(logits_f, aux_logits_f)
    return (torch.as_tensor(gap_new, dtype=gap_forget.dtype) - gap_forget).abs() + alpha * kl_divergence(
        ref_logits_r, logits_r
    )


def ku_loss(nll: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """KU: ``L = −Σ_i nll_i / Σ_i n_i`` over *all* tokens of the forget sequences (per-sequence NLL
    sums ``nll`` and token counts ``n``, shape ``(B,)``): gradient ascent on the LM loss."""
    return -token_mean_nll(nll, n)


def full_sequence(example):
    """An encoded QA example with every token after BOS as a target (the LM loss of KU)."""
    ids, _ = example
    return ids, list(ids)


@torch.no_grad()
def memorization_accuracy(model, examples: Sequence, pad_id: int, batch_size: int = 64) -> np.ndarray:
    """Per-sequence ``MA(x) = mean_t 1[argmax_v π(v | x_<t) = x_t]`` over the labelled positions of
    encoded ``(input_ids, labels)`` examples (KU's criterion with :func:`full_sequence` examples)."""
    was_training = model.training
    model.eval()
    out = np.zeros(len(examples))
    try:
        order = np.argsort([len(e[0]) for e in examples], kind="stable")
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size].tolist()
            logits, targets, mask = answer_token_logits(model, collate([examples[i] for i in idx], pad_id))
            hits = (logits.argmax(dim=-1) == targets).float()
            sums, counts = per_sequence(hits, mask.to(hits.device))
            out[idx] = (sums / counts.clamp_min(1)).cpu().numpy()
    finally:
        model.train(was_training)
    return out


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def _steps(examples, batch_size: int, epochs: int, seed: int):
    return epoch_steps([len(x[0]) for x in examples], batch_size, epochs, seed)


def train_kga(
    model,
    initial,
    tokenizer,
    forget,
    retain,
    new,
    template: PromptTemplate,
    cfg: TaskLevelBaselineConfig,
    desc: str = "kga",
):
    """KGA from the fine-tuned ``model`` (trained in place); returns ``(model, curve)``.

    ``initial``: the checkpoint the fine-tuned model was trained from (a freshly built tiny model or
    the pretrained one); two copies become ``A_f`` (trained on ``forget``) and ``A_n`` (on ``new``).
    One epoch = one pass over D_f; D_n and D_r batches of the same size come from seeded streams.
    Curve columns: ``loss``, ``gap_new``, ``gap_forget``, ``retain_kl``, ``forget_nll``.
    """
    if not forget or not new or not retain:
        raise ValueError(f"{desc}: needs non-empty forget, retain and new sets")
    aux = {}
    for name, data in (("forget", forget), ("new", new)):
        aux_model = copy.deepcopy(initial)
        train_causal_lm(aux_model, tokenizer, data, template, cfg.train_config(aux=True), desc=f"{desc}-A_{name[0]}")
        aux[name] = freeze(aux_model)
    ref = freeze(copy.deepcopy(model))
    set_determinism(cfg.seed, cfg.threads)
    pad_id = pad_token_id(tokenizer)
    enc = {
        k: encode_qa_many(tokenizer, template, [qa_pair(r) for r in v], cfg.max_length)
        for k, v in (("forget", forget), ("retain", retain), ("new", new))
    }
    new_batches = retain_stream([len(x[0]) for x in enc["new"]], cfg.batch_size, cfg.seed + 1)
    retain_batches = retain_stream([len(x[0]) for x in enc["retain"]], cfg.batch_size, cfg.seed)
    # payload of a step: (forget, new, retain) batches, drawn up front so a resumed run sees the same
    steps = [
        (epoch, (idx, next(new_batches), next(retain_batches)))
        for epoch, idx in _steps(enc["forget"], cfg.batch_size, cfg.epochs, cfg.seed)
    ]

    def logits(m, examples, idx):
        return answer_token_logits(m, collate([examples[i] for i in idx], pad_id))[0]

    def loss_fn(payload):
        idx, nidx, ridx = payload
        with torch.no_grad():
            gap_new = kl_divergence(logits(ref, enc["new"], nidx), logits(aux["new"], enc["new"], nidx))
            aux_f = logits(aux["forget"], enc["forget"], idx)
            ref_r = logits(ref, enc["retain"], ridx)
        theta_f, theta_r = logits(model, enc["forget"], idx), logits(model, enc["retain"], ridx)
        loss = kga_loss(gap_new, theta_f, aux_f, ref_r, theta_r, cfg.hparams.alpha)
        with torch.no_grad():
            nll = torch.nn.functional.cross_entropy(
                theta_f.float(), _targets(enc["forget"], idx, pad_id, theta_f.device)
            )
        return loss, {
            "gap_new": float(gap_new),
            "gap_forget": float(kl_divergence(theta_f.detach(), aux_f)),
            "retain_kl": float(kl_divergence(ref_r, theta_r.detach())),
            "forget_nll": float(nll),
        }

    def kl_sum(p_logits, q_logits):  # Σ over tokens of KL(p ‖ q): kl_divergence's mean times the count
        return kl_divergence(p_logits, q_logits) * p_logits.shape[0]

    def split(payload, parts):
        """Exact micro-batches of ``|g_n − KL̄_f| + α KL̄_r``: with ``s = sign(g_n − KL̄_f)`` from a
        no-grad pass over the whole step batch, a piece contributes ``s·g_n/parts − s·ΣKL_f/N_f +
        α·ΣKL_r/N_r`` (sums over its tokens, N over the whole batch's): same sum, same gradient."""
        idx, nidx, ridx = payload
        pieces = list(zip(engine.chunk(idx, parts), engine.chunk(ridx, parts)))
        n_f = max(1, sum(answer_tokens(enc["forget"][i]) for i in idx))
        n_r = max(1, sum(answer_tokens(enc["retain"][i]) for i in ridx))
        whole: dict = {}

        def prepass():
            with torch.no_grad():
                gap_sum = sum(
                    float(kl_sum(logits(ref, enc["new"], p), logits(aux["new"], enc["new"], p)))
                    for p, live in engine.chunk(nidx, parts)
                    if live
                )
                gap_new = gap_sum / max(1, sum(answer_tokens(enc["new"][i]) for i in nidx))
                kl_f = (
                    sum(
                        float(kl_sum(logits(model, enc["forget"], p), logits(aux["forget"], enc["forget"], p)))
                        for (p, live), _ in pieces
                        if live
                    )
                    / n_f
                )
            whole.update(gap_new=gap_new, sign=1.0 if gap_new - kl_f >= 0 else -1.0)

        def piece(f, f_live, r, r_live):
            if not whole:
                prepass()
            s, wf, wr = whole["sign"], float(f_live), float(r_live)
            with torch.no_grad():
                aux_f, ref_r = logits(aux["forget"], enc["forget"], f), logits(ref, enc["retain"], r)
            theta_f, theta_r = logits(model, enc["forget"], f), logits(model, enc["retain"], r)
            loss = (
                s * whole["gap_new"] / parts
                - s * wf * kl_sum(theta_f, aux_f) / n_f
                + cfg.hparams.alpha * wr * kl_sum(ref_r, theta_r) / n_r
            )
            return loss, {
                "gap_new": whole["gap_new"],
                "gap_forget": float(kl_divergence(theta_f.detach(), aux_f)),
                "retain_kl": float(kl_divergence(ref_r, theta_r.detach())),
            }

        return [(lambda f=f, fl=fl, r=r, rl=rl: piece(f, fl, r, rl)) for (f, fl), (r, rl) in pieces]

    rows = train_steps(
        model,
        cfg.train_config(),
        steps,
        loss_fn,
        desc=desc,
        split=split,
        frozen=[ref, aux["forget"], aux["new"]],
        run_settings=cfg,
    )
    model.eval()
    return model, rows


def _targets(examples, idx, pad_id, device):
    labels = collate([examples[i] for i in idx], pad_id)["labels"][:, 1:]
    return labels[labels != -100].to(device)


def train_ku(model, tokenizer, forget, new, template: PromptTemplate, cfg: TaskLevelBaselineConfig, desc: str = "ku"):
    """KU from the fine-tuned ``model`` (trained in place); returns ``(model, curve, info)``.

    Gradient ascent on whole forget sequences (:func:`ku_loss`) for at most ``cfg.epochs`` epochs,
    stopping at the first check (every ``cfg.hparams.check_every`` steps) where the forget set's mean MA is
    ``<=`` the threshold (``cfg.hparams.ma_threshold``, else the mean MA of the fine-tuned model on ``new``).
    ``info``: ``threshold``, ``ma_start``, ``ma_end``, ``steps``, ``stopped`` (criterion reached).
    Curve columns: ``loss``, ``forget_nll`` (token mean over the whole sequences), ``forget_ma``
    (at check steps, else NaN).
    """
    if not forget:
        raise ValueError(f"{desc}: the forget set is empty")
    if cfg.hparams.ma_threshold is None and not new:
        raise ValueError(f"{desc}: the unseen-data threshold needs a non-empty new set (or set ma_threshold)")
    set_determinism(cfg.seed, cfg.threads)
    pad_id = pad_token_id(tokenizer)
    forget_ex = [
        full_sequence(e) for e in encode_qa_many(tokenizer, template, [qa_pair(r) for r in forget], cfg.max_length)
    ]
    if cfg.hparams.ma_threshold is None:
        new_ex = [
            full_sequence(e) for e in encode_qa_many(tokenizer, template, [qa_pair(r) for r in new], cfg.max_length)
        ]
        threshold = float(memorization_accuracy(model, new_ex, pad_id).mean())
    else:
        threshold = float(cfg.hparams.ma_threshold)
    ma_start = float(memorization_accuracy(model, forget_ex, pad_id).mean())
    state = {"ma": ma_start, "stopped": ma_start <= threshold, "checked": {}}

    def loss_fn(idx):
        nll, n = sequence_nll(model, collate([forget_ex[i] for i in idx], pad_id))
        return ku_loss(nll, n), {"forget_nll": float(token_mean_nll(nll, n).detach())}

    def stop(step):
        if step % cfg.hparams.check_every:
            return False
        state["ma"] = float(memorization_accuracy(model, forget_ex, pad_id).mean())
        state["checked"][step] = state["ma"]
        state["stopped"] = state["ma"] <= threshold
        return state["stopped"]

    rows = (
        []
        if state["stopped"]
        else train_steps(
            model,
            cfg.train_config(),
            _steps(forget_ex, cfg.batch_size, cfg.epochs, cfg.seed),
            loss_fn,
            desc=desc,
            stop=stop,
            split=token_mean_split(model, forget_ex, pad_id, sign=-1.0),
            run_settings=cfg,
        )
    )
    if rows and len(rows) not in state["checked"]:
        state["ma"] = float(memorization_accuracy(model, forget_ex, pad_id).mean())
        state["stopped"] = state["ma"] <= threshold
    for r in rows:
        r["forget_ma"] = state["checked"].get(r["step"], float("nan"))
    model.eval()
    info = {
        "threshold": threshold,
        "ma_start": ma_start,
        "ma_end": state["ma"],
        "steps": len(rows),
        "stopped": bool(state["stopped"]),
    }
    return model, rows, info
