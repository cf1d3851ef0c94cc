"""The training engine: HF Accelerate under every training loop of the library.

:func:`qrerase.text.training.train_steps` (fine-tuning, LoRA, the text / task / speech baselines and
speech training) runs on an :class:`accelerate.Accelerator` built here (:func:`make_accelerator`):

* **Data parallelism** is Accelerate's: one process (plain), several processes started by
  ``accelerate launch`` / ``torchrun`` (DDP; gloo on the CPU), FSDP2
  (``FullyShardedDataParallelPlugin(fsdp_version=2)``) or DeepSpeed ZeRO-3
  (``DeepSpeedPlugin(zero_stage=3)``), chosen by ``backend`` (:data:`BACKENDS`).
* **Global batch** = the configured ``batch_size``: each optimiser step's payload is split into
  ``world_size × accumulation`` micro-batches of at most ``micro_batch_size`` examples
  (:func:`micro_plan`, :func:`chunk`); rank ``r`` takes the ``r``-th contiguous group of them and
  accumulates their gradients; the engine all-reduces (mean) the gradients across ranks, so every
  micro-batch loss is scaled by ``world_size`` and the micro-batch losses of a step must *sum* to
  the full-batch loss (each training function supplies such a split).
* **Mixed precision**: a bf16 / fp16 model is trained in float32 (master weights and optimiser
  states in float32) under Accelerate's autocast in the model's dtype, and cast back at the end.
* **The loss runs inside the wrapped module**: :class:`LossModule` holds the trained model as a
  sub-module and its ``forward(thunk)`` evaluates a loss thunk, so DDP's / FSDP's forward hooks see
  every forward pass, whatever model entry point the loss calls (e.g. the decoder and the LM head
  separately).
* **Resumable**: :func:`resuming` sets the directory under which ``train_steps`` keeps Accelerate
  checkpoints (``save_state`` / ``load_state``: weights, optimiser, scheduler, RNG states, step),
  each with a checksum manifest checked on load (:func:`check_state`), the newest
  :data:`KEEP_STATES` kept, and only for a run of the same identity (:func:`run_identity`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "BACKENDS",
    "world_size",
    "micro_plan",
    "chunk",
    "make_accelerator",
    "LossModule",
    "resuming",
    "current_resume_dir",
    "full_state",
    "example_mean_split",
    "Progress",
    "KEEP_STATES",
    "STATE_MANIFEST",
    "save_state",
    "load_latest",
    "check_state",
    "write_state_manifest",
    "run_identity",
    "accumulate",
    "set_checkpointing",
]

#: Multi-process engines: ``ddp`` (Accelerate's DDP; the only one with one process), ``fsdp``
#: (FSDP2: parameters, gradients and optimiser states sharded, layers of ``_no_split_modules``
#: wrapped), ``deepspeed`` (ZeRO-3; needs the ``deepspeed`` package).
BACKENDS = ("ddp", "fsdp", "deepspeed")

_RESUME: contextvars.ContextVar[str | None] = contextvars.ContextVar("qrerase_resume_dir", default=None)


def world_size() -> int:
    """Number of processes of this job (``WORLD_SIZE`` set by ``accelerate launch`` / ``torchrun``; 1 otherwise)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def micro_plan(batch_size: int, micro_batch_size: int | None, world: int) -> tuple[int, int]:
    """``(micro_batch_size, accumulation)`` for a global ``batch_size`` over ``world`` processes.

    ``micro_batch_size`` None means ``ceil(batch_size / world)`` (one micro-batch per rank);
    ``accumulation = ceil(batch_size / (world · micro))`` micro-batches per rank and step, so that
    ``world · accumulation · micro >= batch_size`` with equality when ``world · micro`` divides it.
    A step's payload is split into ``world · accumulation`` near-equal parts (:func:`chunk`).
    """
    if batch_size < 1 or world < 1:
        raise ValueError(f"micro_plan: batch_size ({batch_size}) and world size ({world}) must be >= 1")
    micro = math.ceil(batch_size / world) if micro_batch_size is None else int(micro_batch_size)
    if micro < 1:
        raise ValueError(
            f"training config: 'micro_batch_size' must be an integer >= 1 or null, got {micro_batch_size!r}"
        )
    micro = min(micro, math.ceil(batch_size / world))
    return micro, math.ceil(batch_size / (world * micro))


def chunk(items: Sequence, parts: int) -> list[tuple[Any, bool]]:
    """Split ``items`` (a list or 1-D array of example indices) into ``parts`` contiguous near-equal
    pieces, in order: ``[(piece, live), ...]``. A piece that would be empty (fewer items than parts,
    e.g. an epoch's last batch) is ``(items[:1], False)``: a padding micro-batch whose loss the
    caller scales by 0, so that every rank runs the same forward/backward passes."""
    if parts < 1 or len(items) == 0:
        raise ValueError(f"chunk: need parts >= 1 and a non-empty batch (got parts={parts}, {len(items)} items)")
    bounds = _bounds(len(items), parts)
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out.append((items[a:b], True) if b > a else (items[:1], False))
    return out


def example_mean_split(loss_of: Callable[[Any], tuple[torch.Tensor, Any]]):
    """The micro-batch split of a loss that is a mean over the examples of an index batch.

    ``loss_of(idx)`` returns ``(mean loss over idx, terms)``; the returned ``split(idx, parts)``
    gives one thunk per :func:`chunk` piece with loss ``loss_of(piece) · |piece| / |idx|`` (0 for a
    padding piece), so the thunks' losses sum to ``loss_of(idx)`` and so do their gradients.
    """

    def split(idx, parts: int):
        n = len(idx)
        return [
            (lambda sub=sub, w=(len(sub) / n if live else 0.0): _scaled(loss_of(sub), w))  # noqa: B008 - binds w
            for sub, live in chunk(idx, parts)
        ]

    return split


def _scaled(result, weight: float):
    loss, terms = result
    return loss * weight, terms


def _bounds(n: int, parts: int) -> list[int]:
    base, extra = divmod(n, parts)
    sizes = [base + (1 if i < extra else 0) for i in range(parts)]
    return [0] + list(np.cumsum(sizes).tolist())


def _reset_accelerate_state() -> None:
    """Accelerate keeps one process-wide state; each training run builds its own Accelerator
    (mixed precision and plugins differ between runs of one process, e.g. KGA's auxiliaries)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def _mixed_precision(dtype: torch.dtype, device: torch.device) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16" if device.type == "cuda" else "bf16"  # fp16 autocast + loss scaling need a GPU
    return "no"


def make_accelerator(backend: str, dtype: torch.dtype, device: torch.device, layer_classes: Sequence[str] = ()):
    """An :class:`accelerate.Accelerator` for one training run.

    ``backend`` (:data:`BACKENDS`) matters only with several processes; ``dtype`` is the model's
    configured dtype (bf16 / fp16 → that autocast with float32 master weights; float32 → none);
    ``device`` the model's device (CPU: ``cpu=True``, gloo between processes); ``layer_classes`` the
    module class names FSDP2 wraps one by one (the model's ``_no_split_modules``).
    """
    from accelerate import Accelerator

    if backend not in BACKENDS:
        raise ValueError(f"training config: 'backend' must be one of {list(BACKENDS)}, got {backend!r}")
    _reset_accelerate_state()
    kwargs: dict[str, Any] = {
        "mixed_precision": _mixed_precision(dtype, device),
        "cpu": device.type == "cpu",
        "step_scheduler_with_optimizer": False,
    }
    if world_size() > 1 and backend == "ddp":  # a loss may leave parameters unused (e.g. HuBERT's masked_spec_embed)
        from accelerate.utils import DistributedDataParallelKwargs

        kwargs["kwargs_handlers"] = [DistributedDataParallelKwargs(find_unused_parameters=True)]
    if world_size() > 1 and backend == "fsdp":
        from accelerate import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            reshard_after_forward=True,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=list(layer_classes) or None,
            state_dict_type="FULL_STATE_DICT",
            cpu_ram_efficient_loading=False,
        )
    elif world_size() > 1 and backend == "deepspeed":
        try:
            import deepspeed  # noqa: F401  (only checks that it is installed)
        except ImportError as err:
            raise ValueError(
                "training config: backend 'deepspeed' needs the 'deepspeed' package (pip install deepspeed)"
            ) from err
        from accelerate import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(
            zero_stage=3, gradient_accumulation_steps=1, zero3_save_16bit_model=False, zero3_init_flag=False
        )
    accelerator = Accelerator(**kwargs)
    if "fsdp_plugin" in kwargs and not accelerator.is_fsdp2:
        # Accelerate turns FSDP on only for accelerator devices; FSDP2 itself (``fully_shard``) runs on
        # CPU tensors over gloo, which is how this path is exercised without a GPU.
        from accelerate.utils import DistributedType

        accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = kwargs["fsdp_plugin"]
    return accelerator


class LossModule(torch.nn.Module):
    """The module the engine wraps: the trained ``model`` as a sub-module, ``forward(thunk)`` = ``thunk()``.

    A loss thunk (a zero-argument callable returning ``(loss, terms)``) calls ``model`` (or parts
    of it) directly; running it inside this module's forward lets DDP prepare its gradient
    all-reduce and FSDP2 gather the root's parameters, and puts the whole loss under autocast.
    ``frozen``: models the loss also evaluates (a reference model, KGA's auxiliaries), held as
    sub-modules so that FSDP2 shards them like the trained model (DDP leaves frozen parameters alone).
    """

    def __init__(self, model: torch.nn.Module, frozen: Sequence[torch.nn.Module] = ()):
        super().__init__()
        self.model = model
        self.frozen = torch.nn.ModuleList(frozen)  # frozen references: sharded with the model under FSDP2

    def forward(self, thunk: Callable[[], tuple[torch.Tensor, Any]]):
        loss, terms = thunk()
        return loss, terms


def layer_classes(model) -> list[str]:
    """Class names FSDP2 wraps separately: the (PEFT-unwrapped) model's ``_no_split_modules``."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return list(getattr(base, "_no_split_modules", None) or [])


def full_state(model) -> dict[str, torch.Tensor]:
    """Full (unsharded) parameters and buffers of ``model`` on every rank (DTensors gathered)."""
    out = {}
    for name, t in model.state_dict().items():
        full = getattr(t, "full_tensor", None)
        out[name] = full() if callable(full) else t
    return out


@contextlib.contextmanager
def resuming(directory: str | os.PathLike | None) -> Iterator[None]:
    """Within the block, training runs keep resumable checkpoints under ``directory/<desc>``
    (``desc``: the run's name, so several runs of one job do not collide); ``None``: off. When the
    block ends without an exception (the job's outputs are written), rank 0 removes ``directory``;
    after an exception it is kept for the restarted job."""
    token = _RESUME.set(None if directory is None else str(directory))
    try:
        yield
    finally:
        _RESUME.reset(token)
    if directory is not None and int(os.environ.get("RANK", "0")) == 0:  # the block succeeded: outputs written
        shutil.rmtree(directory, ignore_errors=True)
        for parent in Path(directory).parents:  # empty <rule>/ and .resume/ too
            if parent.name in ("", ".", "..") or parent.parent == parent:
                break
            try:
                parent.rmdir()
            except OSError:
                break
            if parent.name == ".resume":
                break


def current_resume_dir(desc: str) -> Path | None:
    """The resume directory of the run named ``desc`` inside :func:`resuming` (else ``None``)."""
    root = _RESUME.get()
    if root is None:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in desc) or "run"
    return Path(root) / safe


def unshard(model) -> None:
    """Turn an FSDP2-sharded ``model`` back into a plain module on every rank (collective).

    Every parameter and buffer becomes a plain tensor holding the full value (gathered from the
    shards), FSDP's forward hooks are removed and each ``FSDP<Class>`` module gets its class back.
    """
    from torch.distributed.fsdp import FSDPModule

    full = full_state(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.__class__ = next(b for b in type(module).__bases__ if b is not FSDPModule)
            for hooks in (module._forward_pre_hooks, module._forward_hooks):
                for key in [
                    k for k, h in hooks.items() if "fsdp" in type(getattr(h, "__self__", None)).__module__.lower()
                ]:
                    del hooks[key]
    for name, value in full.items():
        owner, _, leaf = name.rpartition(".")
        mod = model.get_submodule(owner) if owner else model
        if leaf in mod._parameters:
            old = mod._parameters[leaf]
            mod._parameters[leaf] = torch.nn.Parameter(value.detach().clone(), requires_grad=old.requires_grad)
        elif leaf in mod._buffers:
            mod._buffers[leaf] = value.detach().clone()


def accumulate(accelerator, wrapped, thunks, world: int):
    """Forward/backward of this rank's micro-batch thunks with gradient accumulation (the engine's
    all-reduce only after the last one); returns (summed loss over all ranks, mean terms)."""
    total = torch.zeros((), dtype=torch.float64)
    sums: dict[str, float] = {}
    for j, thunk in enumerate(thunks):
        sync = j == len(thunks) - 1
        with contextlib.nullcontext() if sync else accelerator.no_sync(wrapped):
            loss, terms = wrapped(thunk)
            accelerator.backward(loss * world if world > 1 else loss)
        total += float(loss.detach())
        for k, v in terms.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    keys = sorted(sums)
    vec = torch.tensor([float(total)] + [sums[k] / len(thunks) for k in keys], dtype=torch.float64)
    if world > 1:
        vec = accelerator.reduce(vec.to(accelerator.device), reduction="sum").cpu()
        vec[1:] /= world
    return float(vec[0]), {k: float(v) for k, v in zip(keys, vec[1:].tolist())}


def set_checkpointing(model, on: bool) -> None:
    """Turn activation (gradient) checkpointing of ``model`` (or a PEFT model's base) on or off."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5 (the old names are deprecated)
        enable, disable, key = (
            base.activation_checkpointing_enable,
            base.activation_checkpointing_disable,
            "activation_checkpointing_kwargs",
        )
    elif hasattr(base, "gradient_checkpointing_enable"):
        enable, disable, key = (
            base.gradient_checkpointing_enable,
            base.gradient_checkpointing_disable,
            "gradient_checkpointing_kwargs",
        )
    else:
        raise ValueError(f"training config: 'gradient_checkpointing' is not supported by {type(base).__name__}")
    if on:
        enable(**{key: {"use_reentrant": False}})
    else:
        disable()


class Progress:
    """The loop's own resumable state: steps done and the loss-curve rows so far."""

    def __init__(self):
        self.step, self.rows = 0, []

    def state_dict(self):
        return {"step": self.step, "rows": list(self.rows)}

    def load_state_dict(self, state):
        self.step, self.rows = int(state["step"]), list(state["rows"])


#: Complete resumable states kept per run: a new state is written in full (checksums last) before
#: the older ones beyond this count are removed, so a state found corrupt leaves one to fall back on.
KEEP_STATES = 2

#: The checksum manifest inside each saved state (``sha256  relative/path`` per file), written last.
STATE_MANIFEST = "checksums.sha256"

#: The run-identity file inside a run's resume directory (:func:`run_identity`'s digest).
RUN_IDENTITY = "run.json"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _state_files(state: Path) -> list[str]:
    return sorted(p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file() and p.name != STATE_MANIFEST)


def write_state_manifest(state: str | os.PathLike) -> Path:
    """Write ``state/checksums.sha256`` (the sha256 of every other file of the state folder),
    atomically (temporary name, then renamed): a state without it is incomplete."""
    state = Path(state)
    lines = [f"{_sha256_file(state / rel)}  {rel}\n" for rel in _state_files(state)]
    tmp = state / f".{STATE_MANIFEST}.tmp"
    tmp.write_text("".join(lines), encoding="utf-8")
    os.replace(tmp, state / STATE_MANIFEST)
    return state / STATE_MANIFEST


def check_state(state: str | os.PathLike) -> str | None:
    """``None`` when every file of the saved state matches ``checksums.sha256`` (and no file is
    missing or unlisted), else one line saying which file fails and how."""
    state = Path(state)
    manifest = state / STATE_MANIFEST
    if not manifest.is_file():
        return f"{manifest.name} is missing (state incomplete)"
    recorded: dict[str, str] = {}
    for line in manifest.read_text(encoding="utf-8").splitlines():
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64:
            return f"{manifest.name} is malformed"
        recorded[rel] = digest
    for rel in _state_files(state):
        if rel not in recorded:
            return f"{rel} is not in {manifest.name}"
    for rel, digest in recorded.items():
        path = state / rel
        if not path.is_file():
            return f"{rel} is missing"
        now = _sha256_file(path)
        if now != digest:
            return f"{rel} fails its checksum (sha256 recorded {digest[:12]}…, now {now[:12]}…)"
    return None


def _fingerprint(obj: Any, digest) -> None:
    """Feed a stable description of a step payload (ints, strings, index lists, tensors) to ``digest``."""
    if isinstance(obj, torch.Tensor):
        digest.update(f"T{obj.dtype}{tuple(obj.shape)}".encode())
        if obj.device.type != "meta":
            digest.update(obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        digest.update(f"A{obj.dtype}{obj.shape}".encode() + np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (list, tuple)):
        digest.update(b"[")
        for item in obj:
            _fingerprint(item, digest)
        digest.update(b"]")
    elif isinstance(obj, dict):
        digest.update(b"{")
        for key in sorted(obj, key=str):
            _fingerprint(key, digest)
            _fingerprint(obj[key], digest)
        digest.update(b"}")
    elif obj is None or isinstance(obj, (bool, int, float, str, np.generic)):
        digest.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:  # an object whose repr may hold its address: its type only
        digest.update(f"<{type(obj).__module__}.{type(obj).__qualname__}>;".encode())


def weights_fingerprint(model, digest, sample: int = 4096) -> None:
    """Feed ``model``'s state (names, shapes, dtypes and a strided sample of at most ``sample`` values
    per tensor) to ``digest``: cheap at any size, and different for a different starting model."""
    for name, t in model.state_dict().items():
        digest.update(f"{name}{t.dtype}{tuple(t.shape)};".encode())
        if t.device.type == "meta" or t.numel() == 0 or callable(getattr(t, "full_tensor", None)):
            continue
        flat = t.detach().reshape(-1)
        picked = flat[:: max(1, flat.numel() // sample)][:sample]
        digest.update(picked.float().cpu().numpy().tobytes())


def run_identity(settings: Any, steps: Sequence, model) -> str:
    """sha256 (hex) of what determines one training run: ``settings`` (JSON-able: hyperparameters,
    seed, engine settings, process count), the step payloads and the starting model's weights
    (:func:`weights_fingerprint`). A saved state is resumed only by a run with the same identity."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    _fingerprint(list(steps), digest)
    weights_fingerprint(model, digest)
    return digest.hexdigest()


def save_state(accelerator, resume: Path, step: int) -> None:
    """Accelerate ``save_state`` into ``resume/step-N``: written under a temporary name with its
    checksum manifest last (:func:`write_state_manifest`), then renamed; then all but the newest
    :data:`KEEP_STATES` states (and leftover temporaries) are removed."""
    tmp = resume / f".tmp-step-{step}"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_state_manifest(tmp)
        os.replace(tmp, resume / f"step-{step}")
        for old in _states(resume)[KEEP_STATES:]:
            shutil.rmtree(old, ignore_errors=True)
        for left in resume.glob(".tmp-step-*"):
            shutil.rmtree(left, ignore_errors=True)
    accelerator.wait_for_everyone()


def _states(resume: Path) -> list[Path]:
    """The saved ``resume/step-N`` folders, newest first."""
    found = [(int(p.name[5:]), p) for p in resume.glob("step-*") if p.name[5:].isdigit() and p.is_dir()]
    return [p for _, p in sorted(found, reverse=True)]


def load_latest(accelerator, resume: Path, identity: str | None = None) -> Path | None:
    """Accelerate ``load_state`` of the newest ``resume/step-N`` that passes its checksums
    (:func:`check_state`); returns it, or ``None`` (a fresh start).

    With ``identity`` (:func:`run_identity`), states saved by a run of another identity (a changed
    hyperparameter, seed, data order or starting model) are removed, never loaded, and the identity
    is recorded in ``resume/run.json``. A state that fails its check is logged (one line naming the
    file) and removed; the next older one is tried, else training starts over, as the log says.
    """
    log = logging.getLogger("qrerase")
    main = accelerator.is_main_process
    if identity is not None:
        stamp = resume / RUN_IDENTITY
        try:
            recorded = json.loads(stamp.read_text(encoding="utf-8")).get("identity")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded != identity:
            if _states(resume):
                log.warning(
                    "resume states in %s are of a different run (settings, data order or starting model "
                    "changed): not loaded, removed; starting over",
                    resume,
                )
            accelerator.wait_for_everyone()
            if main:
                shutil.rmtree(resume, ignore_errors=True)
                resume.mkdir(parents=True, exist_ok=True)
                tmp = resume / f".{RUN_IDENTITY}.tmp"
                tmp.write_text(json.dumps({"identity": identity}) + "\n", encoding="utf-8")
                os.replace(tmp, stamp)
            accelerator.wait_for_everyone()
    states = _states(resume)
    good, bad = None, []
    for i, state in enumerate(states):
        problem = check_state(state)
        if problem is None:
            good = state
            break
        bad.append(state)
        then = f"falling back to {states[i + 1].name}" if i + 1 < len(states) else "starting over"
        log.warning("resume state %s is corrupt: %s; removed, %s", state, problem, then)
    accelerator.wait_for_everyone()
    if main:
        for state in bad:
            shutil.rmtree(state, ignore_errors=True)
    accelerator.wait_for_everyone()
    if good is None:
        return None
    try:
        accelerator.load_state(str(good))
    except Exception as exc:  # passed its checksums, yet not loadable: not this code's state
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise RuntimeError(
            f"{good}: resume state cannot be loaded ({type(exc).__name__}: {first}); delete {resume} to start over"
        ) from exc
    log.info("resumed training from %s", good)
    return good
