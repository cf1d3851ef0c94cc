"""A training loop's prelude: work done once after the engine's preparation and before the first
step, on every rank (π_ref's per-example NLLs of NPO / DPO), with the prepared (under FSDP2: sharded)
models, and the frozen models only it needs dropped afterwards (re-exported by :mod:`qrerase.engine`;
:func:`qrerase.engine.train_steps` ``prelude``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .gather import drop

__all__ = ["PreludeModule", "run_prelude"]


class PreludeModule(torch.nn.Module):
    """Frozen models that only a training loop's prelude evaluates (π_ref of NPO / DPO, whose NLLs
    are computed once before training), held by :class:`LossModule` under FSDP2: one FSDP unit of
    their own (their layers wrapped inside it), so that they are loaded and sharded like the trained
    model, evaluated through this module's ``forward(thunk)`` (which gathers their root parameters)
    and then detached and freed without touching the root's parameter group (:func:`run_prelude`)."""

    def __init__(self, models: Sequence[torch.nn.Module]):
        super().__init__()
        self.models = torch.nn.ModuleList(models)

    def forward(self, thunk: Callable[[], Any]):
        return thunk()


def run_prelude(prelude: Callable, root, unit, models: Sequence[torch.nn.Module], device, fsdp: bool) -> None:
    """``prelude(evaluate)`` once on this rank after preparation, then drop ``models`` (those only the
    prelude evaluates): meta device, and under FSDP2 ``unit`` with its shards freed (:func:`drop`).

    ``evaluate(fn)`` returns ``fn()`` under ``torch.no_grad``: called directly with one process or
    DDP (whole models); under FSDP2 (``fsdp``) inside the forward of ``unit`` (the
    :class:`PreludeModule` holding ``models``) or, without one, of the prepared ``root`` (the trained
    model and the kept frozen ones), so that FSDP2 gathers the sharded parameters, with autocast
    off as outside it (so the values are those of one process). Every rank must evaluate the same
    batches (the gathers are collectives). ``unit`` is detached from ``root`` before the root's first
    forward, so it is never in a resume state, the root's parameter group or the saved model."""

    def evaluate(fn: Callable[[], Any]) -> Any:
        with torch.no_grad():
            if not fsdp:
                return fn()
            out: list = []

            def thunk():
                with torch.autocast(device.type, enabled=False):
                    out.append(fn())
                return None, {}

            (unit if unit is not None else root)(thunk)
            return out[0]

    try:
        prelude(evaluate)
    finally:
        if unit is not None:  # FSDP2: detach, then free the unit's own shards and its models'
            root.prelude = None
            drop(unit)
            gc.collect()  # FSDP's states hold the shards in reference cycles
        else:
            for m in models:
                m.to("meta")
