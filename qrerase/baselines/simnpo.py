"""SimNPO (Fan et al. 2024, "Simplicity Prevails: Rethinking Negative Preference Optimization for LLM
Unlearning", arXiv:2410.07163) as a text baseline.

NPO without the reference model: the forget-answer reward is the length-normalised log-likelihood,
with a reward margin ``γ``. For a forget batch ``B_f`` and a retain batch ``B_r`` (notation of
:mod:`qrerase.baselines.text`; ``|y|`` the answer's token count, EOS included)::

    L_f = −(2/β) · mean_{i∈B_f} log σ(−(β/|y_i|) · log π_θ(y_i|x_i) − γ)          (paper, eq. 4)
    L   = w_f · L_f + w_r · ℓ_tok(B_r)                   (the reference TOFU objective, "simnpo_grad_diff")

Minimising ``L_f`` lowers every forget answer's per-token likelihood, with a weight
``σ(β ℓ̄_i − γ)``-like saturation (``ℓ̄_i = −log π(y_i|x_i) / |y_i|``) that vanishes once an answer
is forgotten. Defaults (:class:`SimNPOSettings`) are the TOFU forget10 values of the authors' code
(OPTML-Group/Unlearn-Simple, TOFU/README.md and TOFU/config/forget.yaml: ``beta=4.5``,
``npo_coeff=0.125``, ``grad_diff_coeff=1.0``, ``gamma=0.0``), also those of open-unlearning's
configs/trainer/SimNPO.yaml (``beta: 4.5``, ``gamma: 0.125`` = the forget weight, ``alpha: 1.0``,
``delta: 0.0`` = the margin).

The margin convention: the paper's ``γ`` (used here) is subtracted after the ``β`` scaling; the
reference code's ``gamma`` / ``delta`` is subtracted from ``ℓ̄`` before it (``β(ℓ̄ − δ)``), so
``γ = β · δ``. Both are 0 by default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..config import from_mapping
from .losses import token_mean_nll
from .objective import TextObjective, hparams_of

__all__ = ["SimNPOSettings", "simnpo_loss", "SimNPO"]


@dataclass
class SimNPOSettings:
    """SimNPO's own settings (source of the defaults: the module docstring).

    ``beta``: inverse temperature β (> 0; reference 4.5 on TOFU forget10, 2.5 on forget05).
    ``gamma``: reward margin γ of the paper's equation (>= 0; reference 0).
    ``forget_weight``: ``w_f``, the weight of the SimNPO term (> 0; the reference ``npo_coeff`` 0.125).
    ``retain_weight``: ``w_r``, the weight of the retain answer NLL (>= 0; reference 1.0; 0 drops the
    retain forward pass).
    """

    beta: float = 4.5
    gamma: float = 0.0
    forget_weight: float = 0.125
    retain_weight: float = 1.0

    def __post_init__(self):
        for key, positive in (("beta", True), ("gamma", False), ("forget_weight", True), ("retain_weight", False)):
            value = getattr(self, key)
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value < 0 or (positive and value == 0):
                expected = "a finite number > 0" if positive else "a finite number >= 0"
                raise ValueError(f"simnpo settings: '{key}' must be {expected}, got {value!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SimNPOSettings:
        """Strict construction: unknown keys are a ``ValueError`` naming them."""
        return from_mapping(cls, d, "simnpo settings")


def simnpo_loss(forget_nll: torch.Tensor, forget_n: torch.Tensor, beta: float, gamma: float = 0.0) -> torch.Tensor:
    """SimNPO's forget term ``L_f = −(2/β) · mean_i log σ(−(β/|y_i|) log π(y_i|x_i) − γ)``.

    ``forget_nll``: per-sequence answer NLL sums ``−log π(y_i|x_i)``, float, shape ``(B,)``;
    ``forget_n``: their answer token counts ``|y_i|`` (> 0), shape ``(B,)``. With ``log π = −nll``
    and ``−log σ(z) = softplus(−z)``: ``L_f = (2/β) · mean_i softplus(γ − β · nll_i / n_i)``
    (numerically stable; computed in float32). Returns a scalar tensor, differentiable in
    ``forget_nll``. At ``nll_i / n_i = γ / β`` for every i it equals ``2 log 2 / β``; it decreases
    monotonically in each ``nll_i``.
    """
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
    """simnpo: ``L = w_f · L_f(B_f) + w_r · ℓ_tok(B_r)`` (:func:`simnpo_loss`; settings
    :class:`SimNPOSettings` from ``cfg.hparams``, :func:`~qrerase.baselines.objective.hparams_of`).

    ``L_f`` is an example mean: a micro-batch piece contributes its own ``L_f`` times
    ``|piece| / |B_f|``; the retain NLL is a token mean: a piece contributes its NLL sum over the
    whole retain batch's answer token count. Logged terms: ``forget_nll`` (token-mean forget NLL),
    ``simnpo`` (``L_f``) and, with ``w_r > 0``, ``retain_nll``.
    """

    needs_retain = True

    def __init__(self, cfg, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        self.hp = hparams_of(cfg, SimNPOSettings)

    def _forget(self, idx):
        nll, n = self._nll(self.forget_ex, idx)
        lf = simnpo_loss(nll, n, self.hp.beta, self.hp.gamma)
        return lf, {"forget_nll": float(token_mean_nll(nll, n).detach()), "simnpo": float(lf.detach())}

    def _retain(self, ridx, denominator, terms):
        """``w_r · Σ_{B} nll / denominator`` (0 without a retain forward when ``w_r = 0``)."""
        if self.hp.retain_weight == 0:
            return 0.0
        r_nll, r_n = self._nll(self.retain_ex, ridx)
        terms["retain_nll"] = float(token_mean_nll(r_nll, r_n).detach())
        return self.hp.retain_weight * r_nll.sum() / denominator

    def full(self, payload):
        idx, ridx = payload
        lf, terms = self._forget(idx)
        r_n = sum(self.rcount[i] for i in ridx)
        return self.hp.forget_weight * lf + self._retain(ridx, max(1, r_n), terms), terms

    def _piece(self, f, f_live, r, r_live, whole):
        wf, wr = (1.0 if f_live else 0.0), (1.0 if r_live else 0.0)
        lf, terms = self._forget(f)
        loss = self.hp.forget_weight * lf * (wf * len(f) / whole["n"])
        return loss + wr * self._retain(r, whole["nr"], terms), terms


# --------------------------------------------------------------------------------------------------
# Registration and config (for the lead, once the registry takes each method's settings dataclass):
#
# in qrerase/registry.py, after the other text baselines:
#
#     register_method(
#         "simnpo",
#         label="SimNPO",
#         tracks=_TEXT,
#         run={"text": "qrerase.baselines.simnpo:SimNPO"},
#         hparams="qrerase.baselines.simnpo:SimNPOSettings",   # or the class, as the registry takes it
#         settings={"baselines": _ref("baseline_simnpo", "SimNPO (Fan et al. 2024)")},
#         plan_shape=(2, 0),   # forget + retain sequences, no frozen copy
#     )
#
# config.yaml, baselines section (tiny default: lr / epochs as the other baselines; method keys as
# the reference TOFU forget10 run):
#
#     simnpo: {epochs: 5, lr: 3.0e-4, batch_size: 16, beta: 4.5, gamma: 0.0, forget_weight: 0.125, retain_weight: 1.0}
# --------------------------------------------------------------------------------------------------
