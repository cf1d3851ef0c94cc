"""The GPU smoke test: ``qrerase smoke --configfile X`` runs each training job kind of a config for a few
steps on a random-weight model of the config's shape and writes each job's measured peak memory next to
the memory plan's estimate (docs/cluster.md: the first thing to run on a new cluster).

Nothing is downloaded. The model is built from the shape the plan uses
(:func:`qrerase.workflow.stages.context`: the config's model, or a declared ``model.shape``), with
random weights (normal, σ = 0.02) in the config's dtype, and written once as a safetensors checkpoint
under the work folder; a word-level tokenizer of the shape's vocabulary (``t0`` … ``t<V-1>``) comes
with it. Each job then runs in its own process (or ``resources.train.processes`` processes, through the
workflow's own launcher, :func:`qrerase.workflow.launch.launcher`) with the engine settings of its plan
row (:func:`qrerase.workflow.stages.job_settings`: backend, micro-batch, accumulation, checkpointing)
and the same library calls as its workflow script: :func:`qrerase.text.models.load_model` (rank 0 alone
reading the weights under FSDP2), :func:`qrerase.text.training.train_causal_lm` /
:func:`~qrerase.text.training.train_lora` / :func:`qrerase.baselines.text.train_baseline`. The training
data are random token sequences of the job's ``max_length`` (a quarter prompt, the rest answer), enough
for ``steps`` optimiser steps.

Measured peak, per rank, the largest over ranks: the bytes of live tensors, which is what the plan
estimates (not the allocator's cache). On a GPU it is ``torch.cuda.max_memory_allocated``; on the CPU
the same quantity for the CPU allocator (:class:`TensorPeak`: the allocation events that
:mod:`torch.profiler` records while the job loads and trains). On the CPU the CSV also holds
``rss_gib``, the rise of the process's peak resident set (``VmHWM``) over its size before the model was
loaded: what the operating system saw, allocator cache, gloo and libraries included. The plan's estimate is
:func:`qrerase.workflow.plan.device_bytes` of the job's plan row, for a CPU job too (the plan then
computes it for a CPU "device"). The text tracks' jobs are covered (fine-tune, LoRA, each planned text
baseline); the speech track's are not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import registry
from .tracks import section_at
from .tracks import track as track_of
from .workflow.plan import GIB, JobPlan, JobSpec, device_bytes, plan_job
from .workflow.shapes import ModelShape
from .workflow.stages import context, job_settings, stage_job

__all__ = ["SmokeJob", "smoke_jobs", "model_config", "write_random_checkpoint", "run_smoke", "COLUMNS"]

#: The CSV's columns, in order.
COLUMNS = (
    "job",
    "workload",
    "backend",
    "processes",
    "micro_batch",
    "accumulation",
    "checkpointing",
    "steps",
    "plan_gib",
    "measured_gib",
    "measured_over_plan",
    "rss_gib",
    "device",
    "seconds",
)


@dataclass(frozen=True)
class SmokeJob:
    """One training job kind to run: ``stage`` is ``finetune``, ``lora`` or a text baseline's name."""

    track: str
    stage: str
    spec: JobSpec
    plan: JobPlan
    settings: dict


def smoke_jobs(cfg: Mapping, only: tuple[str, ...] = ()) -> list[SmokeJob]:
    """The training job kinds of the config's text tracks, as planned, each once (a job of another
    track with the same plan row is left out). ``only``: stage names to keep (empty: all)."""
    jobs, seen = [], set()
    for track in cfg.get("tracks", []):
        t = track_of(track)
        if not t.smoke:
            continue
        shape, dtype, node = context(cfg, track)
        stages = [
            "finetune",
            "lora",
            *[m for m in cfg.get("methods", {}).get(track, []) if m in section_at(cfg, t.baselines_section)],
        ]
        for stage in stages:
            if stage not in ("finetune", "lora") and (
                registry.method(stage).decomp or not registry.method(stage).plan_shape
            ):
                continue
            if only and stage not in only:
                continue
            spec = stage_job(cfg, track, stage)
            key = (stage, *[v for k, v in asdict(spec).items() if k not in ("name", "section", "backend_key", "hint")])
            if key in seen:
                continue
            seen.add(key)
            jobs.append(
                SmokeJob(track, stage, spec, plan_job(shape, spec, dtype, node), job_settings(cfg, track, stage))
            )
    if only and (missing := sorted(set(only) - {j.stage for j in jobs})):
        raise ValueError(f"smoke --only: {missing} is no planned training job of this config's text tracks")
    return jobs


def model_config(shape: ModelShape):
    """A transformers config of ``shape``: Llama (Mixtral with experts > 1); ``ValueError`` for a shape
    without a gated MLP (no random-model builder here)."""
    from transformers import LlamaConfig, MixtralConfig

    if not shape.gated_mlp:
        raise ValueError(f"smoke: model shape {shape.name!r} has no gated MLP; only Llama / Mixtral shapes are built")
    common = dict(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=shape.tied_embeddings,
        max_position_embeddings=4096,
    )
    if shape.experts > 1:
        return MixtralConfig(**common, num_local_experts=shape.experts, num_experts_per_tok=shape.experts_per_token)
    return LlamaConfig(**common)


def _word_tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1", pad_token="t2")


def write_random_checkpoint(
    shape: ModelShape, dtype: str, out: str | os.PathLike, seed: int = 0, device: str = "cpu"
) -> Path:
    """Write a random-weight model of ``shape`` in ``dtype`` (weights normal with σ = 0.02, norms 1)
    and its word-level tokenizer to ``out`` (safetensors, ``save_pretrained``); returns ``out``. The
    model is built on the meta device and filled tensor by tensor, so the host holds one copy.

    ``device``: where the random numbers are drawn (a generator seeded ``seed`` on that device), ``cpu``
    or a CUDA device: drawing 8 × 10⁹ numbers takes over a minute on a few CPU cores and well under a
    second on a GPU. The values depend on it (each device's generator has its own stream), so the
    device is part of what ``out/smoke.json`` records. A folder ``out`` whose ``smoke.json`` records the
    same shape, dtype, seed and device is reused as it is (a second ``qrerase smoke`` of the same
    config does not write 16 GB again)."""
    import torch
    from transformers import AutoModelForCausalLM

    if shape.vocab < 3:
        raise ValueError(f"smoke: model shape {shape.name!r} needs a vocabulary of at least 3 tokens")
    out = Path(out)
    stamp = {"shape": asdict(shape), "dtype": dtype, "seed": seed, "device": str(torch.device(device).type)}
    with contextlib.suppress(OSError, ValueError):
        if json.loads((out / "smoke.json").read_text()) == stamp:
            return out
    config = model_config(shape)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model = model.to_empty(device="cpu")  # buffers (rotary inv_freq) are not saved: from_pretrained rebuilds them
    model.tie_weights()  # to_empty gave a tied LM head storage of its own, which would be saved unset
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                draw = torch.randn(p.shape, generator=gen, dtype=torch.float32, device=device)
                p.copy_(draw.mul_(0.02).to(p.dtype))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    _word_tokenizer(shape.vocab).save_pretrained(tmp)
    (tmp / "smoke.json").write_text(json.dumps(stamp, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _draw_device(device: str) -> str:
    """Where the random weights are drawn: the GPU when the config's device may be one and one is visible."""
    import torch

    return "cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"


def _records(n: int, length: int, vocab: int, seed: int) -> list[dict[str, str]]:
    """``n`` random QA records of ``length`` tokens in all (EOS included), a quarter of them prompt."""
    import numpy as np

    rng = np.random.default_rng(seed)
    q = max(1, length // 4)
    a = max(1, length - q - 1)
    ids = rng.integers(3, vocab, size=(n, q + a))
    return [{"question": " ".join(f"t{i}" for i in r[:q]), "answer": " ".join(f"t{i}" for i in r[q:])} for r in ids]


class TensorPeak:
    """The peak of the bytes held by live CPU tensors while the block runs (the CPU analogue of
    ``torch.cuda.max_memory_allocated``): :mod:`torch.profiler` with ``profile_memory=True`` records
    every allocation and free of the CPU allocator as a ``[memory]`` event of ``+n`` / ``-n`` bytes,
    and the peak is the largest running sum of those events in time order (tensors that exist before
    the block are not counted). ``peak`` is set on exit, in bytes (int)."""

    def __init__(self) -> None:
        self.peak = 0
        self._prof = None

    def __enter__(self) -> TensorPeak:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prof.__exit__(*exc)
        events = [e for e in self._prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        events = [e for e in events if str(e.device_type()).endswith("CPU")]
        self.peak = running_peak((e.start_ns(), e.nbytes()) for e in events)


def running_peak(events: Iterable[tuple[int, int]]) -> int:
    """``max_t sum_{t_i <= t} n_i`` (>= 0) of ``(t_i, n_i)`` allocation events (``n_i`` bytes, a free
    negative), taken in time order (ties: in the given order); 0 for no events."""
    current = peak = 0
    for _, n in sorted(events, key=lambda e: e[0]):
        current += int(n)
        peak = max(peak, current)
    return peak


def _peak_rss() -> tuple[int, int]:
    """(peak, current) resident set size of this process, bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        text = f.read()
    return 1024 * int(re.search(r"VmHWM:\s+(\d+)", text).group(1)), 1024 * int(
        re.search(r"VmRSS:\s+(\d+)", text).group(1)
    )


def worker(job: Mapping[str, Any], checkpoint: str, out: str) -> None:
    """One job's process (one rank of it): load, train ``job['steps']`` steps, write the rank's peak."""
    import importlib

    import torch

    from .workflow.launch import rank

    dtype, device, stage, s = job["dtype"], job["device"], job["stage"], dict(job["settings"])
    # the modules a job imports on first use, imported before the baseline is taken
    for name in ("accelerate", "peft", "transformers.models.llama.modeling_llama", "qrerase.baselines.text"):
        importlib.import_module(name)
    for name in ("qrerase.engine", "qrerase.method.architectures", "qrerase.text.models", "qrerase.text.training"):
        importlib.import_module(name)

    _, rss0 = _peak_rss()  # the process before any model: what the plan does not count
    cuda = torch.cuda.is_available() and device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with TensorPeak() if not cuda else contextlib.nullcontext() as tensors:
        _train(job, checkpoint, dtype, device, stage, s)
    peak_rss, _ = _peak_rss()
    record = {
        "rank": rank(),
        "peak_bytes": int(torch.cuda.max_memory_allocated() if cuda else tensors.peak),
        "rss_bytes": None if cuda else int(peak_rss - rss0),
        "device": "cuda" if cuda else "cpu",
        "seconds": time.perf_counter() - t0,
    }
    Path(f"{out}.rank{rank()}.json").write_text(json.dumps(record))


def _train(job: Mapping[str, Any], checkpoint: str, dtype: str, device: str, stage: str, s: dict) -> None:
    """Load the random checkpoint and train ``job['steps']`` steps of ``stage``, as its workflow job."""
    from .baselines.text import TextBaselineConfig, loads_sharded, objective_of, train_baseline
    from .engine import sharded
    from .method.architectures import resolve_target_modules
    from .text.lm import PromptTemplate
    from .text.models import load_model, load_tokenizer
    from .text.training import ENGINE_KEYS, LoraTrainConfig, TrainConfig, train_causal_lm, train_lora

    tok = load_tokenizer(checkpoint)
    template = PromptTemplate(question_start="", question_end="", answer_start="")
    steps, batch = int(job["steps"]), int(s["batch_size"])
    records = _records(steps * batch, int(job["max_length"]), len(tok), seed=1)
    if stage in ("finetune", "lora"):
        keys = ("epochs", "lr", "batch_size", "weight_decay", "warmup_ratio", "max_length", *ENGINE_KEYS)
        train = TrainConfig.from_dict({**{k: s[k] for k in keys if k in s}, "epochs": 1, "seed": 0})
        model = load_model(checkpoint, dtype=dtype, device=device, sharded=sharded(train.backend))
        if stage == "lora":
            modules = tuple(resolve_target_modules(model, s["target_modules"]))
            lcfg = LoraTrainConfig(
                r=s["r"], alpha=s["alpha"], dropout=s.get("dropout", 0.0), target_modules=modules, train=train
            )
            train_lora(model, tok, records, template, lcfg, desc=f"smoke-{stage}")
        else:
            train_causal_lm(model, tok, records, template, train, desc=f"smoke-{stage}")
    else:
        cfg = TextBaselineConfig.from_dict({**s, "epochs": 1, "seed": 0})
        shard, shard_ref = loads_sharded(cfg)
        model = load_model(checkpoint, dtype=dtype, device=device, sharded=shard)
        ref = None
        if objective_of(cfg.method).needs_reference and cfg.mode != "lora":
            ref = load_model(checkpoint, dtype=dtype, device=device, sharded=shard_ref)
        retain = _records(steps * batch, int(job["max_length"]), len(tok), seed=2)
        refusals = [" ".join(f"t{i}" for i in range(3, 3 + max(1, int(job["max_length"]) // 2)))]
        train_baseline(model, ref, tok, records, retain, template, cfg, refusals=refusals, desc=f"smoke-{stage}")


def run_smoke(
    cfg: Mapping,
    out_csv: str | os.PathLike,
    work: str | os.PathLike,
    steps: int = 3,
    only: tuple[str, ...] = (),
    accelerate: str | None = None,
) -> list[dict[str, Any]]:
    """Run :func:`smoke_jobs` of ``cfg`` (``steps`` optimiser steps each) and write the CSV of
    :data:`COLUMNS` to ``out_csv``; returns its rows. ``work`` holds the random checkpoint and each
    job's per-rank records. A job that fails stops the run with its command and exit code."""
    import pandas as pd

    from .io import write_csv
    from .workflow.launch import LAUNCH_CONFIG, launcher

    if steps < 1:
        raise ValueError(f"smoke --steps: expected an integer >= 1, got {steps!r}")
    jobs = smoke_jobs(cfg, only)
    if not jobs:
        raise ValueError("smoke: the config's text tracks plan no training job (tracks / methods)")
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    shape, dtype, node = context(cfg, jobs[0].track)
    device = cfg["model"].get("device", "cpu")
    ckpt = write_random_checkpoint(shape, dtype, work / "model", device=_draw_device(device))
    accelerate = accelerate or shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
    launch_config = Path(__file__).resolve().parents[1] / LAUNCH_CONFIG
    rows = []
    for j in jobs:
        prefix = work / j.stage
        for old in work.glob(f"{j.stage}.rank*.json"):
            old.unlink()
        spec = {"stage": j.stage, "settings": j.settings, "steps": steps, "dtype": dtype, "device": device}
        spec["max_length"] = j.spec.max_length
        argv = ["-m", "qrerase.smoke", "--job", json.dumps(spec), "--checkpoint", str(ckpt), "--out", str(prefix)]
        command = launcher(j.plan.processes, device, sys.executable, accelerate, str(launch_config))
        command += " " + " ".join(shlex.quote(w) for w in argv)
        t0 = time.perf_counter()
        done = subprocess.run(command, shell=True, check=False)
        if done.returncode:
            raise RuntimeError(f"smoke: job {j.spec.name} failed (exit {done.returncode}): {command}")
        ranks = [json.loads(p.read_text()) for p in sorted(work.glob(f"{j.stage}.rank*.json"))]
        if len(ranks) != j.plan.processes:
            raise RuntimeError(f"smoke: job {j.spec.name}: {len(ranks)} of {j.plan.processes} ranks reported")
        plan_bytes = device_bytes(shape, j.spec, dtype, max(1, j.plan.micro_batch), j.plan.processes, j.plan.backend)
        peak = max(r["peak_bytes"] for r in ranks)
        cuda = ranks[0]["device"] == "cuda"
        rows.append(
            {
                "job": j.spec.name,
                "workload": j.spec.workload,
                "backend": j.plan.backend,
                "processes": j.plan.processes,
                "micro_batch": j.plan.micro_batch,
                "accumulation": j.plan.accumulation,
                "checkpointing": j.plan.checkpointing,
                "steps": steps,
                "plan_gib": round(plan_bytes / GIB, 4),
                "measured_gib": round(peak / GIB, 4),
                "measured_over_plan": round(peak / plan_bytes, 3) if plan_bytes else math.nan,
                "rss_gib": math.nan if cuda else round(max(r["rss_bytes"] for r in ranks) / GIB, 4),
                "device": ranks[0]["device"],
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    write_csv(out_csv, pd.DataFrame(rows, columns=list(COLUMNS)))
    return rows


if __name__ == "__main__":  # one job's process: `python -m qrerase.smoke` / `accelerate launch -m qrerase.smoke`
    parser = argparse.ArgumentParser(prog="python -m qrerase.smoke", description="one job of qrerase smoke")
    parser.add_argument("--job", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    worker(json.loads(a.job), a.checkpoint, a.out)
