"""Write a QR-Erase edit: merged checkpoint (eq. 6 / eq. 16) or an equivalent rank-k PEFT LoRA adapter.

Sign convention: an update is a pair (U, V) with U @ V = λ·T̃_f (see :func:`qrerase.method.discriminate.forget_update`;
λ is folded into U) and the edit SUBTRACTS it:

    W' = W − U @ V                                     (eq. 6; eq. 16 restricted to selected modules)

The same edit as a LoRA adapter (PEFT adds s·lora_B·lora_A to W) uses ``lora_B = −U``, ``lora_A = V``,
``r = k``, ``lora_alpha = k`` (s = 1); ``rank_pattern``/``alpha_pattern`` give per-module k when ranks
differ; ``target_modules`` are the exact module names. Keys follow PEFT 0.21's saved format:
``base_model.model.<module>.lora_A.weight`` (k×d_in) and ``base_model.model.<module>.lora_B.weight``
(d_out×k). Conv1D modules (GPT-2 style, weight stored d_in×d_out) take the transposed product,
W' = W − (U V)ᵀ, and their adapter says ``fan_in_fan_out: true`` (PEFT then transposes s·B·A itself).
The safetensors file is written in streaming fashion (header first, then one module at a
time), so :class:`EraseAdapterWriter` never holds more than one module's update.
"""

from __future__ import annotations

import inspect
import json
import math
import struct
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..io import atomic_dir, write_json

__all__ = [
    "as_update",
    "validate_updates",
    "apply_updates",
    "save_merged",
    "erase_adapter_config",
    "EraseAdapterWriter",
    "save_erase_adapter",
]

_ST_DTYPES = {np.dtype("float32"): "F32", np.dtype("float64"): "F64", np.dtype("float16"): "F16"}


def as_update(value: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Validate one update (U, V): U (d_out×k), V (k×d_in), finite; returned as float64 arrays."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"module {name!r}: an update must be a (U, V) pair, got {type(value).__name__}")
    U = np.asarray(value[0], dtype=np.float64)
    V = np.asarray(value[1], dtype=np.float64)
    if U.ndim != 2 or V.ndim != 2 or U.shape[1] != V.shape[0] or U.shape[1] == 0:
        raise ValueError(f"module {name!r}: update must be U (d_out×k) and V (k×d_in), got U {U.shape} and V {V.shape}")
    if not (np.isfinite(U).all() and np.isfinite(V).all()):
        raise ValueError(f"module {name!r}: update contains NaN or Inf (U {U.shape}, V {V.shape})")
    return U, V


def validate_updates(
    updates: Mapping[str, Any], shapes: Mapping[str, tuple[int, int]] | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Validate every update (and, if given, that U @ V matches ``shapes[module]``) before any write."""
    if not updates:
        raise ValueError("no updates given")
    out = {}
    for name, value in updates.items():
        U, V = as_update(value, name)
        if shapes is not None:
            if name not in shapes:
                raise ValueError(f"module {name!r}: not found in the model (no '{name}.weight')")
            want = tuple(int(s) for s in shapes[name])
            if want != (U.shape[0], V.shape[1]):
                raise ValueError(
                    f"module {name!r}: weight is {want} but the update U @ V is {(U.shape[0], V.shape[1])}"
                )
        out[name] = (U, V)
    return out


def _weights(model: Any, names: Iterable[str]) -> tuple[dict[str, Any], set[str]]:
    """Module name → its weight tensor/array (model: ``get_submodule(name).weight``; state dict:
    ``<name>.weight``), and the names whose module is a transformers ``Conv1D`` (weight d_in×d_out)."""
    out, conv1d = {}, set()
    if isinstance(model, Mapping):
        for n in names:
            if f"{n}.weight" in model:
                out[n] = model[f"{n}.weight"]
        return out, conv1d
    for n in names:
        try:
            module = model.get_submodule(n)
            w = module.weight
        except AttributeError:
            continue
        out[n] = w
        if type(module).__name__ == "Conv1D":
            conv1d.add(n)
    return out, conv1d


def apply_updates(model: Any, updates: Mapping[str, Any], transposed: Iterable[str] = ()) -> Any:
    """Merge a QR-Erase edit in place: W' = W − U @ V for every module in ``updates`` (eq. 6 / eq. 16).

    Parameters
    ----------
    model : torch.nn.Module (e.g. a transformers model) or a state dict (name → torch.Tensor / ndarray)
        The weight of module ``m`` is ``model.get_submodule(m).weight`` or ``state_dict[m + ".weight"]``,
        shape (d_out, d_in), any float dtype; for a transformers ``Conv1D`` module (GPT-2 style,
        detected on a model) or a name in ``transposed`` it is stored (d_in, d_out) and the edit is
        W' = W − (U @ V)ᵀ.
    updates : mapping module → (U, V)
        U (d_out×k), V (k×d_in) with U @ V = λ·T̃_f in the linear map's orientation (y = T x).
    transposed : module names whose weight is stored (d_in, d_out) (for state dicts of Conv1D models).

    The product is formed in float32 (float64 for float64 weights) and the result rounded once to the
    weight's dtype. All updates are validated (module exists, shapes, finiteness) before any weight is
    modified. Returns ``model``.
    """
    names = list(updates)
    weights, conv1d = _weights(model, names)
    flip = conv1d | set(transposed)
    for n, w in weights.items():
        if len(w.shape) != 2:
            raise ValueError(f"module {n!r}: weight has shape {tuple(w.shape)}, expected a 2-D (d_out×d_in) matrix")
    shapes = {n: tuple(reversed(w.shape)) if n in flip else tuple(w.shape) for n, w in weights.items()}
    checked = validate_updates(updates, shapes)
    for n, (U, V) in checked.items():
        w = weights[n]
        if n in flip:  # Conv1D: stored Wᵀ, so subtract (U V)ᵀ = Vᵀ Uᵀ
            U, V = V.T, U.T
        if isinstance(w, np.ndarray):
            work = np.float64 if w.dtype == np.float64 else np.float32
            w[...] = (w.astype(work) - U.astype(work) @ V.astype(work)).astype(w.dtype)
            continue
        import torch

        with torch.no_grad():
            work = torch.float64 if w.dtype == torch.float64 else torch.float32
            delta = torch.from_numpy(np.ascontiguousarray(U)).to(device=w.device, dtype=work) @ torch.from_numpy(
                np.ascontiguousarray(V)
            ).to(device=w.device, dtype=work)
            if w.dtype == work:
                w.sub_(delta)
            else:
                w.copy_((w.to(work) - delta).to(w.dtype))
    return model


def non_finite_message(out_dir: str | Path, what: str) -> str:
    """The one-line error of an erase whose edited weights are not finite (nothing is written)."""
    return (
        f"{out_dir}: {what} is not finite (NaN or Inf) after the erase edit: a degenerate edit "
        "(unlearn.scale too large for the weights' dtype?); nothing written"
    )


def check_finite_weights(model: Any, out_dir: str | Path) -> None:
    """Raise ``ValueError`` (one line naming ``out_dir`` and the first tensor) when a floating-point
    parameter or buffer of ``model`` (a module or a state dict) is NaN or Inf. Torch tensors are checked
    through their own methods (this module imports no torch)."""
    items = model.items() if isinstance(model, Mapping) else model.state_dict().items()
    for name, t in items:
        if isinstance(t, np.ndarray):
            bad = np.issubdtype(t.dtype, np.floating) and not np.isfinite(t).all()
        else:
            bad = t.is_floating_point() and not bool(t.isfinite().all())
        if bad:
            raise ValueError(non_finite_message(out_dir, f"weight {name}"))


def save_merged(model: Any, tokenizer: Any | None, out_dir: str | Path) -> Path:
    """``save_pretrained`` a (merged) transformers model, plus its tokenizer if given, atomically.

    A model with a non-finite weight (a degenerate edit) is an error naming ``out_dir``
    (:func:`check_finite_weights`), and nothing is written.

    Writes safetensors weights into a temporary sibling directory and renames it onto ``out_dir``.
    A PEFT-wrapped model is rejected (merge it or use :func:`save_erase_adapter`).
    """
    if type(model).__module__.split(".")[0] == "peft":
        raise ValueError(f"{out_dir}: got a PEFT model; call merge_and_unload() first or use save_erase_adapter")
    check_finite_weights(model, out_dir)
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:  # transformers < 5
        kwargs["safe_serialization"] = True
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), **kwargs)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
    return out_dir


def erase_adapter_config(
    ranks: Mapping[str, int],
    base_model_name_or_path: str | None,
    task_type: str | None = None,
    fan_in_fan_out: bool = False,
) -> dict:
    """PEFT ``adapter_config.json`` content for an erase adapter with per-module ranks ``ranks``.

    r / lora_alpha are the most common k (ties: the largest); modules with another k get
    ``rank_pattern[module] = alpha_pattern[module] = k``, so the scale is 1 everywhere.
    ``fan_in_fan_out`` is PEFT's flag for Conv1D (GPT-2 style) layers: PEFT then adds (B A)ᵀ.
    """
    counts = Counter(int(k) for k in ranks.values())
    r0 = max(counts, key=lambda k: (counts[k], k))
    pattern = {m: int(k) for m, k in ranks.items() if int(k) != r0}
    return {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model_name_or_path,
        "revision": None,
        "r": r0,
        "lora_alpha": r0,
        "rank_pattern": pattern,
        "alpha_pattern": dict(pattern),
        "target_modules": list(ranks),
        "exclude_modules": None,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": bool(fan_in_fan_out),
        "use_rslora": False,
        "use_dora": False,
        "lora_bias": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
    }


class EraseAdapterWriter:
    """Stream an erase adapter to ``out_dir`` one module at a time (atomic: all modules or nothing).

    >>> with EraseAdapterWriter(out, {"model.layers.0.mlp.up_proj": (d_out, d_in, k)}, base) as w:
    ...     w.write("model.layers.0.mlp.up_proj", U, V)

    ``shapes`` fixes the modules (in write order) and their (d_out, d_in, k); the safetensors header is
    written first, then each module's ``lora_A = V`` and ``lora_B = −U`` in ``dtype`` (float32 default).
    Leaving the block early, with an exception or with modules unwritten, leaves ``out_dir`` untouched.
    """

    def __init__(
        self,
        out_dir: str | Path,
        shapes: Mapping[str, tuple[int, int, int]],
        base_model_name_or_path: str | None,
        *,
        task_type: str | None = None,
        dtype: Any = np.float32,
        metadata: Mapping[str, str] | None = None,
        fan_in_fan_out: bool = False,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _ST_DTYPES:
            raise ValueError(f"{out_dir}: unsupported adapter dtype {self.dtype} (float32, float64 or float16)")
        if not shapes:
            raise ValueError(f"{out_dir}: no modules to write")
        self.shapes = {}
        for m, shp in shapes.items():
            d_out, d_in, k = (int(x) for x in shp)
            if min(d_out, d_in, k) <= 0:
                raise ValueError(f"module {m!r}: invalid shape (d_out={d_out}, d_in={d_in}, k={k})")
            self.shapes[m] = (d_out, d_in, k)
        self.base = base_model_name_or_path
        self.task_type = task_type
        self.fan_in_fan_out = bool(fan_in_fan_out)
        self.metadata = {"format": "pt", "qrerase": "erase-adapter", **(dict(metadata) if metadata else {})}
        self._order = list(self.shapes)
        self._next = 0
        self._ctx = None
        self._fh = None
        self.bytes_written = 0

    def _header(self) -> bytes:
        header: dict[str, Any] = {"__metadata__": {str(k): str(v) for k, v in self.metadata.items()}}
        off = 0
        item = self.dtype.itemsize
        st = _ST_DTYPES[self.dtype]
        for m in self._order:
            d_out, d_in, k = self.shapes[m]
            for key, shape in (
                (f"base_model.model.{m}.lora_A.weight", [k, d_in]),
                (f"base_model.model.{m}.lora_B.weight", [d_out, k]),
            ):
                n = math.prod(shape) * item
                header[key] = {"dtype": st, "shape": shape, "data_offsets": [off, off + n]}
                off += n
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * ((8 - len(raw) % 8) % 8)
        return struct.pack("<Q", len(raw)) + raw

    def __enter__(self) -> EraseAdapterWriter:
        self._ctx = atomic_dir(self.out_dir)
        tmp = self._ctx.__enter__()
        try:
            cfg = erase_adapter_config(
                {m: s[2] for m, s in self.shapes.items()}, self.base, self.task_type, self.fan_in_fan_out
            )
            write_json(tmp / "adapter_config.json", cfg)
            self._fh = open(tmp / "adapter_model.safetensors", "wb")
            head = self._header()
            self._fh.write(head)
            self.bytes_written = len(head)
        except BaseException as exc:
            self._abort(exc)
            raise
        return self

    def write(self, name: str, U: Any, V: Any) -> None:
        """Write module ``name``'s update (must be the next module of ``shapes``)."""
        if self._fh is None:
            raise RuntimeError("EraseAdapterWriter.write outside its with-block")
        if self._next >= len(self._order) or name != self._order[self._next]:
            expected = self._order[self._next] if self._next < len(self._order) else None
            raise ValueError(f"module {name!r}: written out of order (expected {expected!r})")
        U, V = as_update((U, V), name)
        d_out, d_in, k = self.shapes[name]
        if U.shape != (d_out, k) or V.shape != (k, d_in):
            raise ValueError(
                f"module {name!r}: declared (d_out={d_out}, d_in={d_in}, k={k}) but got U {U.shape}, V {V.shape}"
            )
        if not _product_finite(U, V, self.dtype):
            raise ValueError(non_finite_message(self.out_dir, f"the edit U V of module {name!r} in {self.dtype}"))
        le = self.dtype.newbyteorder("<")
        for arr in (V, -U):
            buf = np.ascontiguousarray(arr, dtype=le)
            self._fh.write(memoryview(buf).cast("B"))
            self.bytes_written += buf.nbytes
        self._next += 1

    def _abort(self, exc: BaseException) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(type(exc), exc, exc.__traceback__)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None and self._next != len(self._order):
            missing = self._order[self._next]
            err = ValueError(
                f"module {missing!r}: update not written "
                f"({len(self._order) - self._next} of {len(self._order)} modules missing)"
            )
            self._abort(err)
            raise err
        if exc is not None:
            self._abort(exc)
            return False
        self._fh.close()
        self._fh = None
        ctx, self._ctx = self._ctx, None
        ctx.__exit__(None, None, None)
        return False


def _product_finite(U: np.ndarray, V: np.ndarray, dtype: np.dtype, rows: int = 4096) -> bool:
    """Whether U, V and U @ V are finite in ``dtype`` (the adapter's; the product in float32 at least,
    as PEFT computes it), by blocks of ``rows`` rows."""
    work = np.promote_types(dtype, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        Uc, Vc = U.astype(dtype).astype(work), V.astype(dtype).astype(work)
        if not (np.isfinite(Uc).all() and np.isfinite(Vc).all()):
            return False
        return all(np.isfinite(Uc[i : i + rows] @ Vc).all() for i in range(0, Uc.shape[0], rows))


def save_erase_adapter(
    updates: Mapping[str, Any],
    out_dir: str | Path,
    base_model_name_or_path: str | None,
    *,
    task_type: str | None = None,
    dtype: Any = np.float32,
    fan_in_fan_out: bool = False,
) -> Path:
    """Write the edit W' = W − U @ V as a rank-k PEFT LoRA adapter directory (atomically).

    Parameters
    ----------
    updates : mapping module → (U, V), U (d_out×k), V (k×d_in)
    out_dir : path
        Receives ``adapter_config.json`` (r = lora_alpha = k, per-module rank/alpha patterns when k
        differs, ``target_modules`` = the exact module names) and ``adapter_model.safetensors``
        (``base_model.model.<module>.lora_A.weight`` = V, ``…lora_B.weight`` = −U, ``dtype``).
    base_model_name_or_path : str or None
        Recorded in the config for ``PeftModel.from_pretrained``.
    fan_in_fan_out : bool
        True for Conv1D (GPT-2 style) modules: U, V stay in the linear map's orientation and PEFT
        transposes the product (the forget adapter's own setting).

    ``PeftModel.from_pretrained(base, out_dir)`` then computes the same function as the merged
    checkpoint from :func:`apply_updates`. All updates are validated before anything is written;
    an edit U V that is not finite in ``dtype`` (a degenerate scale) is an error naming ``out_dir``,
    and nothing is written.
    """
    checked = validate_updates(updates)
    shapes = {m: (U.shape[0], V.shape[1], U.shape[1]) for m, (U, V) in checked.items()}
    with EraseAdapterWriter(
        out_dir, shapes, base_model_name_or_path, task_type=task_type, dtype=dtype, fan_in_fan_out=fan_in_fan_out
    ) as w:
        for m, (U, V) in checked.items():
            w.write(m, U, V)
    return Path(out_dir)
