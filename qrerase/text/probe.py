"""The memorisation probe: one fine-tune, scored on its own training answers after chosen epochs.

A rule that fixes the fine-tuning epochs from training data alone ("the fine-tuned model reproduces
its forget-set training answers": docs/real-model.md, the powered setting) needs the model's greedy
answers to its training questions after each candidate number of epochs, before any unlearning or
evaluation set is read. :func:`memorisation_probe` trains once for ``max(epochs)`` epochs with the
fine-tuning recipe (:func:`qrerase.text.training.train_causal_lm`: the same batches, seeds and
loss) and, after each epoch in ``epochs``, scores the greedy answers (:func:`greedy_generate`) to
the ``probe`` questions by ROUGE-L recall against their training answers (TOFU's scoring,
:func:`rouge_recalls`). :func:`pick_epochs` applies the threshold.

The learning-rate schedule (warm-up, then linear decay to 0) spans the probe's ``max(epochs)``
epochs, so the probe's model after ``e < max(epochs)`` epochs has seen a higher rate than an
``e``-epoch fine-tune ends on: the probe ranks epochs, and the fine-tune it picks reports its own
memorisation (the forget set's ROUGE-L in the TOFU table).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pandas as pd

from ..hparams import TrainConfig
from .evaluation import EvalConfig, greedy_generate, rouge_recalls
from .lm import PromptTemplate
from .training import train_causal_lm

__all__ = ["PROBE_COLUMNS", "memorisation_probe", "pick_epochs"]

_log = logging.getLogger(__name__)

#: the probe table's columns: epochs trained, probe questions, mean ROUGE-L / ROUGE-1 recall, the
#: share of answers reproduced whole (ROUGE-L recall 1), and the mean training loss of that epoch.
PROBE_COLUMNS = ["epoch", "questions", "rouge_l", "rouge1", "verbatim", "train_loss"]


def memorisation_probe(
    model,
    tokenizer,
    records: Sequence[Mapping[str, Any]],
    template: PromptTemplate,
    cfg: TrainConfig,
    probe: Sequence[Mapping[str, Any]],
    epochs: Sequence[int],
    eval_cfg: EvalConfig,
    desc: str = "probe",
) -> pd.DataFrame:
    """Fine-tune ``model`` on ``records`` for ``max(epochs)`` epochs (``cfg`` otherwise as given) and
    score it on ``probe`` (training QA: ``question`` / ``answer``) after each epoch in ``epochs``.

    Returns one row per probed epoch, in increasing order, with :data:`PROBE_COLUMNS`. ``epochs``:
    distinct positive integers; ``probe``: non-empty. One process only (greedy generation reads the
    whole model). The model is left trained for ``max(epochs)`` epochs, in eval mode.
    """
    wanted = sorted({int(e) for e in epochs})
    if not wanted or wanted[0] < 1 or len(wanted) != len(list(epochs)):
        raise ValueError(f"probe.epochs: expected distinct positive integers, got {list(epochs)!r}")
    if not probe:
        raise ValueError("probe: no training questions to score")
    questions = [str(r["question"]) for r in probe]
    answers = [str(r["answer"]) for r in probe]
    scores: list[dict] = []

    def score(epoch: int) -> None:
        if epoch not in wanted:
            return
        generations = greedy_generate(model, tokenizer, template, questions, eval_cfg)
        r1, rl = rouge_recalls(generations, answers, eval_cfg.rouge_tokenizer)
        scores.append(
            {
                "epoch": epoch,
                "questions": len(questions),
                "rouge_l": sum(rl) / len(rl),
                "rouge1": sum(r1) / len(r1),
                "verbatim": sum(1 for v in rl if v >= 1.0) / len(rl),
            }
        )
        _log.info(
            "%s: after epoch %d, ROUGE-L recall %.4f on %d training answers",
            desc,
            epoch,
            scores[-1]["rouge_l"],
            len(rl),
        )

    curve = train_causal_lm(
        model, tokenizer, records, template, replace(cfg, epochs=wanted[-1]), desc=desc, on_epoch_end=score
    )
    loss = curve.groupby("epoch")["loss"].mean()
    frame = pd.DataFrame(scores)
    frame["train_loss"] = [float(loss[e]) for e in frame["epoch"]]
    return frame[PROBE_COLUMNS]


def pick_epochs(table: pd.DataFrame, min_rouge_l: float) -> int | None:
    """The smallest probed epoch whose mean ROUGE-L recall is ``>= min_rouge_l``; ``None`` if none is."""
    if not 0.0 < float(min_rouge_l) <= 1.0:
        raise ValueError(f"probe.min_rouge_l: expected a value in (0, 1], got {min_rouge_l!r}")
    met = table.loc[table["rouge_l"] >= float(min_rouge_l), "epoch"]
    return int(met.min()) if len(met) else None
