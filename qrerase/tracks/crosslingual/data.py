"""Cross-lingual TOFU: language codes, per-language file checks and the sets of a cross-lingual run.

Data layout. Every language has one folder ("language root") holding the six TOFU splits of
:data:`SPLIT_FILES` as JSON Lines: English is TOFU itself (``data/tofu``), the nine translations
(``ar fa fr hi id iw ja ko ru``) come from multilingual TOFU (``data/mtofu/<lang>``), and a romanised
variant ``<lang>_R`` is a folder of the same six files written by :func:`romanise_split`. Rows are
aligned across languages by position: row ``i`` of ``retain99`` is the translation of row ``i`` of
TOFU ``full`` (author ``i // 20``), row ``i`` of ``forget01`` the translation of row ``3960 + i`` (the
last two authors), ``retain_perturbed`` the first 400 rows of ``full`` (the first 20 authors), and
``real_authors_perturbed`` / ``world_facts_perturbed`` row by row the English sets. So "the same QA
in another language" is "the same row".

A run (:func:`make_language_sets`) with ``n_authors`` authors forgets TOFU's ``forget01`` (2 authors,
40 QA — the only split with translated perturbed answers) and retains the first ``n_authors - 2``
authors of ``retain99``; per language it cuts

- ``forget``, ``retain``: the training QA (``question``/``answer``) of those authors;
- ``knowledge``: the first ``knowledge_questions`` QA of each chosen knowledge set (real authors, world
  facts), mixed into training like the TOFU track does for the tiny model, and evaluated as such;
- ``eval_forget`` (``forget01_perturbed``), ``eval_retain`` (the rows of ``retain_perturbed`` whose
  author is retained), ``eval_real_authors``, ``eval_world_facts``: at most ``max_questions`` each, with
  ``paraphrased_answer`` and the ``perturbed_answer`` list the Truth Ratio needs (real authors and
  world facts have no paraphrase: the TOFU protocol uses ``answer``).

The machine translations of ``forget01`` and ``forget01_perturbed`` were made independently: outside
English no forget answer (and almost no question) of one file is worded as in the other, and some
``forget01`` translations are garbled. By default (``forget_split="forget01_perturbed"``) the forget
training QA are therefore the ``question``/``answer`` of ``forget01_perturbed``, the wording the
evaluation scores (Probability, ROUGE-L) and the one whose paraphrases and perturbations the Truth
Ratio compares; in English the two files hold the same QA. ``forget_split="forget01"`` trains on
``forget01`` instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...io import read_jsonl_numbered
from ...text.data import KNOWLEDGE_SETS, check_distinct, check_fields, log_repeats, normalise
from .romanise import ROMANISERS, romanise_record

__all__ = [
    "FORGET_SPLITS",
    "LANGUAGES",
    "SCRIPTS",
    "SPLIT_FILES",
    "REQUIRED_FIELDS",
    "FORGET_AUTHORS",
    "KNOWLEDGE_SETS",
    "parse_language",
    "language_label",
    "check_records",
    "load_language_split",
    "check_language_files",
    "romanise_split",
    "make_language_sets",
]

#: language code -> display name (as in the paper's tables). ``iw`` is Hebrew (the corpus' code).
LANGUAGES: dict[str, str] = {
    "en": "English",
    "ar": "Arabic",
    "fa": "Persian",
    "fr": "French",
    "hi": "Hindi",
    "id": "Indonesian",
    "iw": "Hebrew",
    "ja": "Japanese",
    "ko": "Korean",
    "ru": "Russian",
}
#: language code -> writing system.
SCRIPTS: dict[str, str] = {
    "en": "latin",
    "fr": "latin",
    "id": "latin",
    "ar": "arabic",
    "fa": "arabic",
    "iw": "hebrew",
    "hi": "devanagari",
    "ja": "japanese",
    "ko": "hangul",
    "ru": "cyrillic",
}
#: the six splits every language root holds.
SPLIT_FILES: tuple[str, ...] = (
    "forget01",
    "forget01_perturbed",
    "retain99",
    "retain_perturbed",
    "real_authors_perturbed",
    "world_facts_perturbed",
)
#: split -> fields every record must have (``perturbed_answer``: a non-empty list of strings).
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "forget01": ("question", "answer"),
    "forget01_perturbed": ("question", "answer", "paraphrased_answer", "perturbed_answer"),
    "retain99": ("question", "answer"),
    "retain_perturbed": ("question", "answer", "paraphrased_answer", "perturbed_answer"),
    "real_authors_perturbed": ("question", "answer", "perturbed_answer"),
    "world_facts_perturbed": ("question", "answer", "perturbed_answer"),
}
#: files the forget training QA may come from (see the module docstring).
FORGET_SPLITS = ("forget01_perturbed", "forget01")

#: expected row counts (TOFU's: 2 forget authors, 198 retain authors, 20 retain_perturbed authors).
ROW_COUNTS: dict[str, int] = {"forget01": 40, "forget01_perturbed": 40, "retain99": 3960, "retain_perturbed": 400}
QA_PER_AUTHOR = 20
FORGET_AUTHORS = 2
N_AUTHORS = 200


def parse_language(code: str) -> tuple[str, str | None]:
    """``'hi'`` -> ``('hi', None)``; ``'hi_R'`` -> ``('hi', 'devanagari')`` (the script to romanise).

    ``ValueError`` for an unknown code or a romanised variant of a script without romaniser (or one
    already in Latin script).
    """
    base, sep, suffix = str(code).partition("_")
    if base not in LANGUAGES or (sep and suffix != "R"):
        known = ", ".join(sorted(LANGUAGES))
        raise ValueError(f"unknown language '{code}'; expected one of {known}, or <lang>_R for a romanised variant")
    if not sep:
        return base, None
    script = SCRIPTS[base]
    if script == "latin":
        raise ValueError(f"'{code}': {LANGUAGES[base]} is already written in Latin script; nothing to romanise")
    if script not in ROMANISERS:
        have = ", ".join(f"{c}_R" for c, s in SCRIPTS.items() if s in ROMANISERS)
        raise ValueError(
            f"'{code}': no transliterator for the {script} script of {LANGUAGES[base]} (romanisable: {have})"
        )
    return base, script


def language_label(code: str) -> str:
    """Display name: ``'hi'`` -> ``'Hindi'``, ``'hi_R'`` -> ``'Hindi (R)'``."""
    base, script = parse_language(code)
    return LANGUAGES[base] + (" (R)" if script else "")


def check_records(
    rows: Sequence[Mapping[str, Any]], split: str, where: str, lines: Sequence[int] | None = None
) -> None:
    """Check that every record of ``split`` has its :data:`REQUIRED_FIELDS` (and the row count).

    Errors name ``where:<line>``: ``lines[i]`` is record i's line in the file (default: i + 1)."""
    if split not in REQUIRED_FIELDS:
        raise ValueError(f"{where}: unknown split {split!r}; expected one of {list(REQUIRED_FIELDS)}")
    if not rows:
        raise ValueError(f"{where}: no records")
    for i, rec in enumerate(rows):
        check_fields(rec, REQUIRED_FIELDS[split], f"{where}:{lines[i] if lines is not None else i + 1}")
    want = ROW_COUNTS.get(split)
    if want is not None and len(rows) != want:
        raise ValueError(
            f"{where}: {len(rows)} records, expected {want} (the {split} split, row-aligned across languages)"
        )


def load_language_split(root: str | os.PathLike, split: str) -> list[dict]:
    """Read and check ``<root>/<split>.jsonl``."""
    return _load_numbered(root, split)[0]


def _load_numbered(root: str | os.PathLike, split: str) -> tuple[list[dict], list[str]]:
    path = Path(root) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: data file not found")
    # TOFU's own files spell some splits prompt/response (normalise maps them onto question/answer).
    numbered = read_jsonl_numbered(path)
    rows = [normalise(r, f"{path}:{line}") for line, r in numbered]
    check_records(rows, split, str(path), [line for line, _ in numbered])
    return rows, [f"{path}:{line}" for line, _ in numbered]


def check_language_files(root: str | os.PathLike) -> None:
    """Check all six splits of a language root (files present, required fields, row counts)."""
    for split in SPLIT_FILES:
        load_language_split(root, split)


def romanise_split(rows: Sequence[Mapping[str, Any]], script: str) -> list[dict]:
    """Transliterate every text field of every record (:func:`.romanise.romanise_record`)."""
    return [romanise_record(r, script) for r in rows]


def _qa(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    return [{"question": r["question"], "answer": r["answer"]} for r in rows]


def make_language_sets(
    root: str | os.PathLike,
    n_authors: int | None,
    max_questions: int,
    knowledge: Sequence[str] = KNOWLEDGE_SETS,
    knowledge_questions: int | None = None,
    forget_split: str = "forget01_perturbed",
    pretrain_authors: int = 0,
) -> dict[str, list[dict]]:
    """Cut one language's training and evaluation sets (see the module docstring).

    ``n_authors``: authors in the run (2 forgotten + ``n_authors - 2`` retained), 3..200, ``None`` = 200.
    ``knowledge_questions``: rows of each knowledge set trained *and* evaluated (``None``:
    ``max_questions``); the real-authors / world-facts evaluation sets are exactly the trained rows.
    ``forget_split``: the file of the forget training QA, ``"forget01_perturbed"`` or ``"forget01"``.
    ``pretrain_authors``: authors of the pretraining set, the ``retain99`` authors after the retained
    ones (in neither the forget nor the retain set); ``pretrain`` holds their QA plus the knowledge QA.
    Returns ``forget``, ``retain``, ``knowledge``, ``pretrain``, ``eval_forget``, ``eval_retain``,
    ``eval_real_authors``, ``eval_world_facts``. Row ``i`` of each set is the same QA in every language.
    """
    n = N_AUTHORS if n_authors is None else int(n_authors)
    if not FORGET_AUTHORS + 1 <= n <= N_AUTHORS:
        raise ValueError(f"n_authors: expected {FORGET_AUTHORS + 1}..{N_AUTHORS} (or null for all), got {n_authors!r}")
    cap = int(max_questions)
    if cap < 1:
        raise ValueError(f"max_questions: expected a positive integer, got {max_questions!r}")
    unknown = [k for k in knowledge if k not in KNOWLEDGE_SETS]
    if unknown:
        raise ValueError(f"knowledge: expected a subset of {list(KNOWLEDGE_SETS)}, got {unknown}")
    kcap = cap if knowledge_questions is None else min(cap, int(knowledge_questions))
    if kcap < 1:
        raise ValueError(f"knowledge_questions: expected a positive integer, got {knowledge_questions!r}")
    if forget_split not in FORGET_SPLITS:
        raise ValueError(f"forget_split: expected one of {list(FORGET_SPLITS)}, got {forget_split!r}")
    n_retain_rows = (n - FORGET_AUTHORS) * QA_PER_AUTHOR
    room = N_AUTHORS - n
    if not 0 <= int(pretrain_authors) <= room:
        raise ValueError(f"pretrain_authors: expected 0..{room} (the authors in neither set), got {pretrain_authors!r}")
    n_pretrain_rows = int(pretrain_authors) * QA_PER_AUTHOR
    numbered = {s: _load_numbered(root, s) for s in SPLIT_FILES}
    split = {s: rows for s, (rows, _) in numbered.items()}
    # the forget QA, the retain split (retain and pretraining authors) and the knowledge QA share no question
    distinct = {"forget": numbered[forget_split], "retain": numbered["retain99"]}
    distinct.update({k: numbered[f"{k}_perturbed"] for k in knowledge})
    log_repeats(check_distinct(distinct, strict=("forget",)))
    sets = {
        "forget": _qa(split[forget_split]),
        "retain": _qa(split["retain99"][:n_retain_rows]),
        "eval_forget": split["forget01_perturbed"][:cap],
        # retain_perturbed row i = retain99 row i (the first 20 authors): keep the retained authors' rows.
        "eval_retain": split["retain_perturbed"][: min(n_retain_rows, cap)],
        "eval_real_authors": split["real_authors_perturbed"][:kcap],
        "eval_world_facts": split["world_facts_perturbed"][:kcap],
    }
    sets["knowledge"] = [qa for k in knowledge for qa in _qa(split[f"{k}_perturbed"][:kcap])]
    sets["pretrain"] = _qa(split["retain99"][n_retain_rows : n_retain_rows + n_pretrain_rows]) + sets["knowledge"]
    return sets
