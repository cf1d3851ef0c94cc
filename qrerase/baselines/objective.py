"""The text baselines' objective: the base class a baseline subclasses, on one step's payload, whole or
split into micro-batches.

A text baseline is one module (:mod:`qrerase.baselines.standard`, :mod:`~qrerase.baselines.simnpo`,
:mod:`~qrerase.baselines.rmu`, :mod:`~qrerase.baselines.undial`, or a plug-in's): its hyperparameter
dataclass, its :class:`TextObjective` subclass and its :func:`qrerase.registry.register_method` call.
:func:`qrerase.baselines.text.train_baseline` looks the subclass up, prepares what its class attributes ask
for and trains with it on :func:`qrerase.engine.train_steps` (the engine's gradient accumulation and data
parallelism).

Torch-free at import, like every baseline module: the workflow imports the registering modules at
planning time, so tensors and models are touched only inside the methods (which import what they use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["TextObjective", "ForgetAscent", "ExampleMean", "token_mean_nll"]


def token_mean_nll(nll: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``ℓ_tok = Σ_i nll_i / Σ_i n_i``: the mean answer-token NLL of a batch (the fine-tuning loss).

    ``nll``: per-sequence answer NLL sums, float, shape ``(B,)``; ``n``: their answer token counts, shape
    ``(B,)``. Returns a scalar tensor (a count sum of 0 counts as 1)."""
    return nll.sum() / n.sum().clamp_min(1)


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
        from ..text.losses import answer_tokens

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
        from ..text.lm import collate, sequence_nll

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
        from ..text.lm import collate

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


class ExampleMean(TextObjective):
    """Objectives that are example means over the forget batch: a piece is its own objective weighted
    by ``|piece| / |batch|``."""

    def _piece(self, f, f_live, r, r_live, whole):
        wf = 1.0 if f_live else 0.0
        loss, terms = self.full((f, None))
        return loss * (wf * len(f) / whole["n"]), terms
