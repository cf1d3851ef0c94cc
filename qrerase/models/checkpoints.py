"""Hugging Face checkpoint plumbing shared by the text and the speech models.

Devices (:func:`resolve_device`: a launched worker's own GPU from ``LOCAL_RANK``; :func:`model_device`),
the ``dtype`` names of the config (:data:`DTYPES`), where a checkpoint lives (:func:`resolve_checkpoint`:
a local directory, or a hub id resolved through the local cache), the check that a loaded checkpoint's
weights match its config (:func:`check_loading_info`) and the atomic safetensors writer :func:`save_model`.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

from ..io import atomic_dir
from .checkpoint_files import check_dir, looks_like_hub_id

__all__ = [
    "DTYPES",
    "resolve_checkpoint",
    "first_line",
    "check_loading_info",
    "save_model",
]

#: Config ``dtype`` names → torch dtypes.
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when empty), for one-line errors."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _some(keys: Iterable[str], n: int = 3) -> str:
    keys = sorted(keys)
    more = f", ... ({len(keys)} in all)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def check_loading_info(
    name_or_path,
    info: Mapping[str, Iterable],
    allow_missing: Sequence[str] = (),
    allow_unexpected: Sequence[str] = (),
    allow_mismatched: Sequence[str] = (),
) -> None:
    """The ``output_loading_info`` of ``from_pretrained``: a one-line ValueError naming ``name_or_path`` and
    the keys when the weights do not match the model its ``config.json`` describes.

    ``missing_keys`` (weights the model has and the checkpoint lacks: ``from_pretrained`` would initialise
    them randomly), ``unexpected_keys`` (weights the checkpoint holds beyond the model: dropped, e.g. a
    ``num_hidden_layers`` below the checkpoint's, a silently truncated model) and ``mismatched_keys``
    (another shape, reinitialised under ``ignore_mismatched_sizes``), each less the keys matching a
    pattern (``re.search``) of its ``allow_*`` list. Tied weights are not listed by transformers.
    """

    def left(kind: str, allowed: Sequence[str]) -> list[str]:
        keys = [k[0] if isinstance(k, (tuple, list)) else k for k in info.get(kind) or ()]
        return [k for k in keys if not any(re.search(a, k) for a in allowed)]

    problems = []
    for kind, allowed, words in (
        ("missing_keys", allow_missing, "weights missing from the checkpoint (they would be random)"),
        ("unexpected_keys", allow_unexpected, "weights the model has no place for (they would be dropped)"),
        ("mismatched_keys", allow_mismatched, "weights of another shape"),
    ):
        keys = left(kind, allowed)
        if keys:
            problems.append(f"{words}: {_some(keys)}")
    errors = [first_line(Exception(e)) for e in info.get("error_msgs") or () if str(e).strip()]
    if errors:
        problems.append(f"load errors: {'; '.join(errors[:2])}")
    if problems:
        raise ValueError(f"{name_or_path}: the weights do not match its config.json; " + "; ".join(problems))


def resolve_checkpoint(name_or_path, local_files_only: bool, markers: Sequence[str], what: str) -> str:
    """A local directory for ``name_or_path``, or the hub id itself when downloads are allowed.

    With ``local_files_only`` a hub id is resolved through the local Hugging Face cache first:
    ``from_pretrained`` on a bare id may still probe the network for optional files.
    """
    p = Path(name_or_path).expanduser()
    if p.exists():
        check_dir(p, what)  # a file, or an empty directory: the message of the planning-time check
        if not any((p / m).is_file() for m in markers):
            raise ValueError(f"{name_or_path}: not a {what} directory (none of {', '.join(markers)} found)")
        return str(p)
    if not local_files_only:
        return str(name_or_path)
    if not looks_like_hub_id(str(name_or_path)):
        raise ValueError(f"{name_or_path}: no such {what} directory")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(str(name_or_path), local_files_only=True)
    except Exception as exc:
        raise ValueError(
            f"{name_or_path}: no such {what} directory, and not in the local Hugging Face cache ({first_line(exc)})"
        ) from exc


def save_model(model, tokenizer, out_dir: str | os.PathLike) -> None:
    """Save model (safetensors) and tokenizer into ``out_dir`` atomically (replacing it whole)."""
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers < 5; v5 always writes safetensors
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), **kwargs)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
