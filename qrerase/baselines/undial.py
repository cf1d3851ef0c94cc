"""UNDIAL (Dong et al. 2024, "UNDIAL: Self-Distillation with Adjusted Logits for Robust Unlearning in
Large Language Models", NAACL 2025, arXiv:2402.10052) as a text baseline.

Self-distillation towards the frozen fine-tuned model π_ref with the logit of the token to forget
lowered: at each forget answer position ``t`` with target token ``y_t`` and π_ref's next-token
logits ``z_ref,t``, the teacher distribution and the loss are::

    q_t = softmax(z_ref,t − β · onehot(y_t))                              (the adjusted teacher)
    L_f = mean_{t ∈ answer tokens of B_f} H(q_t, π_θ(·|t)) = −mean_t Σ_v q_t(v) log π_θ(v|t)
    L   = L_f + w_r · ℓ_tok(B_r)

``H(q, p)`` is the cross-entropy against the soft labels, as in the reference code; it equals ``KL(q ‖ π_θ) +
H(q)`` with ``H(q)`` fixed (π_ref is frozen), so it has the KL's gradient. Defaults
(:class:`UndialHparams`, registered with the method): open-unlearning's
configs/trainer/UNDIAL.yaml (``beta: 10.0``, ``alpha: 0.0``, ``gamma: 1.0``; its
community/methods/UNDIAL/README.md: the paper does not use the retain set, β typically in {3, 10, 30}, lr 1e-4
with LoRA r 8 / alpha 16 on Llama-2 7B).

Difference from the reference code (open-unlearning src/trainer/utils.py ``compute_undial_loss``):
there the loss is averaged over every position of the padded batch, prompt and padding included
(whose label −100 lowers the logit of vocabulary entry ``V − 100``); here only the forget answer
tokens (EOS included) are scored, as every other text baseline's forget term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..hparams import Hparams, hparam
from ..registry import register_method
from .objective import TextObjective

if TYPE_CHECKING:
    import torch

__all__ = ["UndialHparams", "undial_teacher", "undial_token_loss", "UNDIAL"]


@dataclass
class UndialHparams(Hparams):
    """UNDIAL (:mod:`qrerase.baselines.undial`). Defaults: open-unlearning's configs/trainer/UNDIAL.yaml
    (``beta: 10``, ``alpha: 0``: the paper uses no retain term)."""

    beta: float = hparam(
        10.0, "beta: how much the target token's teacher logit is lowered (reference 10; 0 distils pi_ref)", ge=0
    )
    retain_weight: float = hparam(0.0, "w_r: weight of the retain answer NLL (reference 0: no retain pass)", ge=0)


def _check(ref_logits: torch.Tensor, targets: torch.Tensor, beta: float, what: str) -> None:
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"{what}: 'beta' must be a finite number >= 0, got {beta!r}")
    if ref_logits.ndim != 2 or targets.shape != (ref_logits.shape[0],):
        raise ValueError(
            f"{what}: expected ref_logits (n_tokens, vocab) and targets (n_tokens,), got "
            f"{tuple(ref_logits.shape)} and {tuple(targets.shape)}"
        )
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= ref_logits.shape[1]):
        raise ValueError(f"{what}: 'targets' must be token ids in [0, {ref_logits.shape[1]})")


def undial_teacher(ref_logits: torch.Tensor, targets: torch.Tensor, beta: float) -> torch.Tensor:
    """The adjusted teacher ``q_t = softmax(z_ref,t − β · onehot(y_t))``.

    ``ref_logits``: π_ref's next-token logits ``(n_tokens, vocab)`` at the forget answer positions
    (:func:`qrerase.text.lm.answer_token_logits`); ``targets``: the answer token ids ``y_t``,
    ``(n_tokens,)`` int64. Returns float32 probabilities ``(n_tokens, vocab)`` (rows sum to 1); the
    target's probability is π_ref's odds of it divided by ``e^β``.
    """
    import torch
    import torch.nn.functional as F

    _check(ref_logits, targets, beta, "undial_teacher")
    z = ref_logits.detach().float().clone()
    rows = torch.arange(z.shape[0], device=z.device)
    z[rows, targets.to(z.device)] -= beta
    return F.softmax(z, dim=-1)


def undial_token_loss(
    logits: torch.Tensor, ref_logits: torch.Tensor, targets: torch.Tensor, beta: float
) -> torch.Tensor:
    """Per-token UNDIAL loss ``H(q_t, π_θ(·|t)) = −Σ_v q_t(v) log softmax(z_θ,t)(v)``, shape ``(n_tokens,)``.

    ``logits``: the trained model's next-token logits ``(n_tokens, vocab)`` at the same positions as
    ``ref_logits`` (:func:`undial_teacher`, which gives ``q_t``); float32, differentiable in
    ``logits`` only. ``L_f`` is its mean over the batch's answer tokens.
    """
    if logits.shape != ref_logits.shape:
        raise ValueError(f"undial_token_loss: shapes differ {tuple(logits.shape)} vs {tuple(ref_logits.shape)}")
    import torch.nn.functional as F

    q = undial_teacher(ref_logits, targets, beta).to(logits.device)
    return -(q * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1)


class UNDIAL(TextObjective):
    """undial: ``L = mean_t H(q_t, π_θ) + w_r · ℓ_tok(B_r)`` (``self.hparams``: an
    :class:`UndialHparams`).

    π_ref is kept frozen during training (``needs_reference`` without ``reference_nll``; in LoRA mode
    the adapter-disabled model). Both terms are token means: a micro-batch piece contributes its
    sums over the whole batch's answer token counts. Logged terms: ``forget_nll`` (token-mean forget
    NLL of π_θ, from the same logits), ``undial_ce`` (``L_f``) and, with ``w_r > 0``, ``retain_nll``.
    """

    needs_retain = True
    needs_reference = True

    def _forget(self, idx):
        """``(Σ_t H(q_t, π_θ), terms)`` over the answer tokens of forget examples ``idx``."""
        import torch
        import torch.nn.functional as F

        from ..text.lm import answer_token_logits, collate
        from .text import reference

        batch = collate([self.forget_ex[i] for i in idx], self.pad_id)
        with torch.no_grad(), reference(self.ref_model) as ref:
            ref_logits, _, _ = answer_token_logits(ref, batch)
        logits, targets, _ = answer_token_logits(self.model, batch)
        ce = undial_token_loss(logits, ref_logits.to(logits.device), targets, self.hparams.beta)
        nll = F.cross_entropy(logits.detach().float(), targets, reduction="mean")
        return ce.sum(), {"forget_nll": float(nll), "undial_ce": float(ce.detach().mean())}

    def full(self, payload):
        idx, ridx = payload
        ce_sum, terms = self._forget(idx)
        nf = max(1, sum(self.fcount[i] for i in idx))
        nr = max(1, sum(self.rcount[i] for i in ridx))
        return ce_sum / nf + self._retain(ridx, nr, terms), terms

    def _piece(self, f, f_live, r, r_live, whole):
        wf, wr = (1.0 if f_live else 0.0), (1.0 if r_live else 0.0)
        ce_sum, terms = self._forget(f)
        return ce_sum * (wf / whole["nf"]) + wr * self._retain(r, whole["nr"], terms), terms


register_method(
    "undial",
    label="UNDIAL",
    description="UNDIAL (Dong et al. 2024): self-distillation, the target token's logit lowered",
    run={"text": UNDIAL},
    hparams=UndialHparams,
    plan_shape=(2, 1),
)
