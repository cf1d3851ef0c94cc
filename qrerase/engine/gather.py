"""The end of a sharded (FSDP2) training run: free the optimiser, check the trained shards, gather
the full state tensor by tensor to rank 0's CPU and turn the model back into a plain module there
(the save path of :func:`qrerase.engine.train_steps`; re-exported by :mod:`qrerase.engine`).

Memory: no rank holds more than its shards plus one gathered tensor at a time
(tests/integration/test_engine_placement.py measures each rank's peak against its training peak).
"""

from __future__ import annotations

import torch

__all__ = ["release_optimizer", "check_finite_sharded", "gather_to_main", "unshard", "drop"]


def release_optimizer(accelerator, optimizer, model) -> None:
    """Free the optimiser's states (Adam moments) and every gradient of ``model`` before the end of
    training gathers anything, so that the gather never coexists with them."""
    inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps it
    inner.zero_grad(set_to_none=True)
    inner.state.clear()
    model.zero_grad(set_to_none=True)
    accelerator.free_memory()


def check_finite_sharded(model, desc: str) -> None:
    """``FloatingPointError`` (one line, on every rank) when a trained (``requires_grad``) weight of
    an FSDP2-sharded ``model`` is NaN or Inf: each rank checks its own shards, then the ranks
    all-reduce (max) the count of bad weights, so that all of them stop together (collective)."""
    import torch.distributed as dist

    bad = None
    for name, p in model.named_parameters():
        local = p.to_local() if callable(getattr(p, "to_local", None)) else p
        if p.requires_grad and not bool(torch.isfinite(local.detach()).all()):
            bad = name
            break
    flag = torch.tensor([0.0 if bad is None else 1.0], device=_device_of(model))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if float(flag) > 0:
        what = f"trained weight {bad}" if bad is not None else "a trained weight (on another rank)"
        raise FloatingPointError(f"{desc}: {what} is not finite (lower the learning rate)")


def _device_of(model) -> torch.device:
    for p in model.parameters():
        local = p.to_local() if callable(getattr(p, "to_local", None)) else p
        return local.device
    return torch.device("cpu")


def gather_to_main(model) -> dict[str, torch.Tensor]:
    """The full state dict of an FSDP2-sharded ``model`` (a sub-module of the prepared root is fine)
    on global rank 0's CPU; ``{}`` on the other ranks (collective).

    ``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with
    ``StateDictOptions(full_state_dict=True, cpu_offload=True)``: the tensors are all-gathered one at
    a time, each copied to rank 0's CPU and dropped from the devices before the next, so no rank
    ever holds more than one gathered tensor beyond its shards. Keys are ``model``'s own names.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _strip_fsdp(model) -> None:
    """Make ``model`` plain again: each ``FSDP<Class>`` module gets its class back, its FSDP state and
    registry entry are removed (so that a later run may shard it again, as KGA's auxiliary models are
    once trained, and so that FSDP lets go of the shards they hold), and every hook FSDP registered on
    any module (forward and state-dict hooks, which hold its groups and shards) is removed."""
    from torch.distributed import _composable_state  # torch's module -> state table, checked by fully_shard
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY  # where fully_shard keeps them
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.__class__ = next(b for b in type(module).__bases__ if b is not FSDPModule)
            module.__dict__.pop(STATE_KEY, None)
            module.__dict__.pop(REGISTRY_KEY, None)
            _composable_state._module_state_mapping.pop(module, None)
    for module in model.modules():
        for name, hooks in list(vars(module).items()):
            if name.endswith("hooks") and isinstance(hooks, dict):
                for key in [k for k, h in hooks.items() if _from_fsdp(h)]:
                    del hooks[key]


def unshard(model, state: dict[str, torch.Tensor] | None, dtypes: dict[str, torch.dtype] | None = None) -> None:
    """Turn an FSDP2-sharded ``model`` back into a plain module (local: no communication).

    ``state``: the full state :func:`gather_to_main` returned (rank 0), whose tensors become the
    model's parameters and buffers on the CPU, cast tensor by tensor to ``dtypes[name]`` (the
    parameters' dtypes before training; others keep theirs), without copies. ``state`` ``{}`` (the
    other ranks): every parameter gets uninitialised CPU storage of its full shape (untouched pages,
    not resident; a later sharded run broadcasts rank 0's values into them, as after a sharded
    load). ``state`` None (:func:`drop`): parameters and buffers become meta tensors. Buffers outside
    ``state`` (unsharded: non-persistent ones such as rotary frequencies) move to the CPU. FSDP's
    hooks are removed, each ``FSDP<Class>`` module gets its class back, and tied weights are re-tied
    (``tie_weights``) when the model has them.
    """
    dtypes = dtypes or {}
    _strip_fsdp(model)
    for prefix, module in model.named_modules():
        for kind, table in (("param", module._parameters), ("buffer", module._buffers)):
            for leaf, value in list(table.items()):
                if value is None:
                    continue
                if state is None:
                    where = "meta"
                elif kind == "param" or callable(getattr(value, "full_tensor", None)):
                    where = "empty"
                else:
                    where = "cpu"
                table[leaf] = _plain(value, where, dtypes.get(f"{prefix}.{leaf}" if prefix else leaf, value.dtype))
    for name in list(state or ()):
        value = state.pop(name)  # the dict lets go of each tensor as the model takes it
        owner, _, leaf = name.rpartition(".")
        mod = model.get_submodule(owner) if owner else model
        value = value.to(dtypes.get(name, value.dtype))
        if leaf in mod._parameters:
            mod._parameters[leaf] = torch.nn.Parameter(value, requires_grad=mod._parameters[leaf].requires_grad)
        elif leaf in mod._buffers:
            mod._buffers[leaf] = value
    tie = getattr(model, "tie_weights", None)
    if callable(tie) and state is not None:
        tie()


def _plain(value: torch.Tensor, where: str, dtype: torch.dtype) -> torch.Tensor:
    """A plain tensor standing for a (possibly sharded) parameter or buffer ``value``: ``meta`` or
    ``empty`` (uninitialised CPU storage) of its full shape in ``dtype``, or its local value on the
    ``cpu`` (its own dtype); a Parameter stays a Parameter with its ``requires_grad``."""
    if where == "cpu":
        out = value.detach().to("cpu")
    else:
        out = torch.empty(value.shape, dtype=dtype, device="meta" if where == "meta" else "cpu")
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=value.requires_grad)
    return out


def drop(model) -> None:
    """Free a frozen model of a sharded run without gathering it: FSDP stripped (with the per-module
    FSDP states and FSDP's hooks, which hold the local shards, so that these are freed), every
    parameter and buffer a meta tensor (it is not usable afterwards)."""
    unshard(model, None)


def _from_fsdp(hook) -> bool:
    """Whether a module hook was registered by FSDP (a function or bound method of torch's fsdp package)."""
    fn = getattr(hook, "hook", hook)  # torch's _WrappedHook
    owner = getattr(fn, "__self__", None)
    where = getattr(getattr(fn, "__func__", fn), "__module__", None) or type(owner).__module__
    return ".fsdp." in f"{where}."
