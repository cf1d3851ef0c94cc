"""Task-level evaluation: per skill, exact match of the normalised greedy answer
(:func:`normalise_answer`: numbers as integers, letters upper-case) or, for ``cloze`` knowledge
items, of the option chosen by likelihood (:func:`choose_options`), and the mean answer-token NLL;
:func:`task_level_frame` shapes the table. The data it scores: :mod:`qrerase.tracks.task_level.data`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .data import ROLES

__all__ = [
    "normalise_answer",
    "exact_match",
    "evaluate_skill",
    "evaluate_roles",
    "option_losses",
    "choose_options",
    "task_level_frame",
]

_NUMBER = re.compile(r"^[+-]?\d+(?:\.0+)?$")


def normalise_answer(text: str) -> str:
    """Canonical form of a short answer: the first line, stripped of spaces and of trailing ``.``;
    numbers as integers (``"085"``, ``"85.0"``, ``"+85"``, ``"8,5"`` → ``"85"``); a letter choice
    (``"b"``, ``"B."``, ``"(B)"``, ``"B) Paris"``, not ``"A Tale of Two Cities"``) as its upper-case
    letter; anything else case-folded."""
    t = str(text).strip().split("\n", 1)[0].strip().rstrip(".").strip()
    compact = t.replace(",", "").replace(" ", "")
    if _NUMBER.match(compact):
        return str(int(float(compact)))
    m = re.match(r"^\(?([A-Da-d])(?=$|[.):])", t)
    if m:
        return m.group(1).upper()
    return t.casefold()


def exact_match(prediction: str, answer: str) -> bool:
    return normalise_answer(prediction) == normalise_answer(answer)


def evaluate_skill(model, tokenizer, template, records: Sequence[Mapping[str, Any]], eval_cfg) -> dict[str, Any]:
    """Accuracy (exact match of the greedy answer, normalised) and answer-token NLL of one skill.

    Returns ``n``, ``accuracy`` (mean of :func:`exact_match`), ``nll`` (token-mean answer NLL:
    Σ NLL / Σ tokens, EOS included) and ``generations`` (the answers, in record order).
    ``eval_cfg`` is a :class:`qrerase.text.evaluation.EvalConfig`. Records with ``options`` (the
    ``cloze`` knowledge format) are answered by choice instead of generation: the answer is
    ``argmin_o NLL(o | question) / |o|`` over the options (token-mean NLL, EOS included; the first
    option on a tie).
    """
    from ...text.evaluation import answer_losses, greedy_generate
    from ...text.lm import qa_pair

    if not records:
        raise ValueError("evaluate_skill: no records")
    pairs = [qa_pair(r) for r in records]
    if all("options" in r for r in records):  # one pass scores every option, the correct one included
        per_option = option_losses(model, tokenizer, template, records, eval_cfg)
        gens = _picked(records, per_option)
        losses = [ls[r["options"].index(a)] for r, ls, (_, a) in zip(records, per_option, pairs)]
    else:
        losses = answer_losses(model, tokenizer, template, pairs, eval_cfg)
        gens = greedy_generate(model, tokenizer, template, [q for q, _ in pairs], eval_cfg)
    hits = [exact_match(g, a) for g, (_, a) in zip(gens, pairs)]
    return {
        "n": len(records),
        "accuracy": float(np.mean(hits)),
        "nll": float(sum(s for s, _ in losses) / max(1, sum(c for _, c in losses))),
        "generations": gens,
    }


def option_losses(
    model, tokenizer, template, records: Sequence[Mapping[str, Any]], eval_cfg
) -> list[list[tuple[float, int]]]:
    """Per record, ``(sum_nll, n_tokens)`` of each of ``record["options"]`` as the answer to
    ``record["question"]`` (:func:`qrerase.text.evaluation.answer_losses`, all options in one call)."""
    from ...text.evaluation import answer_losses

    pairs = [(r["question"], o) for r in records for o in r["options"]]
    flat = answer_losses(model, tokenizer, template, pairs, eval_cfg)
    out, at = [], 0
    for r in records:
        out.append(flat[at : at + len(r["options"])])
        at += len(r["options"])
    return out


def _picked(records: Sequence[Mapping[str, Any]], per_option: Sequence[Sequence[tuple[float, int]]]) -> list[str]:
    """Per record, the option of lowest token-mean NLL in ``per_option`` (the first on a tie)."""
    return [r["options"][int(np.argmin([s / max(1, c) for s, c in ls]))] for r, ls in zip(records, per_option)]


def choose_options(model, tokenizer, template, records: Sequence[Mapping[str, Any]], eval_cfg) -> list[str]:
    """Per record, the option (of ``record["options"]``) with the lowest token-mean answer NLL given
    ``record["question"]``: multiple choice scored by likelihood (first option on a tie)."""
    return _picked(records, option_losses(model, tokenizer, template, records, eval_cfg))


def evaluate_roles(
    model,
    tokenizer,
    template,
    role_records: Mapping[str, Sequence[Mapping[str, Any]]],
    skills: Mapping[str, str],
    eval_cfg,
    model_name: str,
) -> list[dict[str, Any]]:
    """:func:`evaluate_skill` on each role's held-out records: one row per role, ``model, role, skill,
    n, accuracy, nll, generations`` (the table's long rows; ``generations`` for logging only)."""
    rows = []
    for role, records in role_records.items():
        res = evaluate_skill(model, tokenizer, template, records, eval_cfg)
        rows.append(
            {
                "model": model_name,
                "role": role,
                "skill": skills[role],
                "n": res["n"],
                "accuracy": res["accuracy"],
                "nll": res["nll"],
                "generations": res["generations"],
            }
        )
    return rows


def task_level_frame(rows: Sequence[Mapping[str, Any]], models: Sequence[str]) -> Any:
    """Wide frame for the task table: one row per model (in ``models`` order), columns
    ``<role>_accuracy`` and ``<role>_nll`` from tidy rows (``model, role, accuracy, nll``)."""
    import pandas as pd

    tidy = pd.DataFrame(list(rows))
    missing = [m for m in models if m not in set(tidy["model"])]
    if missing:
        raise ValueError(f"task table: no evaluation for model(s) {missing}")
    out = pd.DataFrame({"method": list(models)})
    for role in ROLES:
        part = tidy[tidy["role"] == role].set_index("model")
        for metric in ("accuracy", "nll"):
            out[f"{role}_{metric}"] = out["method"].map(part[metric]).astype("float64")
    return out
