"""Per-sequence metric statistics of a text model on question / answer records, and their aggregates.

:func:`sequence_statistics` runs one teacher-forced forward pass per batch (the same encoding,
length-sorted batching and answer-token selection as the TOFU answer losses,
:func:`qrerase.text.evaluation.answer_losses`) and calls, for every answer, each requested metric's
per-sequence function (:mod:`qrerase.metrics.registry`: ``f(logits, targets, text)``, with the answer
tokens' logits ``(T, V)``, their ids ``(T,)`` and the answer text). :func:`aggregate` turns the
statistics of the forget and holdout sets into one value per metric (an ``auc`` metric: the
forget-vs-holdout AUC of :func:`qrerase.metrics.mia.auc`; a ``mean`` metric: the forget-set mean).
:func:`track_sequence_metrics` does both for every such metric registered for a track (rule evaluate's
``sequence_metrics.json``), so a metric a plug-in registers is computed by the track's evaluation jobs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..text.evaluation import EvalConfig
from ..text.lm import PromptTemplate, answer_token_logits, bucketed_batches, collate, encode_qa_many, pad_token_id
from .mia import auc
from .registry import MetricError, metric, metric_function, metrics_for

__all__ = ["sequence_statistics", "aggregate", "track_sequence_metrics", "SEQUENCE_AGGREGATES"]

#: The aggregates whose metrics have a per-sequence function.
SEQUENCE_AGGREGATES = ("auc", "mean")


def _sequence_metric(name: str):
    m = metric(name)
    if m.aggregate not in SEQUENCE_AGGREGATES:
        raise MetricError(f"metric {name!r} has no per-sequence function (aggregate {m.aggregate!r})")
    return metric_function(name)


def sequence_statistics(
    model,
    tokenizer,
    template: PromptTemplate,
    records: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    cfg: EvalConfig,
) -> dict[str, list[float]]:
    """Metric name -> one float per record (input order): each metric's per-sequence function on the
    record's answer tokens (EOS included), under teacher forcing.

    ``records``: mappings with ``question`` and ``answer``; ``names``: registered metrics of aggregate
    ``auc`` or ``mean``. Batches of ``cfg.batch_size`` in increasing length under
    ``torch.inference_mode``, the model in eval mode (restored after); ``cfg.max_length`` caps each
    sequence as in the answer losses. A record without a non-empty ``question`` / ``answer`` is a
    ``ValueError`` naming its index.
    """
    fns = {n: _sequence_metric(n) for n in names}
    pairs, answers = [], []
    for i, r in enumerate(records):
        q, a = r.get("question"), r.get("answer")
        if not (isinstance(q, str) and q and isinstance(a, str) and a):
            raise ValueError(f"sequence_statistics: record {i} lacks a non-empty 'question' / 'answer'")
        pairs.append((q, a))
        answers.append(a)
    examples = encode_qa_many(tokenizer, template, pairs, cfg.max_length)
    out = {n: [float("nan")] * len(examples) for n in names}
    pad_id = pad_token_id(tokenizer)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for idx in bucketed_batches([len(e[0]) for e in examples], cfg.batch_size, seed=0, shuffle=False):
                logits, targets, mask = answer_token_logits(model, collate([examples[i] for i in idx], pad_id))
                counts = mask.sum(dim=1).tolist()
                start = 0
                for j, i in enumerate(idx):
                    rows = slice(start, start + counts[j])
                    start += counts[j]
                    for n, fn in fns.items():
                        out[n][i] = float(fn(logits[rows], targets[rows], answers[i]))
    finally:
        model.train(was_training)
    return out


def aggregate(
    forget: Mapping[str, Sequence[float]], holdout: Mapping[str, Sequence[float]] | None, names: Sequence[str]
) -> dict[str, float]:
    """Metric name -> its value for one model from per-sequence statistics (:func:`sequence_statistics`).

    ``auc``: :func:`qrerase.metrics.mia.auc` of ``forget[name]`` (members) vs ``holdout[name]``
    (non-members); ``mean``: the mean of ``forget[name]``. A metric missing from the statistics it
    needs is a :class:`~qrerase.metrics.registry.MetricError` naming it.
    """
    values: dict[str, float] = {}
    for n in names:
        m = metric(n)
        if m.aggregate not in SEQUENCE_AGGREGATES:
            raise MetricError(f"metric {n!r}: aggregate {m.aggregate!r} is not computed from sequence statistics")
        if n not in forget or (m.aggregate == "auc" and (holdout is None or n not in holdout)):
            raise MetricError(f"metric {n!r}: no per-sequence statistics for the sets it needs {list(m.needs)}")
        if m.aggregate == "auc":
            assert holdout is not None  # checked above
            values[n] = auc(forget[n], holdout[n])
        else:
            xs = [float(x) for x in forget[n]]
            if not xs:
                raise MetricError(f"metric {n!r}: no forget-set statistics")
            values[n] = sum(xs) / len(xs)
    return values


def track_sequence_metrics(
    model,
    tokenizer,
    template: PromptTemplate,
    forget: Sequence[Mapping[str, Any]],
    holdout: Sequence[Mapping[str, Any]],
    cfg: EvalConfig,
    track: str,
) -> dict[str, Any]:
    """Every registered metric of ``track`` with a per-sequence statistic (aggregates
    :data:`SEQUENCE_AGGREGATES`, in that order, registry order within each; a plug-in's too), of one model.

    ``forget`` / ``holdout``: the question / answer records of the forget set (members) and the holdout
    set (non-members). Returns ``{"metrics": name -> value (:func:`aggregate`), "forget": name -> one
    float per forget record, "holdout": the same per holdout record}`` (:func:`sequence_statistics`),
    the content of rule evaluate's ``sequence_metrics.json``.
    """
    names = [n for a in SEQUENCE_AGGREGATES for n in metrics_for(track, a)]
    stats = {
        s: sequence_statistics(model, tokenizer, template, recs, names, cfg)
        for s, recs in (("forget", forget), ("holdout", holdout))
    }
    return {"metrics": aggregate(stats["forget"], stats["holdout"], names), **stats}
