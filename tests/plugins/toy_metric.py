"""A plug-in for tests and docs/extending.md ("Adding a metric"): registers one toy metric on the TOFU
and speech tracks.

``toy_confidence``: the mean probability the model gives each forget-set answer token under teacher
forcing, best when closest to 0.5 (direction ``target``: a toy ideal, neither memorised nor unknown).
A metric is its function plus its registration: the function below (the per-sequence signature
``f(logits, targets, text)`` of :mod:`qrerase.metrics.scoring`) and the :func:`register_metric` call.
On the speech track (a classifier, not a language model) its function is
:func:`mean_label_probability` (``track_fns``: ``f(logits, labels)``, one value per clip).
Importing this module is standard library only (the workflow imports it at planning time and every job
imports it, config key ``plugins``); torch is imported when a job calls the function.
"""

from qrerase.metrics.registry import register_metric


def mean_target_probability(logits, targets, text=None) -> float:
    """p̄ = (1/T) Σ_t softmax(logits[t])[targets[t]] over the ``T`` answer tokens.

    ``logits`` ``(T, V)`` float, ``targets`` ``(T,)`` int (validated by
    :func:`qrerase.metrics.mia.token_log_probs`: one-line ``ValueError``); ``text`` unused. In [0, 1].
    """
    from qrerase.metrics.mia import token_log_probs

    return float(token_log_probs(logits, targets).double().exp().mean())


def mean_label_probability(logits, labels):
    """Per clip: softmax(logits_i)[labels_i], float64 ``(N,)`` (the speech classifier's confidence in
    the speaker label); ``logits`` ``(N, C)``, ``labels`` ``(N,)`` ints in ``[0, C)``."""
    import numpy as np

    from qrerase.tracks.speech.privacy import clip_losses

    return np.exp(-clip_losses(logits, labels))


register_metric(
    "toy_confidence",
    label="Toy Confidence",
    direction="target",
    target=0.5,
    tracks=("tofu", "speech"),
    needs=("forget",),
    aggregate="mean",
    fn=mean_target_probability,
    track_fns={"speech": mean_label_probability},
    fmt="{:.3f}",
    headline=2,
    description="mean teacher-forced probability of the forget-set answer tokens (a toy: 0.5 is its ideal)",
)
