"""Question-answer data shared by the text tracks: record layouts, the fields an evaluation set needs,
duplicate and leakage checks.

A record is a question and its answer (TOFU's layout, or prompt/response mapped onto it:
:func:`normalise`); an evaluation record adds a paraphrased answer and perturbed answers
(:data:`EVAL_FIELDS`, what the Truth Ratio needs). The TOFU track's splits are
:mod:`qrerase.tracks.tofu.data`; the cross-lingual track's translations :mod:`qrerase.tracks.crosslingual.data`.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Mapping, Sequence

from .eval_log import UTILITY_SETS

__all__ = [
    "KNOWLEDGE_SETS",
    "normalise",
    "EVAL_FIELDS",
    "check_fields",
    "check_eval_set",
    "check_not_trained",
    "question_key",
    "check_distinct",
    "log_repeats",
]

_log = logging.getLogger(__name__)


#: the world-knowledge evaluation sets (TOFU's real authors and world facts): the Model Utility sets
#: other than retain, from the one list of TOFU's sets (:data:`qrerase.text.eval_log.SET_LABELS`).
KNOWLEDGE_SETS: tuple[str, ...] = tuple(s for s in UTILITY_SETS if s != "retain")


def normalise(record: dict, where: str) -> dict:
    """Map TOFU's two record layouts (question/answer and prompt/response) onto question/answer."""
    rec = dict(record)
    if "question" not in rec and "prompt" in rec:
        rec["question"] = rec.pop("prompt")
    if "answer" not in rec and "response" in rec:
        rec["answer"] = rec.pop("response")
    for key in ("question", "answer"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            raise ValueError(f"{where}: record lacks a non-empty '{key}' field")
    if "perturbed_answer" in rec and isinstance(rec["perturbed_answer"], str):
        rec["perturbed_answer"] = [rec["perturbed_answer"]]
    return rec


#: The fields a TOFU-format evaluation record must have, by its set: the forget and retain sets carry
#: a paraphrased answer (the Truth Ratio's numerator) and a non-empty list of perturbed answers (its
#: denominator). TOFU's real-authors and world-facts sets have no paraphrase in their format: there the
#: evaluation scores the answer itself in its place (:func:`qrerase.text.evaluation.evaluate_set`).
EVAL_FIELDS: dict[str, tuple[str, ...]] = {
    "forget": ("paraphrased_answer", "perturbed_answer"),
    "retain": ("paraphrased_answer", "perturbed_answer"),
    "real_authors": ("perturbed_answer",),
    "world_facts": ("perturbed_answer",),
}


def check_fields(record: Mapping, fields: Sequence[str], where: str) -> None:
    """A ValueError naming ``where`` (``file:line``) and the field when ``record`` lacks one of
    ``fields``: a string field must be a non-empty string, ``perturbed_answer`` a non-empty list of
    non-empty strings."""
    for key in fields:
        value = record.get(key) if isinstance(record, Mapping) else None
        if key == "perturbed_answer":
            ok = isinstance(value, list) and len(value) > 0 and all(isinstance(v, str) and v.strip() for v in value)
            what = "a non-empty list of strings"
        else:
            ok = isinstance(value, str) and bool(value.strip())
            what = "a non-empty string"
        if not ok:
            raise ValueError(f"{where}: field '{key}' missing or not {what}")


def check_eval_set(name: str, rows: Sequence[Mapping], where: Sequence[str]) -> None:
    """Every record of evaluation set ``name`` has the fields :data:`EVAL_FIELDS` says it needs."""
    for row, here in zip(rows, where):
        check_fields(row, EVAL_FIELDS[name], here)


def check_not_trained(
    name: str,
    rows: Sequence[Mapping],
    where: Sequence[str],
    training: Mapping[str, tuple[Sequence[Mapping], Sequence[str]]],
) -> None:
    """Refuse an evaluation or attack set (``name``: the holdout's non-members, say) that holds a row of
    a training split. ``training`` maps a split's name to its records and their ``file:line``; rows
    are compared by normalised question and answer (:func:`question_key`). A ValueError names the
    ``file:line`` of both rows: a non-member that was trained on makes every membership AUC built on it wrong."""
    trained: dict[tuple[str, str], tuple[str, str]] = {}
    for split, (train_rows, train_where) in training.items():
        for row, here in zip(train_rows, train_where):
            trained.setdefault((question_key(row["question"]), question_key(row["answer"])), (split, here))
    for row, here in zip(rows, where):
        seen = trained.get((question_key(row["question"]), question_key(row["answer"])))
        if seen is not None:
            raise ValueError(
                f"{here}: {name} row is a copy of the {seen[0]} split's {seen[1]} (a training row; the {name} "
                "set must hold none)"
            )


def question_key(text: str) -> str:
    """A question's text for duplicate checks: Unicode NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def check_distinct(
    splits: Mapping[str, tuple[Sequence[Mapping], Sequence[str]]], strict: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """Refuse duplicate questions within a split and shared questions between splits.

    ``splits`` maps a split's name to its records and their ``file:line`` (:func:`load_split_numbered`);
    questions are compared by :func:`question_key`. A ValueError naming ``file:line`` of both rows when

    - two splits ask the same question (a forget question copied into the retain split would be
      trained on under the retain label);
    - a split asks a question twice with the same answer (a copied row);
    - a ``strict`` split (the forget set) asks a question twice at all.

    TOFU itself asks a few generic questions ("What is the full name of the author?") of two authors
    with different answers; outside ``strict`` splits such repeats are distinct facts, kept, and
    returned as ``(file:line, file:line)`` pairs (the caller logs them).
    """
    owner: dict[str, tuple[str, str, str]] = {}  # question key -> (split, where, answer key)
    repeats: list[tuple[str, str]] = []
    for name, (rows, where) in splits.items():
        for row, here in zip(rows, where):
            key = question_key(row["question"])
            answer = question_key(row["answer"])
            seen = owner.get(key)
            if seen is None:
                owner[key] = (name, here, answer)
                continue
            other, there, other_answer = seen
            if other != name:
                raise ValueError(
                    f"{here}: question also in the {other} split at {there} "
                    f"(the {other} and {name} splits must not share a question)"
                )
            if name in strict or answer == other_answer:
                what = "a copy of" if answer == other_answer else "the same question as"
                raise ValueError(f"{here}: duplicate question in the {name} split, {what} {there}")
            repeats.append((there, here))
    return repeats


def log_repeats(repeats: list[tuple[str, str]]) -> None:
    """Log (at INFO, counted) the repeated questions :func:`check_distinct` kept."""
    if repeats:
        _log.info(
            "%d question(s) asked twice with different answers, kept as distinct facts: %s",
            len(repeats),
            "; ".join(f"{a} and {b}" for a, b in repeats),
        )
