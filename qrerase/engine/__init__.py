"""The training engine, one package: every trainer of the library runs :func:`train_steps` on it.

* :mod:`~qrerase.engine.loop`: the optimisation loop (:func:`train_steps`).
* :mod:`~qrerase.engine.accelerator`: the HF Accelerate accelerator (DDP / FSDP2, mixed precision),
  micro-batches and gradient accumulation.
* :mod:`~qrerase.engine.gather`: the end of a sharded run (the full state gathered to rank 0).
* :mod:`~qrerase.engine.prelude`: work done once after preparation (NPO / DPO's reference NLLs).
* :mod:`~qrerase.engine.resume`: resumable training states.
* :mod:`~qrerase.engine.determinism`: seeds and deterministic kernels.
* :mod:`~qrerase.engine.placement`: which device a model and a launched worker use.

docs/training-engine.md describes the engine; the names below are its public API.
"""

from __future__ import annotations

from .accelerator import (
    BACKENDS,
    DIST_TIMEOUT_MIN,
    KEEP_STATES,
    STATE_MANIFEST,
    LossModule,
    PreludeModule,
    Progress,
    accumulate,
    check_finite_sharded,
    check_state,
    chunk,
    compute_dtype,
    current_resume_dir,
    drop,
    example_mean_split,
    gather_to_main,
    layer_classes,
    load_latest,
    make_accelerator,
    micro_plan,
    mixed_precision_policy,
    on_main,
    release_optimizer,
    resuming,
    run_identity,
    run_prelude,
    save_state,
    set_checkpointing,
    sharded,
    training_device,
    unshard,
    world_size,
    write_state_manifest,
)
from .determinism import epoch_seed, set_determinism
from .loop import train_steps

__all__ = [
    "BACKENDS",
    "DIST_TIMEOUT_MIN",
    "KEEP_STATES",
    "LossModule",
    "PreludeModule",
    "Progress",
    "STATE_MANIFEST",
    "accumulate",
    "check_finite_sharded",
    "check_state",
    "chunk",
    "compute_dtype",
    "current_resume_dir",
    "drop",
    "example_mean_split",
    "gather_to_main",
    "layer_classes",
    "load_latest",
    "make_accelerator",
    "micro_plan",
    "mixed_precision_policy",
    "on_main",
    "release_optimizer",
    "resuming",
    "run_identity",
    "run_prelude",
    "save_state",
    "set_checkpointing",
    "sharded",
    "training_device",
    "unshard",
    "world_size",
    "write_state_manifest",
    "epoch_seed",
    "set_determinism",
    "train_steps",
]
