"""Membership-inference attacks (MIA): per-sequence scores and their forget-vs-holdout ROC AUC.

**Sign convention.** Every score here is oriented so that HIGHER = more likely a member (a sequence
the model was trained on). :func:`auc` is the ROC AUC of forget-set sequences (members, label 1)
against holdout sequences (non-members, label 0): 1 = every forget sequence scores above every
holdout one (the model still "remembers" the forget set), 0.5 = indistinguishable (the ideal after
unlearning, as for a model never trained on the forget set), below 0.5 = the forget set now looks
*less* familiar than unseen data (over-unlearning). open-unlearning (``src/evals/metrics/mia``)
orients its scores the other way (loss-like, higher = non-member) and labels forget 0 / holdout 1; the
two conventions give the same AUC.

**Inputs.** One sequence's scored (answer) tokens, as :func:`qrerase.text.lm.answer_token_logits`
returns them row by row: ``logits`` of shape ``(T, V)`` (any float dtype; computed in float32) — the
next-token logits at the ``T`` answer positions — and ``targets`` of shape ``(T,)`` (integer token
ids, ``T >= 1``). The registered per-sequence functions (:data:`qrerase.metrics.registry.MIA_ATTACKS`)
share the signature ``f(logits, targets, text) -> float``; ``text`` is the scored text (the answer),
used only by ZLib.

GradNorm (Maini et al. 2024, open-unlearning ``gradnorm.py``) needs one backward pass per sequence
through the whole model; it is :func:`gradnorm_score` here, not a registered per-sequence metric.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import torch

__all__ = [
    "MIN_K_DEFAULT",
    "token_log_probs",
    "lowest_k_mean",
    "loss_score",
    "zlib_score",
    "min_k_score",
    "min_k_plus_plus_score",
    "gradnorm_score",
    "auc",
]

#: Min-K% / Min-K%++ fraction of lowest tokens (open-unlearning's TOFU configs: ``k: 0.4``).
MIN_K_DEFAULT = 0.4


def _check(logits: torch.Tensor, targets: torch.Tensor, where: str) -> None:
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or not logits.is_floating_point():
        raise ValueError(f"{where}: logits must be a float tensor of shape (T, V), got {_desc(logits)}")
    if not isinstance(targets, torch.Tensor) or targets.ndim != 1 or targets.is_floating_point():
        raise ValueError(f"{where}: targets must be an integer tensor of shape (T,), got {_desc(targets)}")
    if targets.shape[0] != logits.shape[0] or targets.shape[0] == 0:
        raise ValueError(
            f"{where}: need T >= 1 with logits (T, V) and targets (T,), got {_desc(logits)}, {_desc(targets)}"
        )
    bad = (targets < 0) | (targets >= logits.shape[1])
    if bool(bad.any()):
        raise ValueError(
            f"{where}: targets must be token ids in [0, {logits.shape[1]}), got {targets[bad][:5].tolist()}"
        )


def _desc(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log p(x_t | x_<t)`` of each target token: ``log_softmax(logits)[t, targets[t]]``.

    logits ``(T, V)`` float, targets ``(T,)`` int -> float32 ``(T,)`` (each <= 0). ``ValueError``
    (one line) on shapes, dtypes or out-of-range ids.
    """
    _check(logits, targets, "token_log_probs")
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(1, targets.long().unsqueeze(1)).squeeze(1)


def _n_lowest(n: int, k: float, where: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not 0.0 < k <= 1.0:
        raise ValueError(f"{where}: k must be a fraction in (0, 1], got {k!r}")
    return max(1, int(n * k))


def lowest_k_mean(values: torch.Tensor, k: float = MIN_K_DEFAULT) -> float:
    """Mean of the ``max(1, floor(k * T))`` smallest entries of a 1-D tensor of ``T >= 1`` values
    (the token count of Min-K%: Shi et al. 2024, open-unlearning ``min_k.py``)."""
    if not isinstance(values, torch.Tensor) or values.ndim != 1 or values.shape[0] == 0:
        raise ValueError(f"lowest_k_mean: values must be a non-empty 1-D tensor, got {_desc(values)}")
    n = _n_lowest(values.shape[0], k, "lowest_k_mean")
    return float(torch.sort(values.double()).values[:n].mean())


def loss_score(logits: torch.Tensor, targets: torch.Tensor, text: str | None = None) -> float:
    """LOSS attack (Yeom et al. 2018, "Privacy risk in machine learning"): minus the mean token NLL.

    ``score = (1/T) Σ_t log p(x_t | x_<t) = −mean NLL``: a member has a lower loss, so a higher score.
    ``text`` is unused (the common signature of the registered scores).
    """
    return float(token_log_probs(logits, targets).double().mean())


def zlib_score(logits: torch.Tensor, targets: torch.Tensor, text: str) -> float:
    """ZLib attack (Carlini et al. 2021, "Extracting training data from large language models"):
    the mean token NLL divided by the zlib entropy of the text, negated.

    ``score = −mean_t NLL_t / len(zlib.compress(text.encode("utf-8")))`` (bytes, default level),
    as open-unlearning's ``zlib.py`` and MUSE's ``PPL/zlib`` (whose "PPL" is the mean NLL). The zlib
    length normalises away how predictable the text is in general. ``text``: the scored text (the
    answer), non-empty.
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"zlib_score: text must be a non-empty string, got {text!r}")
    nll = -loss_score(logits, targets)
    return -nll / len(zlib.compress(text.encode("utf-8")))


def min_k_score(
    logits: torch.Tensor, targets: torch.Tensor, text: str | None = None, k: float = MIN_K_DEFAULT
) -> float:
    """Min-K% Prob (Shi et al. 2024, "Detecting pretraining data from large language models"):
    the mean of the lowest ``k`` fraction of token log-probabilities.

    ``score = mean of the max(1, floor(k T)) smallest log p(x_t | x_<t)``; an unseen text tends to
    have a few very unlikely tokens, a member fewer. (open-unlearning ``min_k.py`` returns minus this.)
    """
    return lowest_k_mean(token_log_probs(logits, targets), k)


def min_k_plus_plus_score(
    logits: torch.Tensor, targets: torch.Tensor, text: str | None = None, k: float = MIN_K_DEFAULT
) -> float:
    """Min-K%++ (Zhang et al. 2024, "Min-K%++: improved baseline for detecting pre-training data").

    Each target token's log-probability is standardised by the mean and standard deviation of the
    log-probability under the model's own predictive distribution at that position:

    ``μ_t = Σ_v p_t(v) log p_t(v)``, ``σ_t² = Σ_v p_t(v) (log p_t(v))² − μ_t²``,
    ``z_t = (log p_t(x_t) − μ_t) / σ_t``, ``score = mean of the max(1, floor(k T)) smallest z_t``.

    ``σ_t²`` is clamped at ``1e-6`` (open-unlearning ``min_k_plus_plus.py``; a near-one-hot
    distribution). A training token is a mode of its position's distribution, so ``z_t`` is high.
    """
    logp = token_log_probs(logits, targets)  # validates the shapes
    logp_all = torch.log_softmax(logits.float(), dim=-1)
    p = logp_all.exp()
    mu = (p * logp_all).sum(-1)
    var = ((p * logp_all.square()).sum(-1) - mu.square()).clamp(min=1e-6)
    return lowest_k_mean((logp - mu) / var.sqrt(), k)


def gradnorm_score(model, batch, p: float = 2.0) -> float:
    """GradNorm (Maini et al. 2024, "LLM dataset inference", open-unlearning ``gradnorm.py``) of ONE
    sequence: minus the mean over parameter tensors of ``‖∇_θ L‖_p``, ``L`` its mean answer-token NLL.

    ``batch``: one right-padded sequence (:func:`qrerase.text.lm.collate` of one example). A member
    sits near a minimum of the loss, so its gradient is small and its score (``−norm``) high.
    Costs one forward and one backward pass through the model; the parameters' ``.grad`` is
    cleared before and after (do not call it between a training step's backward and its optimiser
    step). ``p`` in ``{1, 2, inf}``.
    """
    from ..text.lm import sequence_nll

    if p not in (1, 2, math.inf):
        raise ValueError(f"gradnorm_score: p must be 1, 2 or inf, got {p!r}")
    if batch["input_ids"].shape[0] != 1:
        raise ValueError(f"gradnorm_score: expected one sequence, got a batch of {batch['input_ids'].shape[0]}")
    params = [q for q in model.parameters() if q.requires_grad]
    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        sums, counts = sequence_nll(model, batch)
        (sums[0] / counts[0]).backward()
    norms = [torch.linalg.vector_norm(q.grad.detach().double(), ord=p) for q in params if q.grad is not None]
    model.zero_grad(set_to_none=True)
    if not norms:
        raise ValueError("gradnorm_score: no parameter received a gradient")
    return -float(torch.stack(norms).mean())


def auc(members: Sequence[float], nonmembers: Sequence[float]) -> float:
    """ROC AUC of member scores (label 1) against non-member scores (label 0), computed exactly.

    ``AUC = (1 / (n₁ n₀)) Σ_i Σ_j ([s_i > t_j] + ½ [s_i = t_j])`` over members ``s`` and
    non-members ``t``: the Mann-Whitney U statistic of the members divided by ``n₁ n₀``, ties counting
    one half (equal to ``sklearn.metrics.roc_auc_score`` with labels 1 / 0). Computed from average
    ranks, ``(R₁ − n₁(n₁+1)/2) / (n₁ n₀)``, in O(n log n). Both lists non-empty and finite.
    """
    s = [float(x) for x in members]
    t = [float(x) for x in nonmembers]
    if not s or not t:
        raise ValueError(f"auc: needs members and non-members, got {len(s)} and {len(t)} scores")
    if not all(math.isfinite(x) for x in s + t):
        raise ValueError("auc: scores must be finite (a NaN or inf score)")
    pooled = sorted([(x, 1) for x in s] + [(x, 0) for x in t])
    rank_sum, i = 0.0, 0
    while i < len(pooled):  # tie groups get the average of their 1-based ranks
        j = i
        while j < len(pooled) and pooled[j][0] == pooled[i][0]:
            j += 1
        avg = (i + 1 + j) / 2
        rank_sum += avg * sum(lab for _, lab in pooled[i:j])
        i = j
    n1, n0 = len(s), len(t)
    return (rank_sum - n1 * (n1 + 1) / 2) / (n1 * n0)
