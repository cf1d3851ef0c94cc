"""Resumable training states: where a run keeps them, what they hold, and when one may be loaded.

:func:`resuming` sets the directory under which :func:`qrerase.engine.train_steps` keeps
resumable states: the trained parameters and their optimiser states (:func:`save_trained`,
``torch.distributed.checkpoint``, frozen parameters left out) and Accelerate's ``save_state`` of the
rest (scheduler, RNG states, step). Each state carries a checksum manifest (:data:`STATE_MANIFEST`)
written last and checked on load (:func:`check_state`); the newest :data:`KEEP_STATES` are kept, so a
state found corrupt leaves one to fall back on; and a run only loads states written by a run of the same identity
(:func:`run_identity`: its settings, steps and starting weights), others are removed. The training
engine (:mod:`qrerase.engine`) re-exports these names.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io import hash_file

__all__ = [
    "training_identity",
    "check_finite_trained",
    "resuming",
    "current_resume_dir",
    "KEEP_STATES",
    "STATE_MANIFEST",
    "RUN_IDENTITY",
    "write_state_manifest",
    "check_state",
    "weights_fingerprint",
    "run_identity",
    "save_state",
    "load_latest",
    "save_trained",
    "load_trained",
    "TRAINED_STATE",
]

_RESUME: contextvars.ContextVar[str | None] = contextvars.ContextVar("qrerase_resume_dir", default=None)


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


#: Complete resumable states kept per run: a new state is written in full (checksums last) before
#: the older ones beyond this count are removed, so a state found corrupt leaves one to fall back on.
KEEP_STATES = 2

#: The checksum manifest inside each saved state (``sha256  relative/path`` per file), written last.
STATE_MANIFEST = "checksums.sha256"

#: The run-identity file inside a run's resume directory (:func:`run_identity`'s digest).
RUN_IDENTITY = "run.json"


def _state_files(state: Path) -> list[str]:
    return sorted(p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file() and p.name != STATE_MANIFEST)


def write_state_manifest(state: str | os.PathLike) -> Path:
    """Write ``state/checksums.sha256`` (the sha256 of every other file of the state folder),
    atomically (temporary name, then renamed): a state without it is incomplete."""
    state = Path(state)
    lines = [f"{hash_file(state / rel)}  {rel}\n" for rel in _state_files(state)]
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
        now = hash_file(path)
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


#: The folder of a state that holds the trained parameters and their optimiser state
#: (:func:`save_trained`): ``trained_<i>`` for the accelerator's i-th prepared model.
TRAINED_STATE = "trained_{}"


@contextlib.contextmanager
def _without_models(accelerator) -> Iterator[None]:
    """Accelerate's ``save_state`` / ``load_state`` with its prepared models and optimisers hidden, so
    that it handles the rest (RNG states, registered objects: scheduler, progress) and
    :func:`save_trained` / :func:`load_trained` the models, which Accelerate would save whole."""
    models, optimizers = accelerator._models, accelerator._optimizers
    accelerator._models, accelerator._optimizers = [], []
    try:
        yield
    finally:
        accelerator._models, accelerator._optimizers = models, optimizers


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Without DCP's warning that a save / load with no process group is one process's (it is)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _trained_state(model, optimizer) -> dict[str, Any]:
    """``{"model", "optim"}``: the trainable parameters of ``model`` (a plain, DDP- or FSDP2-wrapped
    module; FSDP2: this rank's shards) and ``optimizer``'s state, by parameter name
    (``torch.distributed.checkpoint.state_dict.get_state_dict`` with ``ignore_frozen_params``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    return {"model": model_state, "optim": optim_state}


def save_trained(accelerator, out: Path) -> None:
    """Each prepared model's trainable parameters and its optimiser's state into ``out/trained_<i>``
    (``torch.distributed.checkpoint``: each rank writes its own shards, ``__<rank>_0.distcp``, plus a
    ``.metadata`` index). Frozen parameters (a LoRA base, a kept reference model) are left out: they
    are read again from the job's inputs when it restarts."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    for i, (model, optimizer) in enumerate(zip(accelerator._models, accelerator._optimizers, strict=True)):
        state = _trained_state(model, optimizer)
        with _single_process_quiet():
            dcp.save(state, checkpoint_id=str(out / TRAINED_STATE.format(i)), no_dist=not dist.is_initialized())


def load_trained(accelerator, state_dir: Path) -> None:
    """Load what :func:`save_trained` wrote into the prepared models and optimisers (in place, each
    rank its own shards); the frozen parameters are left as they are."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    for i, (model, optimizer) in enumerate(zip(accelerator._models, accelerator._optimizers, strict=True)):
        state = _trained_state(model, optimizer)
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=str(state_dir / TRAINED_STATE.format(i)), no_dist=not dist.is_initialized())
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=StateDictOptions(ignore_frozen_params=True, strict=False),
        )


def save_state(accelerator, resume: Path, step: int) -> None:
    """A resume state in ``resume/step-N``: the trained parameters and optimiser states
    (:func:`save_trained`), and Accelerate's ``save_state`` of the rest (RNG states, scheduler,
    progress). Written under a temporary name with its checksum manifest last
    (:func:`write_state_manifest`), then renamed; then all but the newest :data:`KEEP_STATES` states
    (and leftover temporaries) are removed."""
    tmp = resume / f".tmp-step-{step}"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    with _without_models(accelerator):
        accelerator.save_state(str(tmp), safe_serialization=True)
    save_trained(accelerator, tmp)
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
    file) and removed; the next older one is tried, else training starts over, as the log says. With
    several processes rank 0 checks (every rank's shard files: one read of the state) and broadcasts
    its verdict; the others wait within the process group's timeout (``dist_timeout_min``).
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
    if accelerator.num_processes == 1:
        good, bad = _pick(resume)
    else:  # rank 0 reads every file once (all ranks' shards), the others wait for its verdict
        from accelerate.utils import broadcast_object_list

        good, bad = broadcast_object_list([_pick(resume) if main else None], from_process=0)[0]
    accelerator.wait_for_everyone()
    if main:
        for state in bad:
            shutil.rmtree(state, ignore_errors=True)
    accelerator.wait_for_everyone()
    if good is None:
        return None
    try:
        with _without_models(accelerator):
            accelerator.load_state(str(good))
        load_trained(accelerator, good)
    except Exception as exc:  # passed its checksums, yet not loadable: not this code's state
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise RuntimeError(
            f"{good}: resume state cannot be loaded ({type(exc).__name__}: {first}); delete {resume} to start over"
        ) from exc
    log.info("resumed training from %s", good)
    return good


def _pick(resume: Path) -> tuple[Path | None, list[Path]]:
    """``(newest state of resume that passes check_state or None, the newer ones that fail)``; each
    failure is logged (one line naming the file and what is tried next)."""
    states = _states(resume)
    bad: list[Path] = []
    for i, state in enumerate(states):
        problem = check_state(state)
        if problem is None:
            return state, bad
        bad.append(state)
        then = f"falling back to {states[i + 1].name}" if i + 1 < len(states) else "starting over"
        logging.getLogger("qrerase").warning("resume state %s is corrupt: %s; removed, %s", state, problem, then)
    return None, bad


#: Config keys that do not change what a run computes (left out of its identity).
_NOT_IDENTITY = ("threads", "checkpoint_every", "dist_timeout_min")


def _settings(cfg: Any) -> Any:
    """A config's fields that determine a run (not ``threads``, ``checkpoint_every`` nor ``dist_timeout_min``)."""
    if cfg is None or not (dataclasses.is_dataclass(cfg) or hasattr(cfg, "__dict__")):
        return cfg
    fields = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
    return {k: v for k, v in fields.items() if k not in _NOT_IDENTITY}


def training_identity(
    cfg: Any, run: dict, steps: Sequence, model, frozen: Sequence = (), run_settings: Any = None
) -> str:
    """The :func:`run_identity` of one training loop: its config (less ``threads``,
    ``checkpoint_every`` and ``dist_timeout_min``), ``run`` (name, step count, optimiser, schedule,
    processes, parts), the trainable parameter names, the frozen models' weights, the loss's own
    settings (``run_settings``, e.g. a baseline's config) and the starting weights of ``model``."""
    settings = {
        **run,
        "config": _settings(cfg),
        "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
        "frozen": [run_identity({}, [], m) for m in frozen],
        "run_settings": _settings(run_settings) if dataclasses.is_dataclass(run_settings) else run_settings,
    }
    return run_identity(settings, steps, model)


def check_finite_trained(model, desc: str) -> None:
    """``FloatingPointError`` (one line) when a trained (``requires_grad``) weight of ``model`` is NaN or Inf."""
    for name, p in model.named_parameters():
        if p.requires_grad and not bool(torch.isfinite(p.detach()).all()):
            raise FloatingPointError(f"{desc}: trained weight {name} is not finite (lower the learning rate)")
