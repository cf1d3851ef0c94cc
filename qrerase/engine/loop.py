"""The optimisation loop every trainer of the library runs (:func:`train_steps`): fine-tuning, LoRA,
the text, task-level and speech baselines, speech training and the robustness attacks, on the
accelerator of :mod:`qrerase.engine.accelerator`."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ..hparams import TrainConfig
from . import accelerator as engine
from .resume import check_finite_trained, training_identity

__all__ = ["train_steps"]


def _optimizer(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise ValueError("model has no trainable parameters")
    groups = [
        g
        for g in ({"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0})
        if g["params"]
    ]
    kwargs = dict(lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8)
    try:  # fused CPU/GPU kernel (torch >= 2.4): much less per-step overhead for many small tensors
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, **kwargs)


def _stops(wrapped, stop: Callable[[int], bool], step: int) -> bool:
    """``stop(step)`` run inside the wrapped module's forward, without gradients: a criterion that
    evaluates the model (KU's memorisation accuracy) sees FSDP2's gathered root parameters, as the
    loss does (:class:`qrerase.engine.LossModule`); every rank runs it."""
    with torch.no_grad():
        return bool(wrapped(lambda: (stop(step), {}))[0])


def train_steps(
    model,
    cfg: TrainConfig,
    steps: Sequence[tuple[int, Any]],
    loss_fn: Callable[[Any], tuple[torch.Tensor, Mapping[str, float]]],
    desc: str = "train",
    stop: Callable[[int], bool] | None = None,
    split: Callable[[Any, int], list] | None = None,
    optimizer: str = "adamw",
    schedule: str = "linear",
    frozen: Sequence[Any] = (),
    run_settings: Any = None,
    prelude: Callable[[Callable], None] | None = None,
    prelude_models: Sequence[Any] = (),
) -> list[dict]:
    """The optimisation loop shared by fine-tuning, LoRA and the unlearning baselines, on HF Accelerate.

    ``steps`` lists one ``(epoch, payload)`` per optimiser step (epoch 1-based); ``loss_fn(payload)``
    returns ``(loss, terms)``: the scalar to minimise and extra floats to log. Each step: AdamW
    (:func:`_optimizer`; weight decay on matrices only; ``optimizer="adam"``: plain Adam, no decay)
    with linear warmup over ``cfg.warmup_ratio`` of the steps then linear decay to 0
    (``schedule="constant"``: the peak rate throughout), gradient clipping at ``cfg.max_grad_norm``
    (``<= 0``: off). Only parameters with ``requires_grad`` are trained. Returns one dict per step:
    ``step`` (1-based), ``epoch``, ``loss`` (before the update), ``lr`` (used for that update), then
    the terms. The model is left in eval mode; a tqdm bar on stderr shows progress. ``stop(step)``,
    when given, is called after each update (model in train mode on return; inside the wrapped
    module's forward, without gradients, on every rank) and ends training early when it returns
    ``True`` (the learning-rate schedule still spans all of ``steps``).

    Engine (:mod:`qrerase.engine`): the step's global batch is split into ``world_size ×
    accumulation`` micro-batches (:func:`qrerase.engine.micro_plan` from ``cfg.batch_size`` and
    ``cfg.micro_batch_size``) by ``split(payload, parts)``, which returns ``parts`` zero-argument
    thunks whose ``(loss, terms)`` losses *sum* to ``loss_fn(payload)``'s; rank ``r`` runs thunks
    ``r·acc … (r+1)·acc − 1`` with gradient accumulation, the gradients are averaged over ranks by
    the engine (losses scaled by ``world_size``). With one part (one process, micro-batch = batch)
    ``loss_fn(payload)`` is used as is and the numbers are those of a plain PyTorch loop. A bf16 /
    fp16 model (its dtype: :func:`qrerase.engine.compute_dtype`, a LoRA model's base) trains under autocast in
    that dtype, its trainable parameters with float32 master weights and optimiser states, cast back
    to their own dtypes at the end (FSDP2: :func:`qrerase.engine.mixed_precision_policy`);
    ``cfg.gradient_checkpointing`` turns on the model's activation checkpointing;
    ``cfg.checkpoint_every`` > 0 saves a resumable Accelerate state every that many steps under
    :func:`qrerase.engine.current_resume_dir` (``desc``), from which a restarted run continues;
    the state is removed when the loop ends. On return the optimiser is freed and ``model`` holds
    the trained weights as plain tensors in their original dtypes: on every rank, except under
    FSDP2 with several processes (:func:`qrerase.engine.sharded`), where they are gathered tensor
    by tensor to rank 0's CPU (:func:`qrerase.engine.gather_to_main`; the rank that writes) and the
    other ranks' ``model`` is left with empty storage (:func:`qrerase.engine.unshard`). ``frozen``:
    frozen models the loss evaluates (a reference model), sharded with ``model`` under FSDP2 and
    dropped at the end (meta device), never gathered. The logged ``loss`` is the sum of the parts'
    losses over all ranks; the terms are the mean of the live parts' terms.

    ``prelude(evaluate)``, when given, runs once on every rank after preparation, before a resume
    state is loaded and before the first step (e.g. π_ref's NLLs of NPO / DPO): ``evaluate(fn)``
    returns ``fn()`` without gradients, under FSDP2 inside the prepared module so that every model
    can be loaded sharded (:func:`qrerase.engine.run_prelude`; ``fn`` evaluates ``prelude_models``
    when there are any, otherwise ``model`` / ``frozen``; the same batches on every rank).
    ``prelude_models``: frozen models only the prelude evaluates, sharded under FSDP2 as a unit of
    their own (:class:`qrerase.engine.PreludeModule`) and dropped after it (never in a resume state).
    A resumed run runs its prelude again on the same (reloaded) weights.

    A saved state is loaded only by a run of the same identity and only when its checksums hold
    (:func:`qrerase.engine.resume.training_identity`, with ``run_settings`` the loss's own settings). A
    non-finite loss, gradient norm or trained weight stops training (``FloatingPointError``, one line).
    """

    total = len(steps)
    warmup = int(round(cfg.warmup_ratio * total))
    if schedule not in ("linear", "constant") or optimizer not in ("adamw", "adam"):
        raise ValueError(f"{desc}: unknown schedule {schedule!r} or optimizer {optimizer!r}")

    def lr_factor(step: int) -> float:  # step = number of updates done so far
        if schedule == "constant":
            return 1.0
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    world = engine.world_size()
    _, acc = engine.micro_plan(cfg.batch_size, cfg.micro_batch_size, world)
    parts = world * acc
    if parts > 1 and split is None:
        raise ValueError(
            f"{desc}: this loss cannot be split into micro-batches; set micro_batch_size to batch_size "
            f"({cfg.batch_size}) and run one process"
        )
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not trained:
        raise ValueError("model has no trainable parameters")
    dtype = engine.compute_dtype(model)
    dtypes = {n: p.dtype for n, p in trained.items()}  # restored at the end
    fsdp = engine.sharded(cfg.backend)
    unit = engine.PreludeModule(prelude_models) if fsdp and prelude is not None and prelude_models else None
    classes = engine.layer_classes(model) + ([type(unit).__name__] if unit is not None else [])  # its own unit
    accelerator = engine.make_accelerator(
        cfg.backend, dtype, engine.training_device(model), classes, cfg.dist_timeout_min
    )
    rank = accelerator.process_index
    identity = None
    if cfg.checkpoint_every > 0 and engine.current_resume_dir(desc) is not None:  # before any dtype change
        run = {"desc": desc, "steps": total, "optimizer": optimizer, "schedule": schedule, "world": world}
        identity = engine.on_main(
            accelerator,
            lambda: training_identity(
                cfg, {**run, "parts": parts}, steps, model, [*frozen, *prelude_models], run_settings
            ),
        )
    for p in trained.values():  # float32 master weights (and so float32 gradients and optimiser states)
        if p.dtype != torch.float32:
            p.data = p.data.float()
    if cfg.gradient_checkpointing:
        engine.set_checkpointing(model, True)
    opt = _optimizer(model, cfg) if optimizer == "adamw" else _adam(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    wrapped, opt = accelerator.prepare(
        engine.LossModule(model, frozen, unit), opt
    )  # FSDP2: shards, remaps the optimiser
    if prelude is not None:
        engine.run_prelude(prelude, wrapped, unit, prelude_models, accelerator.device, fsdp)
    params = [p for g in opt.param_groups for p in g["params"]]
    sharded = any(callable(getattr(p, "full_tensor", None)) for p in params)  # FSDP2 DTensors
    if sharded:  # in the module's order: Accelerate's FSDP clip_grad_norm_ compares this list with the
        mine = {id(p) for p in params}  # module's parameters (another order compares tensors and fails)
        params = [p for p in wrapped.parameters() if id(p) in mine]
    progress = engine.Progress()
    accelerator.register_for_checkpointing(scheduler, progress)
    resume = engine.current_resume_dir(desc) if cfg.checkpoint_every > 0 else None
    if resume is not None:
        engine.load_latest(accelerator, resume, identity)
    rows = progress.rows
    model.train()
    bar = tqdm(
        total=total,
        initial=progress.step,
        desc=desc,
        file=sys.stderr,
        mininterval=1.0,
        dynamic_ncols=True,
        leave=False,
        disable=not accelerator.is_main_process,
    )
    try:
        for step, (epoch, payload) in enumerate(steps, start=1):
            if step <= progress.step:
                continue
            if parts == 1:
                loss, terms = wrapped(lambda payload=payload: loss_fn(payload))
                opt.zero_grad(set_to_none=True)
                accelerator.backward(loss)
                value = float(loss.detach())
            else:
                opt.zero_grad(set_to_none=True)
                value, terms = engine.accumulate(
                    accelerator, wrapped, split(payload, parts)[rank * acc : (rank + 1) * acc], world
                )
            if not math.isfinite(value):
                raise FloatingPointError(f"{desc}: loss is {value} at step {step} (lower the learning rate)")
            clip = cfg.max_grad_norm if cfg.max_grad_norm and cfg.max_grad_norm > 0 else math.inf
            norm = accelerator.clip_grad_norm_(params, clip)  # max inf: the norm only (gradients × 1)
            norm = norm.full_tensor() if callable(getattr(norm, "full_tensor", None)) else norm  # FSDP2
            if norm is not None and not math.isfinite(float(norm)):
                raise FloatingPointError(
                    f"{desc}: gradient norm is {float(norm)} at step {step} (lower the learning rate)"
                )
            lr = opt.param_groups[0]["lr"]
            opt.step()
            scheduler.step()
            rows.append(
                {
                    "step": step,
                    "epoch": int(epoch),
                    "loss": value,
                    "lr": float(lr),
                    **{k: float(v) for k, v in terms.items()},
                }
            )
            progress.step = step
            bar.update(1)
            if step % 10 == 0 or step == total:
                bar.set_postfix(epoch=epoch, loss=f"{value:.3f}", refresh=False)
            if stop is not None and _stops(wrapped, stop, step):
                break
            if resume is not None and step % cfg.checkpoint_every == 0 and step < total:
                engine.save_state(accelerator, resume, step)
    finally:
        bar.close()
        model.eval()
    if resume is not None:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(resume, ignore_errors=True)
    engine.release_optimizer(accelerator, opt, model)
    del opt, scheduler, params
    if sharded:
        engine.check_finite_sharded(model, desc)
        for m in frozen:  # references are dropped, never gathered
            engine.drop(m)
        engine.unshard(model, engine.gather_to_main(model), dtypes)
    else:
        check_finite_trained(model, desc)
        for name, p in model.named_parameters():
            if name in dtypes and p.dtype != dtypes[name]:
                p.data = p.data.to(dtypes[name])
    if cfg.gradient_checkpointing:
        engine.set_checkpointing(model, False)
    return rows


def _adam(model, cfg: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.Adam(params, lr=cfg.lr)
