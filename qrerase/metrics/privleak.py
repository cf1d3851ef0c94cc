"""MUSE's PrivLeak: how far a model's membership-inference AUC is from the retain reference's.

MUSE (Shi et al. 2024, "MUSE: machine unlearning six-way evaluation for language models", §3) defines

``PrivLeak = (AUC(f_unlearn; D_forget, D_holdout) − AUC(f_retrain; D_forget, D_holdout)) / AUC(f_retrain; …) × 100``

with MUSE's AUC oriented the other way from :func:`qrerase.metrics.mia.auc`: MUSE's code
(``privleak/scripts/get_ppl.py``: ``roc_curve(y, -ppl)`` with the forget set labelled 0 and the
holdout set 1) gives ``AUC_MUSE = 1 − AUC`` of the member-oriented AUC used here (forget = 1).
open-unlearning's ``privleak`` (``src/evals/metrics/privacy.py``) applies the same ``1 − x``. So,
with ``a`` this model's member AUC and ``r`` the retain reference's (both from the same attack,
Min-K% in MUSE and open-unlearning):

``PrivLeak = ((1 − a) − (1 − r)) / (1 − r) × 100 = (r − a) / (1 − r) × 100``.

0 is ideal (the model leaks as much as a model never trained on the forget set). Negative =
under-unlearning (the forget set still looks like training data; the fine-tuned model is near −100 in
MUSE's tables); positive = over-unlearning (the forget set looks *less* familiar than unseen data).
"""

from __future__ import annotations

import math

__all__ = ["privleak"]


def privleak(auc_model: float, auc_retain: float) -> float:
    """MUSE PrivLeak (percent) of a model's member-oriented MIA AUC against the retain reference's.

    ``(auc_retain − auc_model) / (1 − auc_retain) × 100`` (module docstring: MUSE's AUC is
    ``1 −`` ours). Both AUCs in [0, 1]; ``auc_retain`` < 1 (a retain model that separates the forget
    set perfectly leaves no scale). ``ValueError`` (one line) otherwise.
    """
    for name, x in (("auc_model", auc_model), ("auc_retain", auc_retain)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and 0.0 <= x <= 1.0):
            raise ValueError(f"privleak: {name} must be an AUC in [0, 1], got {x!r}")
    if auc_retain >= 1.0:
        raise ValueError("privleak: auc_retain is 1 (MUSE's reference AUC 1 − auc_retain is 0)")
    return (float(auc_retain) - float(auc_model)) / (1.0 - float(auc_retain)) * 100.0
