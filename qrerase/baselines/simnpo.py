"""SimNPO (Fan et al. 2024, "Simplicity Prevails: Rethinking Negative Preference Optimization for LLM
Unlearning", arXiv:2410.07163) as a text baseline.

NPO without the reference model: the forget-answer reward is the length-normalised log-likelihood,
with a reward margin ``γ``. For a forget batch ``B_f`` and a retain batch ``B_r`` (notation of
:mod:`qrerase.baselines.text`; ``|y|`` the answer's token count, EOS included)::

    L_f = −(2/β) · mean_{i∈B_f} log σ(−(β/|y_i|) · log π_θ(y_i|x_i) − γ)          (paper, eq. 4)
    L   = w_f · L_f + w_r · ℓ_tok(B_r)                   (the reference TOFU objective, "simnpo_grad_diff")

Minimising ``L_f`` lowers every forget answer's per-token likelihood, with a weight ``σ(β ℓ̄_i − γ)``-like
saturation (``ℓ̄_i = −log π(y_i|x_i) / |y_i|``) that vanishes once an answer is forgotten. Defaults
(:class:`SimNpoHparams`, registered with the method) are the TOFU forget10 values
of the authors' code (OPTML-Group/Unlearn-Simple, TOFU/README.md and TOFU/config/forget.yaml: ``beta=4.5``,
``npo_coeff=0.125``, ``grad_diff_coeff=1.0``, ``gamma=0.0``), also those of open-unlearning's
configs/trainer/SimNPO.yaml (``beta: 4.5``, ``gamma: 0.125`` = the forget weight, ``alpha: 1.0``, ``delta:
0.0`` = the margin).

The margin convention: the paper's ``γ`` (used here) is subtracted after the ``β`` scaling; the
reference code's ``gamma`` / ``delta`` is subtracted from ``ℓ̄`` before it (``β(ℓ̄ − δ)``), so
``γ = β · δ``. Both are 0 by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..hparams import Hparams, hparam
from ..registry import register_method
from .objective import TextObjective, token_mean_nll

if TYPE_CHECKING:
    import torch

__all__ = ["SimNpoHparams", "simnpo_loss", "SimNPO"]


@dataclass
class SimNpoHparams(Hparams):
    """SimNPO (:mod:`qrerase.baselines.simnpo`). Defaults: the TOFU forget10 values of the authors' code
    (OPTML-Group/Unlearn-Simple: ``beta=4.5``, ``npo_coeff=0.125``, ``grad_diff_coeff=1.0``, ``gamma=0``),
    also open-unlearning's configs/trainer/SimNPO.yaml."""

    beta: float = hparam(
        4.5, "beta: the inverse temperature of SimNPO (reference: 4.5, the authors' forget10 value)", gt=0
    )
    gamma: float = hparam(0.0, "gamma: the reward margin of SimNPO, subtracted after the beta scaling", ge=0)
    forget_weight: float = hparam(0.125, "w_f: weight of the SimNPO forget term (the reference npo_coeff 0.125)", gt=0)
    retain_weight: float = hparam(
        1.0, "w_r: weight of the retain answer NLL (reference grad_diff_coeff 1.0; 0 = no retain pass)", ge=0
    )


def simnpo_loss(forget_nll: torch.Tensor, forget_n: torch.Tensor, beta: float, gamma: float = 0.0) -> torch.Tensor:
    """SimNPO's forget term ``L_f = −(2/β) · mean_i log σ(−(β/|y_i|) log π(y_i|x_i) − γ)``.

    ``forget_nll``: per-sequence answer NLL sums ``−log π(y_i|x_i)``, float, shape ``(B,)``;
    ``forget_n``: their answer token counts ``|y_i|`` (> 0), shape ``(B,)``. With ``log π = −nll``
    and ``−log σ(z) = softplus(−z)``: ``L_f = (2/β) · mean_i softplus(γ − β · nll_i / n_i)``
    (numerically stable; computed in float32). Returns a scalar tensor, differentiable in
    ``forget_nll``. At ``nll_i / n_i = γ / β`` for every i it equals ``2 log 2 / β``; it decreases
    monotonically in each ``nll_i``.
    """
    import torch
    import torch.nn.functional as F

    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"simnpo_loss: 'beta' must be a finite number > 0, got {beta!r}")
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"simnpo_loss: 'gamma' must be a finite number >= 0, got {gamma!r}")
    if forget_nll.ndim != 1 or forget_nll.shape != forget_n.shape or forget_nll.numel() == 0:
        raise ValueError(
            f"simnpo_loss: 'forget_nll' and 'forget_n' must be equal non-empty 1-D shapes, got "
            f"{tuple(forget_nll.shape)} and {tuple(forget_n.shape)}"
        )
    n = forget_n.to(device=forget_nll.device, dtype=torch.float32)
    if bool((n <= 0).any()):
        raise ValueError("simnpo_loss: every 'forget_n' (answer token count) must be > 0")
    per_token = forget_nll.float() / n
    return (2.0 / beta) * F.softplus(gamma - beta * per_token).mean()


class SimNPO(TextObjective):
    """simnpo: ``L = w_f · L_f(B_f) + w_r · ℓ_tok(B_r)`` (:func:`simnpo_loss`; ``self.hparams``: a
    :class:`SimNpoHparams`).

    ``L_f`` is an example mean: a micro-batch piece contributes its own ``L_f`` times
    ``|piece| / |B_f|``; the retain NLL is a token mean: a piece contributes its NLL sum over the
    whole retain batch's answer token count. Logged terms: ``forget_nll`` (token-mean forget NLL),
    ``simnpo`` (``L_f``) and, with ``w_r > 0``, ``retain_nll``.
    """

    needs_retain = True

    def _forget(self, idx):
        nll, n = self._nll(self.forget_ex, idx)
        lf = simnpo_loss(nll, n, self.hparams.beta, self.hparams.gamma)
        return lf, {"forget_nll": float(token_mean_nll(nll, n).detach()), "simnpo": float(lf.detach())}

    def full(self, payload):
        idx, ridx = payload
        lf, terms = self._forget(idx)
        r_n = sum(self.rcount[i] for i in ridx)
        return self.hparams.forget_weight * lf + self._retain(ridx, max(1, r_n), terms), terms

    def _piece(self, f, f_live, r, r_live, whole):
        wf, wr = (1.0 if f_live else 0.0), (1.0 if r_live else 0.0)
        lf, terms = self._forget(f)
        loss = self.hparams.forget_weight * lf * (wf * len(f) / whole["n"])
        return loss + wr * self._retain(r, whole["nr"], terms), terms


register_method(
    "simnpo",
    label="SimNPO",
    description="SimNPO (Fan et al. 2024): NPO without pi_ref, length-normalised, plus a retain NLL",
    run={"text": SimNPO},
    hparams=SimNpoHparams,
    plan_shape=(2, 0),
)
