"""The text baselines' objectives as pure functions of answer-token likelihoods (see
:mod:`qrerase.baselines.text` for the notation and the references): GA, Gradient Difference, KL,
NPO, DPO and FLAT. :mod:`qrerase.baselines.text` re-exports them; :mod:`qrerase.baselines.objective`
evaluates them on (micro-)batches."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .objective import token_mean_nll
from .settings import DIVERGENCES

__all__ = [
    "DIVERGENCES",
    "token_mean_nll",
    "ga_loss",
    "graddiff_loss",
    "kl_divergence",
    "kl_loss",
    "npo_loss",
    "dpo_loss",
    "flat_loss",
]


def ga_loss(forget_nll: torch.Tensor, forget_n: torch.Tensor) -> torch.Tensor:
    """Gradient Ascent: ``L = −ℓ_tok(B_f)`` (minimising it maximises the forget-answer NLL)."""
    return -token_mean_nll(forget_nll, forget_n)


def graddiff_loss(forget_nll, forget_n, retain_nll, retain_n, retain_weight: float) -> torch.Tensor:
    """Gradient Difference: ``L = −ℓ_tok(B_f) + w · ℓ_tok(B_r)``."""
    return ga_loss(forget_nll, forget_n) + retain_weight * token_mean_nll(retain_nll, retain_n)


def kl_divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``mean_t KL(π_ref(·|t) ‖ π_θ(·|t)) = mean_t Σ_v p_ref(v) (log p_ref(v) − log p_θ(v))``.

    ``ref_logits`` and ``logits``: ``(n_tokens, vocab)`` next-token logits at the same positions
    (e.g. :func:`qrerase.text.lm.answer_token_logits` of both models on one batch); computed in float32.
    Zero iff the two next-token distributions agree at every position.
    """
    if ref_logits.shape != logits.shape:
        raise ValueError(f"kl_divergence: shapes differ {tuple(ref_logits.shape)} vs {tuple(logits.shape)}")
    ref_logp = F.log_softmax(ref_logits.float(), dim=-1)
    logp = F.log_softmax(logits.float(), dim=-1)
    per_token = (ref_logp.exp() * (ref_logp - logp)).sum(dim=-1)
    return per_token.mean() if per_token.numel() else per_token.sum()


def kl_loss(forget_nll, forget_n, ref_retain_logits, retain_logits, retain_weight: float) -> torch.Tensor:
    """KL Minimisation: ``L = −ℓ_tok(B_f) + w · KL(π_ref ‖ π_θ)`` on the retain answer tokens."""
    return ga_loss(forget_nll, forget_n) + retain_weight * kl_divergence(ref_retain_logits, retain_logits)


def npo_loss(forget_nll: torch.Tensor, ref_forget_nll: torch.Tensor, beta: float) -> torch.Tensor:
    """NPO: ``L = (2/β) · mean_i log(1 + (π_θ(y_i|x_i) / π_ref(y_i|x_i))^β)``.

    With ``log π = −nll`` the ratio term is ``exp(β (ref_nll − nll))``, so
    ``L = (2/β) · mean softplus(β (ref_forget_nll − forget_nll))`` (numerically stable). At
    ``π_θ = π_ref`` it equals ``2 log 2 / β``; as ``β → 0`` its gradient tends to that of
    ``−mean_i nll_i`` (gradient ascent on sequence NLLs).
    """
    if beta <= 0:
        raise ValueError(f"npo_loss: beta must be > 0, got {beta}")
    return (2.0 / beta) * F.softplus(beta * (ref_forget_nll - forget_nll)).mean()


def dpo_loss(chosen_nll, rejected_nll, ref_chosen_nll, ref_rejected_nll, beta: float) -> torch.Tensor:
    """DPO: ``L = −mean_i log σ(β [(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))])``.

    ``chosen`` = the preferred answer ``y_w`` (a refusal), ``rejected`` = the dispreferred ``y_l``
    (the forget answer); all four are per-sequence NLL sums (``log π = −nll``). At ``π_θ = π_ref``
    it equals ``log 2``.
    """
    if beta <= 0:
        raise ValueError(f"dpo_loss: beta must be > 0, got {beta}")
    margin = (ref_chosen_nll - chosen_nll) - (ref_rejected_nll - rejected_nll)
    return -F.logsigmoid(beta * margin).mean()


def _flat_pair(divergence: str):
    """``(g*, f*∘g*)`` of an f-divergence's variational form (FLAT, following its reference code)."""
    log2 = math.log(2.0)
    if divergence == "tv":  # total variation: g*(v) = tanh(v)/2, f*(u) = u
        return (lambda v: torch.tanh(v) / 2), (lambda v: torch.tanh(v) / 2)
    if divergence == "kl":  # g*(v) = v, f*(u) = exp(u − 1)
        return (lambda v: v), (lambda v: torch.exp(v - 1))
    if divergence == "js":  # g*(v) = log 2 − log(1 + e^{−v}), f*(u) = −log(2 − e^u)
        return (lambda v: log2 - F.softplus(-v)), (lambda v: -log2 + v + F.softplus(-v))
    if divergence == "pearson":  # g*(v) = v, f*(u) = u²/4 + u
        return (lambda v: v), (lambda v: v * v / 4 + v)
    raise ValueError(f"flat_loss: unknown divergence {divergence!r}; expected one of {list(DIVERGENCES)}")


def flat_loss(template_prob: torch.Tensor, forget_prob: torch.Tensor, divergence: str = "tv") -> torch.Tensor:
    """FLAT: ``L = −g*(P̄_e) + f*(g*(P̄_f))``.

    ``template_prob`` / ``forget_prob``: per-sequence mean answer-token probabilities
    ``P(y|x) = (1/n) Σ_t π_θ(y_t | x, y_<t)`` of the template (refusal) answer and of the forget
    answer, shape ``(B,)``; ``P̄`` is their batch mean. Minimising ``L`` raises the template
    answer's probability and lowers the forget answer's, weighted by the divergence's pair
    ``(g*, f*)`` (:data:`DIVERGENCES`). (The reference code averages token probabilities over all
    positions of a padded batch; here each sequence's answer tokens weigh equally.)
    """
    g, fg = _flat_pair(divergence)
    return -g(template_prob.mean()) + fg(forget_prob.mean())


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
