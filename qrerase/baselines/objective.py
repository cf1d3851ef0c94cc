"""The text baselines' objectives on one step's payload, whole or split into micro-batches.

Used by :func:`qrerase.baselines.text.train_baseline` with :func:`qrerase.text.training.train_steps`
(the engine's gradient accumulation and data parallelism); the loss functions are those of
:mod:`qrerase.baselines.text`.
"""

from __future__ import annotations

import torch

from ..text.lm import answer_token_logits, answer_token_nll, collate, per_sequence, sequence_nll
from ..text.training import answer_tokens
from .losses import dpo_loss, flat_loss, ga_loss, graddiff_loss, kl_divergence, kl_loss, npo_loss, token_mean_nll

__all__ = ["TextObjective"]


class TextObjective:
    """The baselines' objectives on a step payload ``(forget batch, retain batch)``.

    :meth:`full` is the objective of a whole step (the table above). :meth:`split` divides it into
    ``parts`` micro-batch thunks whose losses sum to it (:func:`qrerase.text.training.train_steps`):
    token means are divided by the whole batch's token count (GA, GradDiff, KL), example means are
    weighted by ``|piece| / |batch|`` (NPO, DPO); FLAT, a non-linear function of batch means, is
    linearised at the whole batch's means (a no-grad pass over the batch), which gives the exact
    gradient, plus a constant so that the pieces' losses sum to its value.
    """

    def __init__(
        self, method, cfg, model, ref_model, pad_id, forget_ex, retain_ex, refusal_ex, ref_forget, ref_refusal
    ):
        self.method, self.cfg, self.model, self.ref_model, self.pad_id = method, cfg, model, ref_model, pad_id
        self.forget_ex, self.retain_ex, self.refusal_ex = forget_ex, retain_ex, refusal_ex
        self.ref_forget, self.ref_refusal = ref_forget, ref_refusal
        self.fcount = [answer_tokens(e) for e in forget_ex]
        self.rcount = [answer_tokens(e) for e in retain_ex]

    def _nll(self, examples, idx):
        return sequence_nll(self.model, collate([examples[i] for i in idx], self.pad_id))

    def _pairs(self, idx):
        both = [self.refusal_ex[i] for i in idx] + [self.forget_ex[i] for i in idx]
        return collate(both, self.pad_id)

    def _flat_probs(self, idx):
        tok_nll, mask = answer_token_nll(self.model, self._pairs(idx))
        mask = mask.to(tok_nll.device)
        nll, n = per_sequence(tok_nll, mask)
        prob_sum, _ = per_sequence(torch.exp(-tok_nll), mask)
        k = len(idx)
        prob = prob_sum / n.clamp_min(1)
        return prob[:k], prob[k:], nll[k:], n[k:]

    def full(self, payload):
        idx, ridx = payload
        method, cfg, model = self.method, self.cfg, self.model
        terms: dict[str, float] = {}
        if method == "dpo":
            nll, n = sequence_nll(model, self._pairs(idx))
            k = len(idx)
            chosen, rejected = nll[:k], nll[k:]
            loss = dpo_loss(
                chosen, rejected, self.ref_refusal[idx].to(nll.device), self.ref_forget[idx].to(nll.device), cfg.beta
            )
            terms["forget_nll"] = float(token_mean_nll(rejected, n[k:]).detach())
            terms["refusal_nll"] = float(token_mean_nll(chosen, n[:k]).detach())
            return loss, terms
        if method == "flat":
            p_e, p_f, nll, n = self._flat_probs(idx)
            loss = flat_loss(p_e, p_f, cfg.divergence)
            terms["forget_nll"] = float(token_mean_nll(nll, n).detach())
            terms["forget_prob"] = float(p_f.mean().detach())
            terms["refusal_prob"] = float(p_e.mean().detach())
            return loss, terms
        nll, n = self._nll(self.forget_ex, idx)
        terms["forget_nll"] = float(token_mean_nll(nll, n).detach())
        if method == "ga":
            return ga_loss(nll, n), terms
        if method == "npo":
            return npo_loss(nll, self.ref_forget[idx].to(nll.device), cfg.beta), terms
        if method == "graddiff":
            r_nll, r_n = self._nll(self.retain_ex, ridx)
            terms["retain_nll"] = float(token_mean_nll(r_nll, r_n).detach())
            return graddiff_loss(nll, n, r_nll, r_n, cfg.retain_weight), terms
        ref_logits, logits = self._kl_logits(ridx)
        loss = kl_loss(nll, n, ref_logits, logits, cfg.retain_weight)
        terms["retain_kl"] = float(kl_divergence(ref_logits, logits.detach()))
        return loss, terms

    def _kl_logits(self, ridx):
        batch = collate([self.retain_ex[i] for i in ridx], self.pad_id)
        with torch.no_grad():
            ref_logits, _, _ = answer_token_logits(self.ref_model, batch)
        logits, _, _ = answer_token_logits(self.model, batch)
        return ref_logits.to(logits.device), logits

    def split(self, payload, parts: int):
        from .. import engine

        idx, ridx = payload
        fpieces = engine.chunk(idx, parts)
        rpieces = engine.chunk(ridx, parts) if ridx is not None else [(None, False)] * parts
        whole = {
            "n": len(idx),
            "nf": max(1, sum(self.fcount[i] for i in idx)),
            "nr": max(1, sum(self.rcount[i] for i in ridx)) if ridx is not None else 1,
            "parts": parts,
            "pieces": fpieces,
        }
        return [
            (lambda f=f, fl=fl, r=r, rl=rl: self._piece(f, fl, r, rl, whole))
            for (f, fl), (r, rl) in zip(fpieces, rpieces)
        ]

    def _piece(self, f, f_live, r, r_live, whole):
        method, cfg = self.method, self.cfg
        wf, wr = (1.0 if f_live else 0.0), (1.0 if r_live else 0.0)
        if method in ("npo", "dpo"):
            loss, terms = self.full((f, None))
            return loss * (wf * len(f) / whole["n"]), terms
        if method == "flat":
            return self._flat_piece(f, wf, whole)
        nll, n = self._nll(self.forget_ex, f)
        terms = {"forget_nll": float(token_mean_nll(nll, n).detach())}
        loss = -nll.sum() * (wf / whole["nf"])
        if method == "graddiff":
            r_nll, r_n = self._nll(self.retain_ex, r)
            terms["retain_nll"] = float(token_mean_nll(r_nll, r_n).detach())
            loss = loss + r_nll.sum() * (cfg.retain_weight * wr / whole["nr"])
        elif method == "kl":
            ref_logits, logits = self._kl_logits(r)
            kl = kl_divergence(ref_logits, logits)
            terms["retain_kl"] = float(kl.detach())
            loss = loss + kl * (cfg.retain_weight * wr * logits.shape[0] / whole["nr"])
        return loss, terms

    def _flat_piece(self, f, wf, whole):
        if "coef" not in whole:  # FLAT's batch means over the whole step batch, without gradients
            with torch.no_grad():
                sums = torch.zeros(2, dtype=torch.float64)
                for piece, live in whole["pieces"]:
                    if live:
                        p_e, p_f, _, _ = self._flat_probs(piece)
                        sums += torch.stack([p_e.sum(), p_f.sum()]).double().cpu()
            means = (sums / whole["n"]).float().requires_grad_(True)
            value = flat_loss(means[:1], means[1:], self.cfg.divergence)
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
