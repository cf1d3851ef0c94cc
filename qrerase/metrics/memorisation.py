"""Teacher-forced memorisation metrics of one answer: exact memorisation and extraction strength.

Inputs as in :mod:`qrerase.metrics.mia`: ``logits`` ``(T, V)`` float, the next-token logits at the
``T >= 1`` answer positions under teacher forcing (:func:`qrerase.text.lm.answer_token_logits`, row
by row), and ``targets`` ``(T,)`` integer, the answer's token ids. ``pred_t = argmax_v logits[t, v]``
is the model's greedy guess of token ``t`` given the true prefix ``x_<t`` (ties: the lowest id, as
``torch.argmax``). Both share the registered per-sequence signature ``f(logits, targets, text)``
(``text`` unused).
"""

from __future__ import annotations

import torch

from .mia import token_log_probs

__all__ = ["argmax_matches", "exact_memorisation", "extraction_strength"]


def argmax_matches(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Boolean ``(T,)``: ``argmax_v logits[t, v] == targets[t]`` (teacher forced). ``ValueError`` on
    bad shapes, dtypes or ids."""
    token_log_probs(logits, targets)  # validates
    return logits.argmax(dim=-1) == targets.to(logits.device)


def exact_memorisation(logits: torch.Tensor, targets: torch.Tensor, text: str | None = None) -> float:
    """Exact memorisation (Tirumala et al. 2022; open-unlearning ``exact_memorization``):
    ``EM = (1/T) Σ_t [pred_t = x_t]``, the fraction of answer tokens the teacher-forced argmax reproduces."""
    return float(argmax_matches(logits, targets).double().mean())


def extraction_strength(logits: torch.Tensor, targets: torch.Tensor, text: str | None = None) -> float:
    """Extraction strength (Carlini et al. 2021; Wang et al. 2025, open-unlearning ``extraction_strength``):

    ``ES = 1 − k*/T``, ``k* = min{k ∈ {0, …, T} : pred_t = x_t for every t ≥ k}``: the shortest
    prefix of the answer from which the model's teacher-forced argmax reproduces all the rest. ``ES =
    1``: the whole answer is reproduced; ``ES = 0``: not even the last token (``k* = T``, the empty
    suffix). open-unlearning's loop stops at ``k = T − 1``, so it gives ``1/T`` instead of 0 for an
    answer whose last token is wrong; here that case is 0, as the definition says.
    """
    match = argmax_matches(logits, targets)
    n = int(match.shape[0])
    wrong = (~match).nonzero()
    k_star = 0 if wrong.numel() == 0 else int(wrong.max()) + 1
    return 1.0 - k_star / n
