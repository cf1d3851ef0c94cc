"""One job of the robustness stage: every attack on one model, in one process (docs/robustness.md).

A track describes its model's data and scores as an :class:`AttackTarget`; :func:`run_attacks` runs the
configured attacks (:data:`qrerase.robustness.settings.ATTACKS`) on copies of the model and returns
tidy rows; :func:`subspace_rows` turns the relearning update into the subspace diagnostic. A training
attack runs ``max(budgets)`` optimiser steps once, at a constant learning rate, through the project's
training loop (:func:`qrerase.engine.train_steps`) and is scored after each step of
``budgets``: with a constant rate the first b steps of that run *are* the b-step attack, so one run
serves every budget.
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from .measures import random_subspace, subspace_share
from .quantization import block_of, edit_step_ratios, quantize_roundtrip, zero_steps
from .settings import ATTACKS, RobustnessSettings

__all__ = [
    "AttackTarget",
    "ROW_COLUMNS",
    "SUBSPACE_COLUMNS",
    "run_attacks",
    "subspace_rows",
    "orthonormal_basis",
    "subspace_bases",
    "diagnostic_bases",
]

#: The columns of a job's attack rows (``value``: the set's statistic; ``edit_step_ratio`` rows: set ``weights``).
ROW_COLUMNS = ["attack", "mode", "lr_factor", "lr", "budget", "format", "set", "value"]
#: The columns of a job's subspace rows.
SUBSPACE_COLUMNS = ["module", "subspace", "k", "d_out", "share"]


@dataclass
class AttackTarget:
    """What a track gives :func:`run_attacks` for one model.

    score(model, names=None) -> {set: statistic} for the model in eval mode, without gradients, of the
    sets ``names`` (None: every set: ``B``, the whole ``forget`` set, ``utility``, and any other the
    track scores, e.g. ``B:fr``).
    sizes: examples of each training set, ``A`` (half A of the forget set) and ``retain``.
    loss(model, set, indices) -> the scalar training loss of those examples of a training set.
    rates: mode (``full`` / ``lora``) -> (learning rate, batch size) at learning-rate factor 1.
    add_lora(model) -> the model with fresh LoRA adapters of the track's shape (None: the track trains no LoRA).
    weights(model) -> {module: its 2-D weight (d_out, d_in)}: the weights quantized and diffed.
    prompt(model, attack, budget) -> {set: statistic} of a prompt attack (:data:`~qrerase.robustness.settings.
    PROMPT_ATTACKS`) on its scored sets, the model in eval mode without gradients (budget: m facts of
    ``in_context``; 1 for the others); None: the track has no prompts (speech).
    prompt_runs: the (attack, budget) pairs ``prompt`` scores: those the track's data allow (``paraphrase`` needs
    paraphrased questions) and whose prompts fit the model's context.
    """

    score: Callable[..., dict[str, float]]
    sizes: Mapping[str, int]
    loss: Callable[[Any, str, list[int]], torch.Tensor]
    rates: Mapping[str, tuple[float, int]]
    add_lora: Callable[[Any], Any] | None
    weights: Callable[[Any], dict[str, torch.Tensor]]
    prompt: Callable[[Any, str, int], dict[str, float]] | None = None
    prompt_runs: Sequence[tuple[str, int]] = ()


def _in_eval(model, scores: Callable[[], Mapping[str, float]]) -> dict[str, float]:
    """``scores()`` with the model in eval mode and without gradients, its mode restored after."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return {k: float(v) for k, v in scores().items()}
    finally:
        model.train(was)


def _scored(model, target: AttackTarget, names: Sequence[str] | None = None) -> dict[str, float]:
    return _in_eval(model, lambda: target.score(model, names))


def _batches(n: int, batch_size: int, steps: int, seed: int) -> list[tuple[int, list[int]]]:
    """``steps`` batches of ``batch_size`` (or all ``n``) indices: seeded permutations, epoch after epoch."""
    out: list[tuple[int, list[int]]] = []
    epoch = 0
    while len(out) < steps:
        order = np.random.default_rng([seed, epoch]).permutation(n).tolist()
        size = min(batch_size, n)
        out += [(epoch + 1, order[i : i + size]) for i in range(0, n - size + 1, size)]
        epoch += 1
    return out[:steps]


def _rows(attack, mode, factor, lr, budget, fmt, scores) -> list[dict]:
    return [
        {
            "attack": attack,
            "mode": mode,
            "lr_factor": factor,
            "lr": lr,
            "budget": budget,
            "format": fmt,
            "set": s,
            "value": v,
        }
        for s, v in scores.items()
    ]


def _wanted(attack: str, start: Mapping[str, float]) -> list[str]:
    """The sets an attack is scored on after it has run: its own (:data:`ATTACKS`: relearning B, and B in
    each other language; benign fine-tuning B and the whole forget set; quantization the whole forget
    set) and utility."""
    own = ATTACKS[attack]["scores"]
    return [s for s in start if s in own or (attack == "relearn" and s.startswith("B:")) or s == "utility"]


def _prompt_attacks(model, target: AttackTarget, settings: RobustnessSettings, start, log) -> list[dict]:
    """Rows of each configured prompt attack the track runs (:attr:`AttackTarget.prompt_runs`): budget 0, the
    plain prompt (the unattacked scores), then the attacked prompt at budget 1 (``paraphrase``, ``prefix``) or
    m (``in_context``: m facts of half A). Utility is the model's own at every budget: a prompt changes no
    weight."""
    rows: list[dict] = []
    for attack in settings.prompt_attacks:
        budgets = [b for a, b in target.prompt_runs if a == attack]
        if target.prompt is None or not budgets:
            log(f"{attack}: not run (the track has no prompt of its kind, or none fits the model's context)")
            continue
        plain = {s: v for s, v in start.items() if s in ATTACKS[attack]["scores"] or s == "utility"}
        rows += _rows(attack, "", 1.0, 0.0, 0, "", plain)
        for budget in budgets:
            got = _in_eval(model, partial(target.prompt, model, attack, budget))
            rows += _rows(attack, "", 1.0, 0.0, budget, "", {**got, "utility": start["utility"]})
            log(f"{attack} at {budget}: " + ", ".join(f"{k} {v:.4f}" for k, v in got.items()))
    return rows


def _train_attack(model, target, attack, mode, factor, settings, seed, threads, start, delta_of):
    from ..engine import train_steps
    from ..hparams import TrainConfig

    data = ATTACKS[attack]["trains_on"]
    lr, batch_size = target.rates[mode]
    lr = lr * factor
    m = copy.deepcopy(model)
    if mode == "lora":
        m = target.add_lora(m)
    rows = _rows(attack, mode, factor, lr, 0, "", start)
    budgets = set(settings.budgets) - {0}
    if settings.max_budget == 0:
        return rows, None
    steps = _batches(target.sizes[data], batch_size, settings.max_budget, seed)
    cfg = TrainConfig(epochs=1, lr=lr, batch_size=batch_size, warmup_ratio=0.0, seed=seed, threads=threads)

    wanted = _wanted(attack, start)

    def stop(step: int) -> bool:
        if step in budgets:
            rows.extend(_rows(attack, mode, factor, lr, step, "", _scored(m, target, wanted)))
        return False

    train_steps(
        m,
        cfg,
        steps,
        lambda idx: (target.loss(m, data, idx), {}),
        desc=f"{attack} {mode} x{factor}",
        stop=stop,
        schedule="constant",
    )
    delta = None
    if delta_of is not None:
        after = target.weights(m)
        delta = {n: after[n].detach().cpu().double().numpy() - w for n, w in delta_of.items() if n in after}
    return rows, delta


def run_attacks(
    model,
    target: AttackTarget,
    settings: RobustnessSettings,
    seed: int,
    threads: int = 1,
    ceiling: Mapping[str, np.ndarray] | None = None,
    diagnostic: Sequence[str] = (),
    log: Callable[[str], None] = lambda _m: None,
) -> tuple[list[dict], dict[str, np.ndarray]]:
    """Every configured attack on copies of ``model`` (left unchanged). Returns ``(rows, delta)``:

    rows (:data:`ROW_COLUMNS`): for each training attack (``relearn`` on A, ``benign`` on retain), mode
    and learning-rate factor, the scores at every budget (budget 0: the model as given, every set; later
    budgets: the attack's own sets and utility, :func:`_wanted`); for each prompt attack, its scored sets
    with the plain prompt (budget 0) and the attacked one (:func:`_prompt_attacks`); for each
    quantization format (:attr:`RobustnessSettings.quantized`), the scores of the round-tripped model
    (``budget`` 0) and, where ``ceiling`` (the fine-tuned model's weights) is given, the median
    edit-to-step ratio over every changed weight of the quantized modules (set ``weights``). delta:
    ΔW = W_attacked − W of each module in ``diagnostic`` after full-parameter relearning at the largest
    learning-rate factor and the largest budget (float64, (d_out, d_in)); empty when that attack is not
    configured.
    """
    start = _scored(model, target)
    rows: list[dict] = []
    delta: dict[str, np.ndarray] = {}
    top = max(settings.lr_factors)
    base = {
        n: w.detach().cpu().double().numpy().copy() for n, w in target.weights(model).items() if n in set(diagnostic)
    }
    for attack, factors in (("relearn", settings.lr_factors), ("benign", settings.benign_lr_factors)):
        for mode in settings.modes:
            if mode == "lora" and target.add_lora is None:
                continue
            for factor in factors:
                want = base if (attack, mode, factor) == ("relearn", "full", top) else None
                got, d = _train_attack(model, target, attack, mode, factor, settings, seed, threads, start, want)
                rows += got
                delta = d or delta
                log(f"{attack} {mode} x{factor}: {got[-1]['set']} {got[-1]['value']:.4f} at budget {got[-1]['budget']}")
    rows += _prompt_attacks(model, target, settings, start, log)
    for fmt in settings.quantized:
        m = copy.deepcopy(model)
        ratios = []
        skipped = []
        with torch.no_grad():
            for name, w in target.weights(m).items():
                if w.shape[1] % block_of(fmt):
                    skipped.append(name)
                    continue
                before = w.detach().cpu().float().numpy().copy()  # not a view: w is overwritten below
                w.copy_(torch.from_numpy(quantize_roundtrip(before, fmt)).to(w.device, w.dtype))
                if ceiling is not None and name in ceiling:
                    ratios.append(edit_step_ratios(before, ceiling[name], fmt))
        rows += _rows("quantize", "", 1.0, 0.0, 0, fmt, _scored(m, target, _wanted("quantize", start)))
        if ceiling is not None:
            pooled = np.concatenate(ratios) if ratios else np.zeros(0)
            rows += _rows(
                "quantize", "", 1.0, 0.0, 0, fmt, {"weights": float(np.median(pooled)) if pooled.size else float("nan")}
            )
        log(f"quantize {fmt}: {len(skipped)} module(s) kept in float (input width not a multiple of {block_of(fmt)})")
        if ratios:
            log(f"quantize {fmt}: {zero_steps(np.concatenate(ratios))} changed weight(s) with a zero step (ratio inf)")
        del m
    return rows, delta


def orthonormal_basis(U: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """An orthonormal basis (d_out, r) of the column space of ``U`` (d_out, k): its left singular vectors
    with σ > rtol · σ_max (r ≤ k). For an erase update U V = λ T̃_f = λ Q̃_f R Πᵀ this is span(Q̃_f)."""
    u, s, _ = np.linalg.svd(np.asarray(U, dtype=np.float64), full_matrices=False)
    if not s.size or s[0] == 0:
        return u[:, :0]
    return u[:, s > rtol * s[0]]


def subspace_bases(
    task_file: str,
    tilde_file: str | None = None,
    selected_file: str | None = None,
    retain_file: str | None = None,
    spans: Mapping[str, tuple[str, str | None]] | None = None,
) -> dict:
    """The diagnostic's bases by module: ``task``, the forget task matrix's top-k left singular vectors
    (rule factors' SVD file ``task_file``); ``retain``, the retain task matrix's (``retain_file``, the
    control: directions the retain data use); with a subspace method's update file ``tilde_file`` (and
    its LL selection ``selected_file``), ``erased``: span(Q̃_f) of every module it edits
    (:func:`orthonormal_basis`); ``spans``: {model: (update file, selection)}: ``erased:<model>``, another
    model's span(Q̃_f) (the ceiling's job measures its own relearning update there)."""
    from ..method.energy import selected_updates
    from ..method.formats import load_decompositions, load_updates

    def erased(tilde: str, selected: str | None) -> dict:
        return {m: orthonormal_basis(u.U) for m, u in selected_updates(load_updates(tilde), selected).items()}

    bases = {"task": {m: d.Q for m, d in load_decompositions(task_file).items()}}
    if retain_file is not None:
        bases["retain"] = {m: d.Q for m, d in load_decompositions(retain_file).items()}
    if tilde_file is not None:
        bases["erased"] = erased(tilde_file, selected_file)
    for model, (tilde, selected) in (spans or {}).items():
        bases[f"erased:{model}"] = erased(tilde, selected)
    return bases


def diagnostic_bases(inputs: Mapping[str, str]) -> dict:
    """:func:`subspace_bases` of a robustness job's named inputs: ``task``, ``retain_task``, ``tilde`` and
    ``selected`` (a subspace method's own), ``span:<model>:tilde`` / ``span:<model>:selected`` (another's)."""
    spans: dict[str, list] = {}
    for key, file in inputs.items():
        if key.startswith("span:"):
            _, model, part = key.split(":")
            spans.setdefault(model, [None, None])[0 if part == "tilde" else 1] = file
    return subspace_bases(
        inputs["task"],
        inputs.get("tilde"),
        inputs.get("selected"),
        inputs.get("retain_task"),
        {m: (t, sel) for m, (t, sel) in spans.items()},
    )


def subspace_rows(
    delta: Mapping[str, np.ndarray], bases: Mapping[str, Mapping[str, np.ndarray]], k: int, seed: int
) -> list[dict]:
    """The subspace diagnostic of one model (:data:`SUBSPACE_COLUMNS`): for every module of ``delta``
    the share of ΔW in each basis ``bases[subspace][module]`` that covers it (:func:`subspace_bases`:
    ``erased``, ``task``, ``retain``, ``erased:<model>``) and in a random k-dimensional subspace
    (``random``, seeded by ``seed`` and the module name; expected share k / d_out)."""
    rows = []
    for module, d in delta.items():
        d_out = d.shape[0]
        for name, by_module in bases.items():
            if module in by_module:
                q = by_module[module]
                rows.append(
                    {"module": module, "subspace": name, "k": q.shape[1], "d_out": d_out, "share": subspace_share(d, q)}
                )
        q = random_subspace(d_out, min(k, d_out), seed + zlib.crc32(module.encode()))
        rows.append(
            {"module": module, "subspace": "random", "k": q.shape[1], "d_out": d_out, "share": subspace_share(d, q)}
        )
    return rows
