"""The standard text baselines of the TOFU benchmark's protocol, one registration each next to its objective:
Gradient Ascent, Gradient Difference, KL Minimisation, NPO, DPO and FLAT (the loss functions:
:mod:`qrerase.baselines.losses`; the notation and references: :mod:`qrerase.baselines.text`).

Torch-free at import (the registry imports this module at planning time): the methods import what they
compute with. A new baseline with its own hyperparameter is one module like :mod:`qrerase.baselines.simnpo`
(CONTRIBUTING.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hparams import Hparams, hparam
from ..registry import register_method
from .objective import ExampleMean, ForgetAscent, TextObjective, token_mean_nll
from .settings import DIVERGENCES

__all__ = [
    "RetainWeight",
    "Preference",
    "FlatHparams",
    "GradientAscent",
    "GradientDifference",
    "KLMinimization",
    "NPO",
    "DPO",
    "FLAT",
]


@dataclass
class RetainWeight(Hparams):
    """graddiff, kl: the weight of the retain term."""

    retain_weight: float = hparam(
        1.0,
        "w: weight of the retain term (graddiff: retain NLL; kl: KL to the fine-tuned model on retain answer tokens)",
        ge=0,
    )


@dataclass
class Preference(Hparams):
    """npo, dpo: the inverse temperature."""

    beta: float = hparam(0.1, "beta: the inverse temperature of the NPO / DPO objective", gt=0)


@dataclass
class FlatHparams(Hparams):
    """FLAT: the f-divergence."""

    divergence: str = hparam(
        "tv",
        "the f-divergence of the FLAT objective (total variation, KL, Jensen-Shannon, Pearson)",
        choices=DIVERGENCES,
    )


class GradientAscent(ForgetAscent):
    """ga: ``L = −ℓ_tok(B_f)``."""

    def _loss(self, nll, n, ridx, terms):
        from .losses import ga_loss

        return ga_loss(nll, n)


class GradientDifference(ForgetAscent):
    """graddiff: ``L = −ℓ_tok(B_f) + w · ℓ_tok(B_r)``."""

    needs_retain = True

    def _loss(self, nll, n, ridx, terms):
        from .losses import graddiff_loss

        r_nll, r_n = self._nll(self.retain_ex, ridx)
        terms["retain_nll"] = float(token_mean_nll(r_nll, r_n).detach())
        return graddiff_loss(nll, n, r_nll, r_n, self.hparams.retain_weight)

    def _retain_piece(self, loss, r, wr, whole, terms):
        r_nll, r_n = self._nll(self.retain_ex, r)
        terms["retain_nll"] = float(token_mean_nll(r_nll, r_n).detach())
        return loss + r_nll.sum() * (self.hparams.retain_weight * wr / whole["nr"])


class KLMinimization(ForgetAscent):
    """kl: ``L = −ℓ_tok(B_f) + w · KL(π_ref ‖ π_θ)`` on the retain answer tokens."""

    needs_retain = True
    needs_reference = True

    def _kl_logits(self, ridx):
        import torch

        from ..text.lm import answer_token_logits, collate
        from .text import reference

        batch = collate([self.retain_ex[i] for i in ridx], self.pad_id)
        with torch.no_grad(), reference(self.ref_model) as ref:
            ref_logits, _, _ = answer_token_logits(ref, batch)
        logits, _, _ = answer_token_logits(self.model, batch)
        return ref_logits.to(logits.device), logits

    def _loss(self, nll, n, ridx, terms):
        from .losses import kl_divergence, kl_loss

        ref_logits, logits = self._kl_logits(ridx)
        loss = kl_loss(nll, n, ref_logits, logits, self.hparams.retain_weight)
        terms["retain_kl"] = float(kl_divergence(ref_logits, logits.detach()))
        return loss

    def _retain_piece(self, loss, r, wr, whole, terms):
        from .losses import kl_divergence

        ref_logits, logits = self._kl_logits(r)
        kl = kl_divergence(ref_logits, logits)
        terms["retain_kl"] = float(kl.detach())
        return loss + kl * (self.hparams.retain_weight * wr * logits.shape[0] / whole["nr"])


class NPO(ExampleMean):
    """npo: ``L = (2/β) · mean_{B_f} log(1 + (π_θ(y|x) / π_ref(y|x))^β)``."""

    needs_reference = True
    reference_nll = ("forget",)

    def full(self, payload):
        from .losses import npo_loss

        idx, _ = payload
        nll, n = self._nll(self.forget_ex, idx)
        terms = {"forget_nll": float(token_mean_nll(nll, n).detach())}
        return npo_loss(nll, self.ref_forget[idx].to(nll.device), self.hparams.beta), terms


class DPO(ExampleMean):
    """dpo: refusals preferred over the forget answers, relative to π_ref."""

    needs_reference = True
    reference_nll = ("forget", "refusal")

    def full(self, payload):
        from ..text.lm import sequence_nll
        from .losses import dpo_loss

        idx, _ = payload
        nll, n = sequence_nll(self.model, self._pairs(idx))
        k = len(idx)
        chosen, rejected = nll[:k], nll[k:]
        loss = dpo_loss(
            chosen,
            rejected,
            self.ref_refusal[idx].to(nll.device),
            self.ref_forget[idx].to(nll.device),
            self.hparams.beta,
        )
        terms = {
            "forget_nll": float(token_mean_nll(rejected, n[k:]).detach()),
            "refusal_nll": float(token_mean_nll(chosen, n[:k]).detach()),
        }
        return loss, terms


class FLAT(TextObjective):
    """flat: ``L = −g*(P̄_e) + f*(g*(P̄_f))``, a non-linear function of batch means: a piece is linearised
    at the whole batch's means (a no-grad pass over the batch), which gives the exact gradient, plus a
    constant so that the pieces' losses sum to its value."""

    def _flat_probs(self, idx):
        import torch

        from ..text.lm import answer_token_nll, per_sequence

        tok_nll, mask = answer_token_nll(self.model, self._pairs(idx))
        mask = mask.to(tok_nll.device)
        nll, n = per_sequence(tok_nll, mask)
        prob_sum, _ = per_sequence(torch.exp(-tok_nll), mask)
        k = len(idx)
        prob = prob_sum / n.clamp_min(1)
        return prob[:k], prob[k:], nll[k:], n[k:]

    def full(self, payload):
        from .losses import flat_loss

        idx, _ = payload
        p_e, p_f, nll, n = self._flat_probs(idx)
        loss = flat_loss(p_e, p_f, self.hparams.divergence)
        terms = {
            "forget_nll": float(token_mean_nll(nll, n).detach()),
            "forget_prob": float(p_f.mean().detach()),
            "refusal_prob": float(p_e.mean().detach()),
        }
        return loss, terms

    def _piece(self, f, f_live, r, r_live, whole):
        import torch

        from .losses import flat_loss

        wf = 1.0 if f_live else 0.0
        if "coef" not in whole:  # FLAT's batch means over the whole step batch, without gradients
            with torch.no_grad():
                sums = torch.zeros(2, dtype=torch.float64)
                for piece, live in whole["pieces"]:
                    if live:
                        p_e, p_f, _, _ = self._flat_probs(piece)
                        sums += torch.stack([p_e.sum(), p_f.sum()]).double().cpu()
            means = (sums / whole["n"]).float().requires_grad_(True)
            value = flat_loss(means[:1], means[1:], self.hparams.divergence)
            (coef,) = torch.autograd.grad(value, means)
            whole["coef"] = coef.detach()
            whole["offset"] = float(value.detach() - (coef * means.detach()).sum()) / whole["parts"]
        p_e, p_f, nll, n = self._flat_probs(f)
        c = whole["coef"].to(p_e.device)
        loss = (c[0] * p_e.sum() + c[1] * p_f.sum()) * (wf / whole["n"]) + whole["offset"]
        terms = {
            "forget_nll": float(token_mean_nll(nll, n).detach()),
            "forget_prob": float(p_f.mean().detach()),
            "refusal_prob": float(p_e.mean().detach()),
        }
        return loss, terms


# The registrations, in table order.
register_method(
    "ga",
    label="Gradient Ascent",
    description="Gradient Ascent: minus the mean answer-token NLL of the forget set",
    run={"text": GradientAscent},
    plan_shape=(1, 0),
)
register_method(
    "graddiff",
    label="Gradient Difference",
    description="Gradient Difference: forget NLL ascent plus retain_weight x retain NLL",
    run={"text": GradientDifference},
    hparams=RetainWeight,
    plan_shape=(2, 0),
)
register_method(
    "kl",
    label="KL Minimization",
    description="KL Minimisation: forget NLL ascent plus retain_weight x KL to the fine-tuned model on retain answers",
    run={"text": KLMinimization},
    hparams=RetainWeight,
    plan_shape=(2, 1),
)
register_method(
    "npo",
    label="NPO",
    description="NPO (Zhang et al. 2024)",
    run={"text": NPO},
    hparams=Preference,
    plan_shape=(1, 1),
)
register_method(
    "dpo",
    label="DPO",
    description="DPO (Rafailov et al. 2023) with refusals as preferred answers",
    run={"text": DPO},
    hparams=Preference,
    inputs=("refusals",),
    plan_shape=(2, 1),
)
register_method(
    "flat",
    label="FLAT",
    description="FLAT (Wang et al. 2025), forget data only",
    run={"text": FLAT},
    hparams=FlatHparams,
    inputs=("refusals",),
    plan_shape=(2, 0),
)
