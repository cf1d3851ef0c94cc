"""TOFU-format evaluation logs (Maini et al., 2024): file names, loading, validation and writing.

This module re-implements the aggregation of the TOFU release (``aggregate_eval_stat.py`` of
``locuslab/tofu``) so that logs written by the original TOFU evaluation code, and logs written by our
own evaluation, give the same numbers. On TOFU's published log of Llama-2-7B fine-tuned on ``full``
it gives Model Utility 0.6227 (the paper's *Base Model* row).

Log format
----------
A *log* is a dict with four keys, the names of TOFU's four evaluation files (see :data:`FILES`)::

    eval_log.json                      retain set         ("retain")
    eval_log_forget.json               forget set         ("forget")
    eval_real_author_wo_options.json   real authors       ("real_authors")
    eval_real_world_wo_options.json    world facts        ("world_facts")

Each value (a *log set*) maps a field name to ``{question index (str): value}``. Required fields:

- ``avg_gt_loss`` — mean per-token negative log-likelihood of the ground-truth answer tokens;
- ``avg_paraphrased_loss`` — the same for the paraphrased answer (for real authors and world facts
  TOFU uses the answer itself);
- ``average_perturb_loss`` — list, one mean per-token NLL per perturbed (wrong) answer;
- ``rougeL_recall`` — ROUGE-L recall of the greedy generation against the ground truth;
- ``generated_text`` — ``[prompt, generation, ground truth]``. (This is the order in TOFU's own
  logs: ``zip(input_strings, gen_outputs, ground_truths)``; ``rougeL_recall`` of every published
  log entry equals the ROUGE-L recall of ``item[1]`` against ``item[2]``,
  :func:`qrerase.text.evaluation.rouge_recalls`.)

Optional fields (``gt_loss``, ``num_token_gt``, ``rouge1_recall``, ``truth_ratio``,
``paraphrased_loss``, ``perturb_loss``, ``num_token_paraphrased``, ``num_token_perturb``, and any
other field such as ``normalized_gt_loss``) are validated where they carry losses and otherwise kept
untouched. Question indices are ordered as integers wherever an order matters.

The metrics are :mod:`qrerase.metrics.log_metrics`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..io import write_json

__all__ = [
    "FILES",
    "LOG_SETS",
    "UTILITY_SETS",
    "REQUIRED_FIELDS",
    "AGGREGATED_NAME",
    "EVAL_SETS",
    "SET_LABELS",
    "log_set_name",
    "load_log",
    "validate_log",
    "write_log",
    "write_aggregated",
]

#: set name -> TOFU file name (the key of that set in a log; one per set of :data:`LOG_SETS`).
FILES: dict[str, str] = {
    "retain": "eval_log.json",
    "forget": "eval_log_forget.json",
    "real_authors": "eval_real_author_wo_options.json",
    "world_facts": "eval_real_world_wo_options.json",
}
#: TOFU's evaluation sets with their table labels, in the order of the component metrics: the one
#: list of the sets (the tuples below, :data:`FILES` and the tables derive from it).
SET_LABELS: dict[str, str] = {
    "retain": "Retain",
    "real_authors": "Real Authors",
    "world_facts": "World Facts",
    "forget": "Forget",
}
#: set names in the order used for component metrics.
LOG_SETS: tuple[str, ...] = tuple(SET_LABELS)
#: the three sets that enter Model Utility.
UTILITY_SETS: tuple[str, ...] = tuple(s for s in LOG_SETS if s != "forget")
#: the evaluation sets in the order the workflow's data paths list them (rules/common.smk ``EVAL_SETS``).
EVAL_SETS: tuple[str, ...] = ("forget", *UTILITY_SETS)
#: fields every log set must have.
REQUIRED_FIELDS: tuple[str, ...] = (
    "avg_gt_loss",
    "avg_paraphrased_loss",
    "average_perturb_loss",
    "rougeL_recall",
    "generated_text",
)

AGGREGATED_NAME = "eval_log_aggregated.json"

_FILE_TO_SET = {v: k for k, v in FILES.items()}
# Other spellings of the four keys met in TOFU forks' aggregated files.
_KEY_ALIASES = {
    "log": "eval_log.json",
    "eval_log": "eval_log.json",
    "log_forget": "eval_log_forget.json",
    "eval_log_forget": "eval_log_forget.json",
    "real_author_wo_options": "eval_real_author_wo_options.json",
    "eval_real_author_wo_options": "eval_real_author_wo_options.json",
    "real_world_wo_options": "eval_real_world_wo_options.json",
    "eval_real_world_wo_options": "eval_real_world_wo_options.json",
    **{k: v for k, v in FILES.items()},
    **{v: v for v in FILES.values()},
}
_SCALAR_LOSS_FIELDS = ("avg_gt_loss", "avg_paraphrased_loss", "gt_loss", "paraphrased_loss")
_LIST_LOSS_FIELDS = ("average_perturb_loss", "perturb_loss")
_LIST_FIELDS_LIKE_PERTURB = ("perturb_loss", "num_token_perturb")
_SCALAR_SCORE_FIELDS = ("rougeL_recall", "rouge1_recall")
_SEQ = (list, tuple, np.ndarray)


def _set_key(kind: str) -> str:
    """Map a set name ("retain") or a file name ("eval_log.json") to the file name."""
    if kind in FILES:
        return FILES[kind]
    if kind in _FILE_TO_SET:
        return kind
    raise ValueError(f"unknown TOFU set {kind!r}; expected one of {list(FILES)} or {list(_FILE_TO_SET)}")


def log_set_name(kind: str) -> str:
    """The set name (``"retain"``) of a set or file name (``"eval_log.json"``); ValueError when unknown."""
    return _FILE_TO_SET[_set_key(kind)]


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: TOFU eval log not found")
    from ..io import decode_utf8

    text = decode_utf8(path.read_bytes(), path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc


def _normalise_keys(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{source}: a TOFU eval log must be a JSON object with the keys {list(_FILE_TO_SET)}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        canon = _KEY_ALIASES.get(key)
        if canon is None:
            continue  # unrelated top-level entries are ignored
        if canon in out:
            raise ValueError(f"{source}: set {canon} given twice (as {key!r})")
        out[canon] = value
    missing = [f for f in _FILE_TO_SET if f not in out]
    if missing:
        raise ValueError(f"{source}: missing TOFU set(s) {missing}; found keys {sorted(map(str, raw))}")
    return {f: out[f] for f in FILES.values()}


def load_log(path: str | os.PathLike) -> dict:
    """Load and validate a TOFU eval log.

    ``path`` is either an aggregated JSON file (``eval_log_aggregated.json``: one object whose keys
    are the four file names) or a directory holding the four files ``eval_log.json``,
    ``eval_log_forget.json``, ``eval_real_author_wo_options.json``,
    ``eval_real_world_wo_options.json`` (a directory holding only ``eval_log_aggregated.json`` is
    accepted too). Returns ``{file name: {field: {question: value}}}``; raises ``ValueError``
    naming the file, set and field on malformed content (see :func:`validate_log`).
    """
    path = Path(path)
    if path.is_dir():
        files = {f: path / f for f in FILES.values()}
        if all(p.is_file() for p in files.values()):
            log = {}
            for fname, fpath in files.items():
                content = _read_json(fpath)
                validate_log({fname: content}, source=str(fpath), sets=(fname,))
                log[fname] = content
            validate_log(log, source=str(path))
            return log
        if (path / AGGREGATED_NAME).is_file():
            return load_log(path / AGGREGATED_NAME)
        missing = [f for f, p in files.items() if not p.is_file()]
        raise FileNotFoundError(f"{path}: not a TOFU eval log directory (missing {missing} and no {AGGREGATED_NAME})")
    raw = _read_json(path)
    log = _normalise_keys(raw, str(path))
    validate_log(log, source=str(path))
    return log


def _finite_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(float(x))


def _check_int_key(q: Any, where: str) -> int:
    try:
        return int(q)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: question index {q!r} is not an integer") from None


def _validate_set(log_set: Any, where: str) -> None:
    if not isinstance(log_set, Mapping):
        raise ValueError(f"{where}: a TOFU log set must be an object mapping field -> {{question: value}}")
    for field in REQUIRED_FIELDS:
        if field not in log_set:
            raise ValueError(f"{where}: missing required field {field!r} (has {sorted(log_set)})")
    ref_field = "avg_gt_loss"
    ref = log_set[ref_field]
    if not isinstance(ref, Mapping):
        raise ValueError(f"{where}, field {ref_field!r}: expected an object {{question: value}}")
    if len(ref) == 0:
        raise ValueError(f"{where}, field {ref_field!r}: empty set (no questions)")
    ref_keys = set(ref)
    for q in ref_keys:
        _check_int_key(q, f"{where}, field {ref_field!r}")
    for field, values in log_set.items():
        if not isinstance(values, Mapping):
            if field in REQUIRED_FIELDS or field in _SCALAR_LOSS_FIELDS + _LIST_LOSS_FIELDS:
                raise ValueError(f"{where}, field {field!r}: expected an object {{question: value}}")
            continue  # set-level extras (e.g. a scalar summary) are kept as they are
        if set(values) != ref_keys:
            only_here = sorted(set(values) - ref_keys, key=str)[:5]
            only_ref = sorted(ref_keys - set(values), key=str)[:5]
            raise ValueError(
                f"{where}, field {field!r}: mismatched lengths/questions with {ref_field!r} "
                f"({len(values)} vs {len(ref)} questions; only in {field!r}: {only_here}, "
                f"only in {ref_field!r}: {only_ref})"
            )
    for field in _SCALAR_LOSS_FIELDS + _SCALAR_SCORE_FIELDS:
        if field not in log_set:
            continue
        for q, v in log_set[field].items():
            if not _finite_number(v):
                raise ValueError(
                    f"{where}, field {field!r}, question {q}: value {v!r} is not a finite number (NaN/Inf?)"
                )
            if float(v) < 0:
                raise ValueError(f"{where}, field {field!r}, question {q}: negative value {v!r}")
            if field in _SCALAR_SCORE_FIELDS and float(v) > 1:
                raise ValueError(f"{where}, field {field!r}, question {q}: recall {v!r} > 1")
    for field in _LIST_LOSS_FIELDS:
        if field not in log_set:
            continue
        for q, v in log_set[field].items():
            if not isinstance(v, _SEQ) or len(v) == 0:
                raise ValueError(
                    f"{where}, field {field!r}, question {q}: expected a non-empty list of losses, got {v!r}"
                )
            for x in v:
                if not _finite_number(x):
                    raise ValueError(
                        f"{where}, field {field!r}, question {q}: loss {x!r} is not a finite number (NaN/Inf?)"
                    )
                if float(x) < 0:
                    raise ValueError(f"{where}, field {field!r}, question {q}: negative loss {x!r}")
    for field in _LIST_FIELDS_LIKE_PERTURB:
        if field not in log_set:
            continue
        for q, v in log_set[field].items():
            n = len(log_set["average_perturb_loss"][q])
            if not isinstance(v, _SEQ) or len(v) != n:
                raise ValueError(
                    f"{where}, field {field!r}, question {q}: mismatched lengths, expected a list of {n} "
                    f"(as 'average_perturb_loss'), got {v!r}"
                )
    for q, v in log_set["generated_text"].items():
        if not isinstance(v, _SEQ) or len(v) != 3 or not all(isinstance(s, str) for s in v):
            raise ValueError(
                (
                    f"{where}, field 'generated_text', question {q}: "
                    f"expected [prompt, generation, ground truth] strings, got {v!r}"
                )[:400]
            )


def validate_log(log: Mapping, source: str = "<log>", sets: tuple[str, ...] | None = None) -> None:
    """Check a TOFU eval log; raise ``ValueError`` naming ``source``, the set (file) and the field.

    Checks: the four sets are present (or those named in ``sets``); every set has the required
    fields (:data:`REQUIRED_FIELDS`); every field covers the same questions as ``avg_gt_loss``
    (mismatched lengths); the set is not empty; losses are finite and non-negative (no NaN/Inf);
    perturbed-loss lists are non-empty and per-question lists (``perturb_loss``,
    ``num_token_perturb``) match ``average_perturb_loss`` in length; recalls lie in [0, 1];
    ``generated_text`` entries are ``[prompt, generation, ground truth]``.
    """
    if not isinstance(log, Mapping):
        raise ValueError(f"{source}: a TOFU eval log must be a dict with the keys {list(_FILE_TO_SET)}")
    wanted = [_set_key(s) for s in sets] if sets is not None else list(FILES.values())
    for fname in wanted:
        if fname not in log:
            raise ValueError(
                f"{source}: missing TOFU set {fname} ({_FILE_TO_SET[fname]}); found keys {sorted(map(str, log))}"
            )
        _validate_set(log[fname], f"{source}: {fname} ({_FILE_TO_SET[fname]})")


def _builtin(obj: Any) -> Any:
    """Convert numpy scalars/arrays (and tuples) into JSON-serialisable Python objects."""
    if isinstance(obj, Mapping):
        return {str(k): _builtin(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_builtin(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    return obj


def write_log(log: Mapping, out_dir: str | os.PathLike) -> None:
    """Validate ``log`` and write its four TOFU files into ``out_dir``, each atomically."""
    validate_log(log, source=f"log to be written to {out_dir}")
    out_dir = Path(out_dir)
    for fname in FILES.values():
        write_json(out_dir / fname, _builtin(log[fname]))


def write_aggregated(log: Mapping, path: str | os.PathLike) -> None:
    """Validate ``log`` and write it as one ``eval_log_aggregated.json``-style file, atomically."""
    validate_log(log, source=f"log to be written to {path}")
    write_json(path, {fname: _builtin(log[fname]) for fname in FILES.values()})
