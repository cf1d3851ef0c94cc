"""The text baselines' objectives on one step's payload, whole or split into micro-batches.

One :class:`TextObjective` subclass per baseline, registered as its ``text`` implementation in
:mod:`qrerase.registry`; :func:`qrerase.baselines.text.train_baseline` looks it up, prepares what its
class attributes ask for and trains with it on :func:`qrerase.engine.train_steps` (the engine's
gradient accumulation and data parallelism). The loss functions are those of :mod:`qrerase.baselines.losses`.
"""

from __future__ import annotations

import torch

from ..text.lm import answer_token_logits, answer_token_nll, collate, per_sequence, sequence_nll
from ..text.losses import answer_tokens
from .losses import dpo_loss, flat_loss, ga_loss, graddiff_loss, kl_divergence, kl_loss, npo_loss, token_mean_nll

__all__ = [
    "TextObjective",
    "ForgetAscent",
    "GradientAscent",
    "GradientDifference",
    "KLMinimization",
    "ExampleMean",
    "NPO",
    "DPO",
    "FLAT",
]


class TextObjective:
    """A text baseline's objective on a step payload ``(forget batch, retain batch)``.

    :meth:`full` is the objective of a whole step (:mod:`qrerase.baselines.text`'s table). :meth:`split`
    divides it into ``parts`` micro-batch thunks whose losses sum to it
    (:func:`qrerase.engine.train_steps`); each subclass gives :meth:`_piece`.

    Class attributes (what :func:`~qrerase.baselines.text.train_baseline` prepares): ``needs_retain``
    (retain examples), ``needs_reference`` (the frozen fine-tuned model π_ref), ``reference_nll``
    (the sets, among ``forget`` and ``refusal``, whose per-example π_ref NLL sums are computed once,
    after the engine's preparation and before the first step, into ``ref_forget`` / ``ref_refusal``;
    π_ref itself is then dropped). A subclass with ``needs_reference`` and no
    ``reference_nll`` keeps π_ref (frozen) and evaluates ``self.ref_model`` through
    :func:`qrerase.baselines.text.reference` (in LoRA mode π_ref is the adapter-disabled model).
    Refusal answers (one per forget question, ``refusal_ex``) come with a method registered with
    ``inputs=("refusals",)`` (:mod:`qrerase.registry`: the workflow plans that input).

    ``cfg``: the job's :class:`~qrerase.baselines.settings.TextBaselineConfig`; ``self.hparams`` is its
    ``hparams``, the method's own hyperparameters (the dataclass registered with ``hparams=``:
    ``retain_weight`` of graddiff / kl, ``beta`` of NPO / DPO, ``divergence`` of FLAT).
    """

    needs_retain = False
    needs_reference = False
    reference_nll: tuple[str, ...] = ()

    def __init__(self, cfg, model, ref_model, pad_id, forget_ex, retain_ex, refusal_ex, ref_forget, ref_refusal):
        self.cfg, self.model, self.ref_model, self.pad_id = cfg, model, ref_model, pad_id
        self.hparams = cfg.hparams  # the method's own hyperparameters (its registered dataclass)
        self.forget_ex, self.retain_ex, self.refusal_ex = forget_ex, retain_ex, refusal_ex
        self.ref_forget, self.ref_refusal = ref_forget, ref_refusal
        self.fcount = [answer_tokens(e) for e in forget_ex]
        self.rcount = [answer_tokens(e) for e in retain_ex]

    @classmethod
    def keeps_reference(cls) -> bool:
        """π_ref stays in memory during training (its logits are needed at every step)."""
        return cls.needs_reference and not cls.reference_nll

    def _nll(self, examples, idx):
        return sequence_nll(self.model, collate([examples[i] for i in idx], self.pad_id))

    def _retain(self, ridx, denominator, terms):
        """The retain term of a method with a ``retain_weight`` hyperparameter (SimNPO, UNDIAL):
        ``w_r · Σ_{B} nll / denominator`` over retain batch ``ridx``, its token-mean NLL logged in
        ``terms``; 0 without a retain forward when ``w_r = 0``."""
        if self.hparams.retain_weight == 0:
            return 0.0
        r_nll, r_n = self._nll(self.retain_ex, ridx)
        terms["retain_nll"] = float(token_mean_nll(r_nll, r_n).detach())
        return self.hparams.retain_weight * r_nll.sum() / denominator

    def _pairs(self, idx):
        both = [self.refusal_ex[i] for i in idx] + [self.forget_ex[i] for i in idx]
        return collate(both, self.pad_id)

    def full(self, payload):
        """``(loss, terms)`` of a whole step's payload."""
        raise NotImplementedError

    def split(self, payload, parts: int):
        from .. import engine

        idx, ridx = payload
        fpieces = engine.chunk(idx, parts)
        rpieces = engine.chunk(ridx, parts) if ridx is not None else [(None, False)] * parts
        # the whole step's counts: forget examples n, forget / retain answer tokens nf / nr, retain examples n_r
        whole = {
            "n": len(idx),
            "nf": max(1, sum(self.fcount[i] for i in idx)),
            "nr": max(1, sum(self.rcount[i] for i in ridx)) if ridx is not None else 1,
            "n_r": len(ridx) if ridx is not None else 1,
            "parts": parts,
            "pieces": fpieces,
        }
        return [
            (lambda f=f, fl=fl, r=r, rl=rl: self._piece(f, fl, r, rl, whole))
            for (f, fl), (r, rl) in zip(fpieces, rpieces)
        ]

    def _piece(self, f, f_live, r, r_live, whole):
        raise NotImplementedError


class ForgetAscent(TextObjective):
    """Objectives ``−ℓ_tok(B_f) + retain term``: token means, so a piece divides its forget NLL sum by
    the whole batch's token count (and its retain term likewise, :meth:`_retain_piece`)."""

    def full(self, payload):
        idx, ridx = payload
        nll, n = self._nll(self.forget_ex, idx)
        terms = {"forget_nll": float(token_mean_nll(nll, n).detach())}
        return self._loss(nll, n, ridx, terms), terms

    def _loss(self, nll, n, ridx, terms):
        raise NotImplementedError

    def _piece(self, f, f_live, r, r_live, whole):
        wf, wr = (1.0 if f_live else 0.0), (1.0 if r_live else 0.0)
        nll, n = self._nll(self.forget_ex, f)
        terms = {"forget_nll": float(token_mean_nll(nll, n).detach())}
        loss = -nll.sum() * (wf / whole["nf"])
        return self._retain_piece(loss, r, wr, whole, terms), terms

    def _retain_piece(self, loss, r, wr, whole, terms):
        return loss


class GradientAscent(ForgetAscent):
    """ga: ``L = −ℓ_tok(B_f)``."""

    def _loss(self, nll, n, ridx, terms):
        return ga_loss(nll, n)


class GradientDifference(ForgetAscent):
    """graddiff: ``L = −ℓ_tok(B_f) + w · ℓ_tok(B_r)``."""

    needs_retain = True

    def _loss(self, nll, n, ridx, terms):
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
        from .text import reference

        batch = collate([self.retain_ex[i] for i in ridx], self.pad_id)
        with torch.no_grad(), reference(self.ref_model) as ref:
            ref_logits, _, _ = answer_token_logits(ref, batch)
        logits, _, _ = answer_token_logits(self.model, batch)
        return ref_logits.to(logits.device), logits

    def _loss(self, nll, n, ridx, terms):
        ref_logits, logits = self._kl_logits(ridx)
        loss = kl_loss(nll, n, ref_logits, logits, self.hparams.retain_weight)
        terms["retain_kl"] = float(kl_divergence(ref_logits, logits.detach()))
        return loss

    def _retain_piece(self, loss, r, wr, whole, terms):
        ref_logits, logits = self._kl_logits(r)
        kl = kl_divergence(ref_logits, logits)
        terms["retain_kl"] = float(kl.detach())
        return loss + kl * (self.hparams.retain_weight * wr * logits.shape[0] / whole["nr"])


class ExampleMean(TextObjective):
    """Objectives that are example means over the forget batch: a piece is its own objective weighted
    by ``|piece| / |batch|``."""

    def _piece(self, f, f_live, r, r_live, whole):
        wf = 1.0 if f_live else 0.0
        loss, terms = self.full((f, None))
        return loss * (wf * len(f) / whole["n"]), terms


class NPO(ExampleMean):
    """npo: ``L = (2/β) · mean_{B_f} log(1 + (π_θ(y|x) / π_ref(y|x))^β)``."""

    needs_reference = True
    reference_nll = ("forget",)

    def full(self, payload):
        idx, _ = payload
        nll, n = self._nll(self.forget_ex, idx)
        terms = {"forget_nll": float(token_mean_nll(nll, n).detach())}
        return npo_loss(nll, self.ref_forget[idx].to(nll.device), self.hparams.beta), terms


class DPO(ExampleMean):
    """dpo: refusals preferred over the forget answers, relative to π_ref."""

    needs_reference = True
    reference_nll = ("forget", "refusal")

    def full(self, payload):
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
        tok_nll, mask = answer_token_nll(self.model, self._pairs(idx))
        mask = mask.to(tok_nll.device)
        nll, n = per_sequence(tok_nll, mask)
        prob_sum, _ = per_sequence(torch.exp(-tok_nll), mask)
        k = len(idx)
        prob = prob_sum / n.clamp_min(1)
        return prob[:k], prob[k:], nll[k:], n[k:]

    def full(self, payload):
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
