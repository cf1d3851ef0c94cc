"""What a local Hugging Face checkpoint folder must hold, checked from its file names and, for a
Llama-like or HuBERT model, its ``config.json`` against the shapes in the safetensors headers (no torch;
no tensor is read).

The loaders of the jobs (:func:`qrerase.models.checkpoints.resolve_checkpoint`) and the planning-time config
checks (:mod:`qrerase.workflow.validation`) share these checks, so a bad ``model.name_or_path`` is refused
with the same one-line message before any job runs. A name that is not a local path and has the
shape of a hub id (``org/name``) is left to the loader: planning never touches the network.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

__all__ = [
    "MODEL_CONFIG",
    "MODEL_WEIGHTS",
    "PICKLE_WEIGHTS",
    "PICKLE_REFUSAL",
    "TOKENIZER_FILES",
    "looks_like_hub_id",
    "is_local_path",
    "check_dir",
    "refuse_pickle_weights",
    "check_model_dir",
    "CHECKED_MODEL_TYPES",
    "header_shapes",
    "weight_map",
    "safetensors_shapes",
    "check_config_matches_weights",
    "model_names",
    "config_fingerprint",
    "same_model",
]

MODEL_CONFIG = "config.json"
#: Weight files ``from_pretrained`` reads (a single file or a sharded index).
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
#: Pickle weight files (``torch.save``): never loaded, since unpickling can run code (the message says how to convert).
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
PICKLE_REFUSAL = (
    "pickle weights ({found}) are not supported, since loading them can run code; convert the folder to "
    "safetensors (in transformers: `AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)`, "
    "on a machine you trust)"
)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
#: ``config.json`` model types whose layer count, hidden size and vocabulary :func:`check_config_matches_weights`
#: checks (decoders with ``[model.]layers.<i>.`` and ``embed_tokens``; HuBERT's ``encoder.layers.<i>.``).
CHECKED_MODEL_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2", "cohere", "phi", "phi3"}
    | {"olmo", "olmo2", "granite", "hubert"}
)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_MAX_HEADER = 100 * 1024 * 1024


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


def refuse_pickle_weights(path: str | os.PathLike) -> None:
    """A one-line ValueError naming ``path`` when the folder holds pickle weights and no safetensors ones."""
    p = Path(path).expanduser()
    if p.is_dir() and not any((p / n).is_file() for n in MODEL_WEIGHTS):
        pickled = [n for n in PICKLE_WEIGHTS if (p / n).is_file()]
        if pickled:
            raise ValueError(f"{path}: " + PICKLE_REFUSAL.format(found=", ".join(pickled)))


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
        refuse_pickle_weights(path)
        raise ValueError(f"{path}: no weights (none of {', '.join(MODEL_WEIGHTS)})")
    if tokenizer and not has_tokenizer:
        raise ValueError(f"{path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    if MODEL_CONFIG in names:
        check_config_matches_weights(p)
    return p


def header_shapes(file: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from one safetensors file's JSON header (its first 8 + n bytes)."""
    try:
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= _MAX_HEADER:
                raise ValueError(f"header size {size}")
            header = json.loads(f.read(size))
        return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{file}: not a readable safetensors file ({exc})") from None


def weight_map(path: str | os.PathLike) -> tuple[dict[str, str], Path]:
    """(tensor name -> the file under ``path`` that holds it, the file named in messages) of a model
    directory's safetensors weights: ``model.safetensors.index.json``'s ``weight_map``, or every tensor of
    a single ``model.safetensors`` (its header). A one-line ValueError naming the file where neither is
    readable; the shards themselves are not opened."""
    p = Path(path).expanduser()
    index, single = p / "model.safetensors.index.json", p / "model.safetensors"
    if index.is_file():
        try:
            found = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{index}: not a readable safetensors index ({exc})") from None
        return dict(found), index
    if single.is_file():
        return {k: single.name for k in header_shapes(single)}, single
    raise ValueError(f"{p}: no model.safetensors.index.json or model.safetensors")


def safetensors_shapes(path: str | os.PathLike) -> tuple[dict[str, list[int]], Path] | None:
    """(tensor name -> shape, the weights file named in messages) of a model directory's safetensors
    weights, from the headers only (``model.safetensors``, or every shard of
    ``model.safetensors.index.json``); None when the weights are not safetensors."""
    p = Path(path).expanduser()
    single, index = p / "model.safetensors", p / "model.safetensors.index.json"
    if single.is_file():
        return header_shapes(single), single
    if not index.is_file():
        return None
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{index}: not a readable safetensors index ({exc})") from None
    shapes: dict[str, list[int]] = {}
    for shard in shards:
        if not (p / shard).is_file():
            raise ValueError(f"{index}: shard {shard} not found")
        shapes.update(header_shapes(p / shard))
    return shapes, index


def check_config_matches_weights(path: str | os.PathLike) -> None:
    """For a Llama-like or HuBERT ``config.json`` (:data:`CHECKED_MODEL_TYPES`) over safetensors weights:
    ``num_hidden_layers`` against the layers the weights hold, ``hidden_size`` and ``vocab_size`` against
    the token embedding (HuBERT: ``hidden_size`` against the encoder's layer norm). A one-line ValueError
    naming ``config.json`` on a mismatch: a config that disagrees with its weights loads a truncated or
    partly random model. Other models and ``.bin`` weights are left to the loader's check."""
    p = Path(path).expanduser()
    cfg_file = p / MODEL_CONFIG
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{cfg_file}: not readable JSON ({exc})") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") not in CHECKED_MODEL_TYPES:
        return
    found = safetensors_shapes(p)
    if found is None:
        return
    shapes, weights = found

    def differs(key: str, value: int, holds: str) -> None:
        if isinstance(cfg.get(key), int) and cfg[key] != value:
            raise ValueError(f"{cfg_file}: {key} is {cfg[key]} but {weights.name} holds {holds}")

    layers = {int(m.group(1)) for k in shapes if (m := _LAYER.search(k))}
    if layers:
        differs("num_hidden_layers", max(layers) + 1, f"{max(layers) + 1} layers")
    embed = next((s for k, s in shapes.items() if k.endswith("embed_tokens.weight") and len(s) == 2), None)
    if embed is not None:
        differs("vocab_size", embed[0], f"a token embedding of {embed[0]} rows")
        differs("hidden_size", embed[1], f"a token embedding of width {embed[1]}")
    norm = next((s for k, s in shapes.items() if k.endswith("encoder.layer_norm.weight") and len(s) == 1), None)
    if cfg["model_type"] == "hubert" and norm is not None:
        differs("hidden_size", norm[0], f"an encoder of width {norm[0]}")


#: ``config.json`` keys that name or date a checkpoint rather than shape it (left out of :func:`config_fingerprint`).
_VOLATILE_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"})


def model_names(name_or_path: str) -> set[str]:
    """The names a model reference goes by, case-folded: the last component of a hub id or a path
    (``meta-llama/Meta-Llama-3-8B`` and ``/models/Meta-Llama-3-8B`` both give ``meta-llama-3-8b``) and,
    for a local folder, the last component of its ``config.json``'s ``_name_or_path`` (the hub id it
    was saved from)."""
    names = {Path(str(name_or_path).rstrip("/")).name.casefold()}
    config = Path(name_or_path).expanduser() / MODEL_CONFIG
    if config.is_file():
        try:
            saved_from = json.loads(config.read_text(encoding="utf-8")).get("_name_or_path")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            saved_from = None
        if isinstance(saved_from, str) and saved_from.strip():
            names.add(Path(saved_from.rstrip("/")).name.casefold())
    return names - {""}


def config_fingerprint(path: str | os.PathLike) -> str | None:
    """The ``config.json`` of a local model folder without the keys that name or date it
    (:data:`_VOLATILE_CONFIG_KEYS`), as canonical JSON; None where there is no readable one."""
    config = Path(path).expanduser() / MODEL_CONFIG
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    return json.dumps({k: v for k, v in data.items() if k not in _VOLATILE_CONFIG_KEYS}, sort_keys=True, default=str)


def same_model(a: str, b: str) -> bool:
    """Whether two model references (hub ids or local folders) name the same model: the same string,
    a shared name (:func:`model_names`: a hub id and a local copy of it), or two local folders whose
    ``config.json`` agree apart from names and versions (:func:`config_fingerprint`). The rule an
    adapter's ``base_model_name_or_path`` is held to against ``model.name_or_path`` at planning time."""
    if str(a) == str(b) or model_names(a) & model_names(b):
        return True
    fa, fb = config_fingerprint(a), config_fingerprint(b)
    return fa is not None and fa == fb
