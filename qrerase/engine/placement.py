"""Where a model runs: the device of a model (:func:`model_device`), a launched worker's own GPU
(:func:`local_rank`, :func:`resolve_device`) and the ``device_map`` / ``max_memory`` of a model spread
over the visible GPUs for inference (:func:`inference_placement`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

__all__ = ["model_device", "local_rank", "resolve_device", "gpu_memory", "inference_placement"]


def model_device(model) -> torch.device:
    """The device of a model's first parameter (CPU for a parameter-less module)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def local_rank() -> int | None:
    """This process's rank on its node (``LOCAL_RANK``, set by ``accelerate launch`` / ``torchrun``);
    None for a plain ``python`` run. A one-line ValueError names the variable when it is not an integer."""
    value = os.environ.get("LOCAL_RANK", "")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable LOCAL_RANK: expected an integer, got {value!r}") from None


def resolve_device(device: str = "auto") -> torch.device:
    """The torch device of a config's ``device``, bound to this process's GPU.

    ``auto``: a CUDA GPU when one is visible, else the CPU; ``cuda`` (no index) or ``auto`` with a GPU
    in a launched worker (``LOCAL_RANK`` set): GPU ``cuda:LOCAL_RANK``, made the current CUDA device
    (``torch.cuda.set_device``) so that every later CUDA allocation of the rank (Accelerate's, NCCL's)
    lands there and not on GPU 0; without ``LOCAL_RANK``: ``cuda`` (the current device). An explicit
    ``cuda:N`` or ``cpu`` is returned as is.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    index = local_rank() if device == "cuda" else None
    if index is not None:
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"environment variable LOCAL_RANK: {index}, but this process sees {torch.cuda.device_count()} GPU(s)"
            )
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(device)


def gpu_memory() -> list[int]:
    """Total memory (bytes) of each GPU visible to this job (``CUDA_VISIBLE_DEVICES``); [] without CUDA."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]


def inference_placement(device: str, gpu_bytes: Sequence[int] | None = None, fraction: float = 0.9) -> dict:
    """``from_pretrained`` keyword arguments that spread an inference model over the job's GPUs.

    With ``device`` ``auto`` or ``cuda`` (no index) and more than one visible GPU:
    ``{"device_map": "auto", "max_memory": {i: floor(fraction * total_i)}}`` (Accelerate's balanced
    placement, bytes per GPU; ``1 - fraction`` is left for activations and the KV cache; no CPU entry,
    so a model that does not fit the GPUs fails instead of silently offloading). Otherwise ``{}``: the
    model is loaded whole and moved to :func:`resolve_device` (the CPU, one GPU, or an explicit
    ``cuda:N``). ``gpu_bytes`` defaults to :func:`gpu_memory`.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if device not in ("auto", "cuda"):
        return {}
    totals = gpu_memory() if gpu_bytes is None else list(gpu_bytes)
    if len(totals) < 2:
        return {}
    return {"device_map": "auto", "max_memory": {i: int(fraction * t) for i, t in enumerate(totals)}}
