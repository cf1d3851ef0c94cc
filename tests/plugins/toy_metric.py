"""A plug-in for tests and docs/extending.md ("Adding a metric"): registers one toy TOFU metric.

``toy_confidence``: the mean probability the model gives each forget-set answer token under teacher
forcing, best when closest to 0.5 (direction ``target``: a toy ideal, neither memorised nor unknown).
A metric is its function plus its registration: the function below (the per-sequence signature
``f(logits, targets, text)`` of :mod:`qrerase.metrics.scoring`) and the :func:`register_metric` call.
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


register_metric(
    "toy_confidence",
    label="Toy Confidence",
    direction="target",
    target=0.5,
    tracks=("tofu",),
    needs=("forget",),
    aggregate="mean",
    fn=mean_target_probability,
    fmt="{:.3f}",
    headline=2,
    description="mean teacher-forced probability of the forget-set answer tokens (a toy: 0.5 is its ideal)",
)
