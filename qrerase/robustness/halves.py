"""The halves of a text forget set (rule robustness_halves): numpy only, no torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .measures import split_halves

__all__ = ["entities_in_blocks", "text_halves", "with_paraphrases"]


def entities_in_blocks(n: int, block: int | None) -> list[str]:
    """Entity labels of a forget set laid out in blocks of ``block`` items (TOFU: 20 questions per
    author, in file order); ``None``: one entity (a task-level skill)."""
    if block is None:
        return ["0"] * n
    if block < 1 or n % block:
        raise ValueError(f"a forget set of {n} rows is not in blocks of {block} items per entity")
    return [str(i // block) for i in range(n)]


def text_halves(rows: Sequence[Mapping[str, Any]], block: int | None, seed: int, share: float) -> np.ndarray:
    """Half A's mask of a forget file's rows (:func:`qrerase.robustness.measures.split_halves` on
    :func:`entities_in_blocks`); a question of B asked again in A (same text) is an error."""
    in_a = split_halves(entities_in_blocks(len(rows), block), seed, share)
    a_questions = {rows[i]["question"].strip() for i in np.flatnonzero(in_a)}
    both = [rows[i]["question"] for i in np.flatnonzero(~in_a) if rows[i]["question"].strip() in a_questions]
    if both:
        raise ValueError(f"halves A and B share question {both[0]!r}")
    return in_a


def with_paraphrases(
    rows: Sequence[Mapping[str, Any]], source: Sequence[Mapping[str, Any]], where: str
) -> list[dict[str, Any]]:
    """``rows`` with the ``paraphrased_question`` of the row of ``source`` (a file at ``where``) that asks
    the same question; a one-line ValueError naming ``where`` when a row has none (the paraphrase attack
    needs one for every question it asks)."""
    by_question = {
        str(r["question"]).strip(): r["paraphrased_question"] for r in source if r.get("paraphrased_question")
    }
    out = []
    for r in rows:
        if r.get("paraphrased_question"):
            out.append(dict(r))
            continue
        found = by_question.get(str(r["question"]).strip())
        if not found:
            raise ValueError(f"{where}: no paraphrased_question for forget question {r['question']!r}")
        out.append({**r, "paraphrased_question": found})
    return out
