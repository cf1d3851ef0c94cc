"""W' = W − λT̃_f merged into a safetensors checkpoint shard by shard, on the CPU (rule erase_merged).

Only one shard's tensors are in memory at a time (a 70B checkpoint in 5 GB shards needs ~10 GB of
host memory, no GPU): each shard is read with ``safetensors.safe_open``, the edits of the modules it
holds are applied with :func:`qrerase.method.erase.apply_updates` (same arithmetic as the in-memory
path: the product in float32, rounded once to the weight's dtype), and the shard is written under
the same name with the same metadata. Every other file of the checkpoint (config, tokenizer,
generation config, shard index) is copied unchanged. The output directory is written atomically.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..io import atomic_dir, open_safetensors
from .erase import apply_updates, check_finite_weights, non_finite_message

INDEX = "model.safetensors.index.json"
#: architectures whose linear layers are transformers ``Conv1D`` (weights stored d_in x d_out)
CONV1D_MODEL_TYPES = frozenset({"gpt2"})


def checkpoint_shards(model_dir: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint: the index's shards, or the single model.safetensors."""
    src = Path(model_dir)
    if (src / INDEX).is_file():
        weight_map = json.loads((src / INDEX).read_text(encoding="utf-8"))["weight_map"]
        return [src / name for name in sorted(set(weight_map.values()))]
    if (src / "model.safetensors").is_file():
        return [src / "model.safetensors"]
    raise FileNotFoundError(f"{src}: no model.safetensors or {INDEX} (erase_merged reads safetensors checkpoints)")


def erase_checkpoint(model_dir: str | Path, updates: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write ``model_dir`` with W' = W − U @ V for every module in ``updates`` into ``out_dir``.

    updates: module name → (U (d_out×k), V (k×d_in)), as for :func:`apply_updates`; the weight of
    module ``m`` is the tensor ``m + ".weight"`` of whichever shard holds it. Every module must be
    found (checked from the shard headers before anything is written). An edited weight that is not
    finite (a degenerate scale) is an error naming ``out_dir``, and nothing is written. Returns ``out_dir``.
    """
    from safetensors.torch import save_file

    src = Path(model_dir)
    shards = checkpoint_shards(src)
    where: dict[str, Path] = {}
    for shard in shards:
        with open_safetensors(shard, "pt") as f:
            for key in f.keys():
                where[key] = shard
    missing = [m for m in updates if f"{m}.weight" not in where]
    if missing:
        raise ValueError(f"{src}: no weight for modules {missing[:3]} in the checkpoint's safetensors files")
    config = json.loads((src / "config.json").read_text(encoding="utf-8")) if (src / "config.json").is_file() else {}
    transposed = set(updates) if config.get("model_type") in CONV1D_MODEL_TYPES else set()
    umask = os.umask(0)
    os.umask(umask)
    with atomic_dir(out_dir) as tmp:
        for item in sorted(src.iterdir()):
            if item.is_file() and item.suffix != ".safetensors":
                shutil.copyfile(item, tmp / item.name)  # a new file: the umask applies
        for shard in shards:
            with open_safetensors(shard, "pt") as f:
                metadata = f.metadata() or {"format": "pt"}
                tensors = {key: f.get_tensor(key) for key in f.keys()}
            mine = {m: u for m, u in updates.items() if where[f"{m}.weight"] == shard}
            if mine:
                apply_updates(tensors, mine, transposed=transposed & set(mine))
                check_finite_weights({f"{m}.weight": tensors[f"{m}.weight"] for m in mine}, out_dir)
            save_file(tensors, str(tmp / shard.name), metadata=metadata)
            os.chmod(tmp / shard.name, 0o666 & ~umask)  # safetensors writes 0600
            del tensors
    return Path(out_dir)


#: float dtypes of safetensors → (numpy storage dtype, largest finite value); BF16 is read as float32.
_ST_FLOATS = {
    "F64": (np.float64, np.finfo(np.float64).max),
    "F32": (np.float32, np.finfo(np.float32).max),
    "F16": (np.float16, np.finfo(np.float16).max),
    "BF16": (np.uint16, 3.3895313892515355e38),
}


def _read_tensor(shard: Path, header: dict, key: str) -> tuple[np.ndarray, float]:
    """One tensor of a safetensors file as a numpy array (BF16 widened to float32) and its dtype's
    largest finite value; numpy only (rule erase_adapter's linalg environment has no torch)."""
    info = header[key]
    if info["dtype"] not in _ST_FLOATS:
        raise ValueError(f"{shard}: tensor {key} has dtype {info['dtype']}, not a float")
    store, biggest = _ST_FLOATS[info["dtype"]]
    start, end = info["data_offsets"]
    with open(shard, "rb") as fh:
        fh.seek(8 + header["__size__"] + start)
        raw = np.frombuffer(fh.read(end - start), dtype=np.dtype(store).newbyteorder("<"))
    if info["dtype"] == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.reshape(info["shape"]), biggest


def _header(shard: Path) -> dict:
    with open(shard, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    header["__size__"] = size
    return header


def check_edited_weights(model_dir: str | Path, updates: Mapping[str, Any], out_dir: str | Path) -> None:
    """Raise ``ValueError`` naming ``out_dir`` when W − U @ V is not finite in the weight's dtype for a
    module of ``updates`` (the weights of the checkpoint ``model_dir`` read one at a time, the product
    in float32, float64 for float64 weights, as :func:`erase_checkpoint` computes it): the check of an
    erase written as an adapter, whose edited weights exist only when applied. Numpy only."""
    src = Path(model_dir)
    config = json.loads((src / "config.json").read_text(encoding="utf-8")) if (src / "config.json").is_file() else {}
    conv1d = config.get("model_type") in CONV1D_MODEL_TYPES
    left = {f"{m}.weight": m for m in updates}
    with np.errstate(over="ignore", invalid="ignore"):
        for shard in checkpoint_shards(src):
            header = _header(shard)
            for key in [k for k in header if k in left]:
                m = left.pop(key)
                w, biggest = _read_tensor(shard, header, key)
                work = np.float64 if w.dtype == np.float64 else np.float32
                U, V = (np.asarray(x, dtype=np.float64).astype(work) for x in updates[m])
                delta = U @ V
                edited = w.astype(work) - (delta.T if conv1d else delta)
                if not (np.isfinite(edited).all() and np.abs(edited).max(initial=0) <= biggest):
                    raise ValueError(non_finite_message(out_dir, f"weight {key}"))
    if left:
        missing = sorted(left.values())[:3]
        raise ValueError(f"{src}: no weight for modules {missing} in the checkpoint's safetensors files")
