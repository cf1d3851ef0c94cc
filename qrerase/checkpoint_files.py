"""What a local Hugging Face checkpoint folder must hold, checked from its file names (no torch).

The loaders of the jobs (:func:`qrerase.checkpoints.resolve_checkpoint`) and the planning-time config
checks (:mod:`qrerase.workflow.validation`) share these checks, so a bad ``model.name_or_path`` is refused
with the same one-line message before any job runs. A name that is not a local path and has the
shape of a hub id (``org/name``) is left to the loader: planning never touches the network.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "MODEL_CONFIG",
    "MODEL_WEIGHTS",
    "TOKENIZER_FILES",
    "looks_like_hub_id",
    "is_local_path",
    "check_dir",
    "check_model_dir",
]

MODEL_CONFIG = "config.json"
#: Weight files ``from_pretrained`` reads (a single file or a sharded index).
MODEL_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def looks_like_hub_id(name: str) -> bool:
    """``name`` or ``org/name`` (not starting with '.', '/' or '~'): what ``from_pretrained`` may download."""
    parts = name.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not name.startswith((".", "/", "~"))


def is_local_path(name_or_path: str | os.PathLike) -> bool:
    """True for an existing path, or a name that cannot be a hub id (so it must be a local path)."""
    return Path(name_or_path).expanduser().exists() or not looks_like_hub_id(str(name_or_path))


def check_dir(path: str | os.PathLike, what: str) -> Path:
    """The existing, non-empty directory ``path``; else a ValueError naming it (missing, a file, empty)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{path}: no such {what} directory")
    if not p.is_dir():
        raise ValueError(f"{path}: is a file, expected a {what} directory")
    if not any(p.iterdir()):
        raise ValueError(f"{path}: empty directory, expected a {what} directory")
    return p


def check_model_dir(path: str | os.PathLike, what: str = "model", tokenizer: bool = False) -> Path:
    """A local model directory: ``config.json`` and weights (and a tokenizer when ``tokenizer``).

    A directory with ``adapter_config.json`` instead of ``config.json`` is a PEFT adapter, which
    ``from_pretrained`` loads on its base model: it needs ``adapter_model.safetensors``. Raises a
    one-line ValueError naming the path and what is missing.
    """
    p = check_dir(path, what)
    names = {f.name for f in p.iterdir()}
    has_tokenizer = any(n in names for n in TOKENIZER_FILES)
    if MODEL_CONFIG not in names and "adapter_config.json" in names:
        if "adapter_model.safetensors" not in names:
            raise ValueError(f"{path}: PEFT adapter without adapter_model.safetensors")
    elif MODEL_CONFIG not in names:
        only = " (it holds a tokenizer only)" if has_tokenizer else ""
        raise ValueError(f"{path}: no {MODEL_CONFIG}, not a {what} directory{only}")
    elif not any(n in names for n in MODEL_WEIGHTS):
        raise ValueError(f"{path}: no weights (none of {', '.join(MODEL_WEIGHTS)})")
    if tokenizer and not has_tokenizer:
        raise ValueError(f"{path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    return p
