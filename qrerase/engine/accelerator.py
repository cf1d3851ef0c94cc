"""The training engine: HF Accelerate under every training loop of the library.

:func:`qrerase.engine.train_steps` (fine-tuning, LoRA, the text / task / speech baselines and
speech training) runs on an :class:`accelerate.Accelerator` built here (:func:`make_accelerator`):

* **Data parallelism** is Accelerate's: one process (plain), several processes started by
  ``accelerate launch`` / ``torchrun`` (DDP; gloo on the CPU) or FSDP2
  (``FullyShardedDataParallelPlugin(fsdp_version=2)``), chosen by ``backend`` (:data:`BACKENDS`).
  DeepSpeed is not a backend (removed until it can be tested: docs/training-engine.md).
* **Global batch** = the configured ``batch_size``: each optimiser step's payload is split into
  ``world_size × accumulation`` micro-batches of at most ``micro_batch_size`` examples
  (:func:`micro_plan`, :func:`chunk`); rank ``r`` takes the ``r``-th contiguous group of them and
  accumulates their gradients; the engine all-reduces (mean) the gradients across ranks, so every
  micro-batch loss is scaled by ``world_size`` and the micro-batch losses of a step must *sum* to
  the full-batch loss (each training function supplies such a split).
* **Placement**: a launched worker works on its own GPU, ``cuda:LOCAL_RANK``
  (:func:`qrerase.engine.placement.resolve_device`, :func:`training_device`). A model trained sharded
  (:func:`sharded`: FSDP2 over several processes) is read by rank 0 alone and built with empty
  storage on the other ranks (:func:`qrerase.text.models.load_model` ``sharded``); FSDP2's
  preparation (Accelerate's ``cpu_ram_efficient_loading``) shards it onto the devices and broadcasts
  rank 0's weights tensor by tensor. So are frozen models needed only before the first step (π_ref
  of NPO / DPO): the loop's prelude evaluates them after preparation, then they are dropped
  (:func:`run_prelude`, :class:`PreludeModule`).
* **Mixed precision**: a bf16 / fp16 model trains its trainable parameters in float32 (master
  weights and optimiser states) under Accelerate's autocast in the model's dtype, frozen weights
  (a LoRA base) stay in that dtype; trained weights are cast back at the end. Under FSDP2 the
  explicit policy :func:`mixed_precision_policy` gathers parameters in that dtype and reduces
  gradients in float32.
* **Saving without spikes** (FSDP2): at the end the optimiser is freed first, then the trained
  model's full state is gathered tensor by tensor to rank 0's CPU (:func:`gather_to_main`: torch's
  ``get_model_state_dict`` with ``full_state_dict`` and ``cpu_offload``), frozen models are dropped
  without being gathered, and :func:`unshard` leaves rank 0 a plain CPU model (the one that writes)
  and the other ranks the same module with empty storage.
* **The loss runs inside the wrapped module**: :class:`LossModule` holds the trained model as a
  sub-module and its ``forward(thunk)`` evaluates a loss thunk, so DDP's / FSDP's forward hooks see
  every forward pass, whatever model entry point the loss calls (e.g. the decoder and the LM head
  separately).
* **Resumable**: :func:`resuming` sets the directory under which ``train_steps`` keeps Accelerate
  checkpoints (``save_state`` / ``load_state``: weights, optimiser, scheduler, RNG states, step),
  each with a checksum manifest checked on load (:func:`check_state`), the newest
  :data:`KEEP_STATES` kept, and only for a run of the same identity (:func:`run_identity`). Under
  FSDP2 with several processes a state is sharded (one ``torch.distributed.checkpoint`` file per
  rank); a state holds the trained parameters and their optimiser state only
  (:func:`qrerase.engine.resume.save_trained`: frozen weights are read again from the job's inputs).
* **Process-group timeout**: ``dist_timeout_min`` (:func:`make_accelerator` ``timeout_min``).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..hparams import BACKENDS as _BACKENDS
from ..hparams import TrainConfig as _TrainConfig
from .gather import check_finite_sharded, drop, gather_to_main, release_optimizer, unshard
from .prelude import PreludeModule, run_prelude
from .resume import (
    KEEP_STATES,
    STATE_MANIFEST,
    check_state,
    current_resume_dir,
    load_latest,
    resuming,
    run_identity,
    save_state,
    write_state_manifest,
)

__all__ = [
    "BACKENDS",
    "DIST_TIMEOUT_MIN",
    "world_size",
    "micro_plan",
    "chunk",
    "make_accelerator",
    "LossModule",
    "PreludeModule",
    "run_prelude",
    "resuming",
    "current_resume_dir",
    "sharded",
    "training_device",
    "mixed_precision_policy",
    "release_optimizer",
    "check_finite_sharded",
    "gather_to_main",
    "unshard",
    "drop",
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
    "compute_dtype",
    "on_main",
    "set_checkpointing",
]

#: Multi-process engines: ``ddp`` (Accelerate's DDP; the only one with one process), ``fsdp``
#: (FSDP2: parameters, gradients and optimiser states sharded, layers of ``_no_split_modules``
#: wrapped). DeepSpeed was removed until it can be tested (docs/training-engine.md).
BACKENDS = _BACKENDS
#: The default process-group timeout in minutes (config ``dist_timeout_min``, :class:`qrerase.hparams.TrainConfig`).
DIST_TIMEOUT_MIN = _TrainConfig.__dataclass_fields__["dist_timeout_min"].default


def world_size() -> int:
    """Number of processes of this job (``WORLD_SIZE`` set by ``accelerate launch`` / ``torchrun``; 1 otherwise)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def sharded(backend: str) -> bool:
    """True when a run with ``backend`` shards its model: FSDP2 (``fsdp``) with several processes.
    Such a model is loaded by rank 0 alone (:func:`qrerase.text.models.load_model` ``sharded``)."""
    return backend == "fsdp" and world_size() > 1


def training_device(model) -> torch.device:
    """The device a training run works on: the model's own device with one process or when the model
    already sits on an accelerator; otherwise, in a launched worker (``WORLD_SIZE`` > 1) of a model
    left on the CPU (a sharded load), the worker's GPU ``cuda:LOCAL_RANK``
    (:func:`qrerase.engine.placement.resolve_device`) unless no GPU is visible or ``ACCELERATE_USE_CPU``
    is true (the launcher's flag for ``model.device: cpu``), which keep the CPU."""
    from .placement import model_device, resolve_device

    device = model_device(model)
    if world_size() == 1 or device.type != "cpu" or not torch.cuda.is_available():
        return device
    if os.environ.get("ACCELERATE_USE_CPU", "").strip().lower() in ("1", "true", "yes", "y", "on"):
        return device
    return resolve_device("cuda")


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
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    if "type" in _PLAIN_TYPE and PartialState._shared_state:  # undo make_accelerator's CPU FSDP override
        PartialState._shared_state["distributed_type"] = _PLAIN_TYPE.pop("type")


#: The process-wide distributed type make_accelerator replaced by FSDP for a CPU (gloo) FSDP2 run.
_PLAIN_TYPE: dict[str, Any] = {}


def _mixed_precision(dtype: torch.dtype, device: torch.device) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16" if device.type == "cuda" else "bf16"  # fp16 autocast + loss scaling need a GPU
    return "no"


def mixed_precision_policy(dtype: torch.dtype, device: torch.device):
    """The FSDP2 mixed-precision policy of a model of ``dtype`` on ``device``, or None for float32.

    ``torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=<autocast dtype>,
    reduce_dtype=torch.float32)``: the float32 master shards are all-gathered in the model's dtype
    for the forward and backward passes, and gradients are reduce-scattered in float32 (a bf16
    reduction over many ranks loses the low bits of the summed gradients). The autocast dtype is
    that of :func:`_mixed_precision` (fp16 on a GPU, bf16 otherwise).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mode = _mixed_precision(dtype, device)
    if mode == "no":
        return None
    return MixedPrecisionPolicy(
        param_dtype=torch.float16 if mode == "fp16" else torch.bfloat16, reduce_dtype=torch.float32
    )


def make_accelerator(
    backend: str,
    dtype: torch.dtype,
    device: torch.device,
    layer_classes: Sequence[str] = (),
    timeout_min: int = DIST_TIMEOUT_MIN,
):
    """An :class:`accelerate.Accelerator` for one training run.

    ``backend`` (:data:`BACKENDS`) matters only with several processes; ``dtype`` is the model's
    configured dtype (bf16 / fp16 → that autocast with float32 master weights; float32 → none);
    ``device`` the training device (:func:`training_device`; CPU: ``cpu=True``, gloo between
    processes); ``layer_classes`` the module class names FSDP2 wraps one by one (the model's
    ``_no_split_modules``). FSDP2 (Accelerate's plugin, ``fsdp_version=2``) uses
    :func:`mixed_precision_policy` and ``cpu_ram_efficient_loading``: the model is moved to the meta
    device, sharded, and rank 0's weights are broadcast into the shards tensor by tensor (the other
    ranks' values are never read, so they may hold a sharded load's empty storage); its resume
    states are sharded (:func:`qrerase.engine.resume.save_trained` through ``torch.distributed.checkpoint``,
    each rank writing and reading its own shards, no gather; ``SHARDED_STATE_DICT`` is the plugin's
    setting for any Accelerate save of the model).
    ``timeout_min`` (config ``dist_timeout_min``) is the process group's timeout
    (``InitProcessGroupKwargs``): how long a collective waits for the other ranks. It takes effect
    where the process group is created, i.e. in the job's first training run.
    """
    from datetime import timedelta

    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    if backend not in BACKENDS:
        raise ValueError(f"training config: 'backend' must be one of {list(BACKENDS)}, got {backend!r}")
    _reset_accelerate_state()
    kwargs: dict[str, Any] = {
        "mixed_precision": _mixed_precision(dtype, device),
        "cpu": device.type == "cpu",
        "step_scheduler_with_optimizer": False,
        "kwargs_handlers": [InitProcessGroupKwargs(timeout=timedelta(minutes=timeout_min))],
    }
    if world_size() > 1 and backend == "ddp":  # a loss may leave parameters unused (e.g. HuBERT's masked_spec_embed)
        from accelerate.utils import DistributedDataParallelKwargs

        kwargs["kwargs_handlers"].append(DistributedDataParallelKwargs(find_unused_parameters=True))
    if world_size() > 1 and backend == "fsdp":
        from accelerate import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            reshard_after_forward=True,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=list(layer_classes) or None,
            state_dict_type="SHARDED_STATE_DICT",  # resume states: per-rank DCP shards
            cpu_ram_efficient_loading=True,
            mixed_precision_policy=mixed_precision_policy(dtype, device),
        )
    accelerator = Accelerator(**kwargs)
    if "fsdp_plugin" in kwargs and not accelerator.is_fsdp2:
        # Accelerate turns FSDP on only for accelerator devices; FSDP2 itself (``fully_shard``) runs on
        # CPU tensors over gloo, which is how this path is exercised without a GPU.
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType

        accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = kwargs["fsdp_plugin"]
        # Every later ``AcceleratorState()`` (Accelerate's prepare makes some) copies the process-wide
        # state's type over this one; Accelerate writes FSDP there itself on a GPU, so do it here too
        # (restored by the next run's _reset_accelerate_state).
        _PLAIN_TYPE.setdefault("type", PartialState._shared_state.get("distributed_type"))
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return accelerator


class LossModule(torch.nn.Module):
    """The module the engine wraps: the trained ``model`` as a sub-module, ``forward(thunk)`` = ``thunk()``.

    A loss thunk (a zero-argument callable returning ``(loss, terms)``) calls ``model`` (or parts
    of it) directly; running it inside this module's forward lets DDP prepare its gradient
    all-reduce and FSDP2 gather the root's parameters, and puts the whole loss under autocast.
    ``frozen``: models the loss also evaluates (a reference model, KGA's auxiliaries), held as
    sub-modules so that FSDP2 shards them like the trained model (DDP leaves frozen parameters alone).
    """

    def __init__(self, model: torch.nn.Module, frozen: Sequence[torch.nn.Module] = (), prelude=None):
        super().__init__()
        self.model = model
        self.frozen = torch.nn.ModuleList(frozen)  # frozen references: sharded with the model under FSDP2
        self.prelude = prelude  # a PreludeModule (FSDP2 only): detached after the prelude, before any step

    def forward(self, thunk: Callable[[], tuple[torch.Tensor, Any]]):
        loss, terms = thunk()
        return loss, terms

    def tie_weights(self) -> None:
        """Re-tie the tied weights of the held models (Accelerate calls it around FSDP2's meta-device
        sharding, which unties them)."""
        held = (*self.frozen, *(self.prelude.models if self.prelude is not None else ()))
        for module in (self.model, *held):
            tie = getattr(module, "tie_weights", None)
            if callable(tie):
                tie()


def layer_classes(model) -> list[str]:
    """Class names FSDP2 wraps separately: the (PEFT-unwrapped) model's ``_no_split_modules``."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return list(getattr(base, "_no_split_modules", None) or [])


def compute_dtype(model) -> torch.dtype:
    """The model's dtype (the autocast dtype of its training): that of its first floating-point
    parameter, the base's for a PEFT model (LoRA adapters are float32 over a bf16 base)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def on_main(accelerator, compute: Callable[[], Any]) -> Any:
    """``compute()`` on the main process, its result sent to every process (with one process: just
    ``compute()``). A sharded load's other ranks hold empty weights, so a hash of the weights (the
    run identity) is taken where they are real."""
    if accelerator.num_processes == 1:
        return compute()
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([compute() if accelerator.is_main_process else None], from_process=0)[0]


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
