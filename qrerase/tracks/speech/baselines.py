"""Optimisation baselines of the speech track: Gradient Ascent, SCRUB and Bad Teaching.

Each produces an unlearned model from the fine-tuned speaker classifier, by full fine-tuning or by
LoRA on the attention projections (merged into the weights afterwards), deterministically under the
configured seed. Losses (logits ``s`` of the student, ``t`` of a teacher, labels ``y``; batch mean):

* Gradient Ascent (Jang et al., 2023): ``L = −CE(s, y)`` on forget utterances.
* SCRUB (Kurmanji et al., 2023), teacher = the frozen fine-tuned model, student initialised from it,
  temperature τ, ``KL_τ(t‖s) = τ² · mean_b Σ_c softmax(t/τ)_c (log softmax(t/τ)_c − log softmax(s/τ)_c)``:
  max-steps on forget batches ``L_max = −KL_τ(t‖s)`` (the first ``max_epochs`` epochs), then in every
  epoch min-steps on retain batches ``L_min = γ·CE(s, y) + α·KL_τ(t‖s)``; Adam.
* Bad Teaching (Chundawat et al., 2023): competent teacher = the fine-tuned model, incompetent teacher
  = a randomly initialised model of the same architecture; one epoch over forget ∪ (a seeded
  ``retain_fraction`` subset of) retain utterances, ``L = KL(p_T‖softmax(s/τ))`` (batch mean) where
  ``p_T = softmax(t_incompetent/τ)`` for forget and ``softmax(t_competent/τ)`` for retain utterances; Adam.

Every trainer (``run_<method>(model, data, cfg)``, registered as the method's ``speech``
implementation in :mod:`qrerase.registry`, which :func:`run_baseline` looks up) returns (unlearned
model — a plain, merged ``transformers`` model — and its loss curve ``step, epoch, phase, loss``).
``cfg`` is a :class:`~qrerase.tracks.speech.settings.SpeechBaselineConfig`: the shared training keys, ``mode``
and the LoRA shape, and the method's own hyperparameters ``cfg.hparams`` (SCRUB: ``max_epochs``,
``α`` = ``alpha``, ``γ`` = ``gamma``, ``τ`` = ``temperature``; Bad Teaching: ``τ``, ``retain_fraction``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from ... import registry
from .settings import SpeechBaselineConfig

__all__ = [
    "SPEECH_BASELINES",
    "SpeechBaselineConfig",
    "ga_classifier_loss",
    "kl_teacher_student",
    "scrub_max_loss",
    "scrub_min_loss",
    "bad_teaching_loss",
    "random_like",
    "run_ga",
    "run_scrub",
    "run_bad_teaching",
    "run_baseline",
]

#: The built-in speech baselines, in table order (from :mod:`qrerase.registry`).
SPEECH_BASELINES = tuple(m for m in registry.baselines_of_runner("speech") if registry.method(m) in registry.METHODS)


# --------------------------------------------------------------------------------------------------
# losses (pure functions of logits)


def ga_classifier_loss(logits, labels):
    """Gradient Ascent: the negative cross-entropy, −mean_b CE(s_b, y_b)."""
    import torch.nn.functional as F

    return -F.cross_entropy(logits, labels)


def kl_teacher_student(student_logits, teacher_logits, temperature: float = 1.0):
    """τ² · mean over the batch of KL(softmax(t/τ) ‖ softmax(s/τ)) (SCRUB's ``DistillKL``)."""
    import torch.nn.functional as F

    T = float(temperature)
    log_s = F.log_softmax(student_logits / T, dim=-1)
    log_t = F.log_softmax(teacher_logits / T, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(dim=-1).mean()
    return kl * T * T


def scrub_max_loss(student_logits, teacher_logits, temperature: float = 1.0):
    """SCRUB max-step loss on forget data: −KL_τ(t‖s) (minimising it pushes the student away)."""
    return -kl_teacher_student(student_logits, teacher_logits, temperature)


def scrub_min_loss(student_logits, teacher_logits, labels, alpha: float, gamma: float, temperature: float = 1.0):
    """SCRUB min-step loss on retain data: γ·CE(s, y) + α·KL_τ(t‖s)."""
    import torch.nn.functional as F

    return gamma * F.cross_entropy(student_logits, labels) + alpha * kl_teacher_student(
        student_logits, teacher_logits, temperature
    )


def bad_teaching_loss(student_logits, competent_logits, incompetent_logits, is_forget, temperature: float = 1.0):
    """Bad Teaching: mean_b KL(p_T,b ‖ softmax(s_b/τ)), p_T from the incompetent teacher on forget rows
    (``is_forget`` true) and from the competent teacher on retain rows."""
    import torch
    import torch.nn.functional as F

    T = float(temperature)
    f = is_forget.to(dtype=torch.bool).unsqueeze(-1)
    teacher = torch.where(f, F.softmax(incompetent_logits / T, dim=-1), F.softmax(competent_logits / T, dim=-1))
    log_s = F.log_softmax(student_logits / T, dim=-1)
    return (teacher * (torch.log(teacher.clamp_min(1e-30)) - log_s)).sum(dim=-1).mean()


# --------------------------------------------------------------------------------------------------
# trainers


def random_like(model, seed: int):
    """A randomly initialised model of ``model``'s class and config (the incompetent teacher), eval mode."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = type(model)(copy.deepcopy(model.config))
    return fresh.to(next(model.parameters()).device).eval()


def _frozen_copy(model):
    teacher = copy.deepcopy(model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def _student(model, cfg: SpeechBaselineConfig):
    if cfg.mode == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    import torch
    from peft import get_peft_model

    from .train import speech_lora_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return get_peft_model(model, speech_lora_config(cfg.lora_r, cfg.lora_alpha, 0.0, cfg.target_modules))


def _unwrap(student):
    return student.merge_and_unload() if hasattr(student, "merge_and_unload") else student


def _train(student, cfg: SpeechBaselineConfig, steps, losses: Mapping[str, Callable], desc: str) -> pd.DataFrame:
    """Adam at the constant rate ``cfg.lr`` with clipping, on the engine's loop
    (:func:`qrerase.engine.train_steps`). ``steps``: ``(epoch, (phase, idx))`` per update;
    ``losses[phase](idx)``: that phase's batch-mean loss. Returns the curve ``step, epoch, phase, loss``."""
    from ... import engine
    from ...engine import train_steps

    if not any(p.requires_grad for p in student.parameters()):
        raise ValueError("baseline: the student has no trainable parameters")

    def loss_fn(payload):
        phase, idx = payload
        return losses[phase](idx), {}

    def split(payload, parts):
        phase, idx = payload
        return engine.example_mean_split(lambda sub: (losses[phase](sub), {}))(idx, parts)

    rows = train_steps(
        student,
        cfg.train,
        steps,
        loss_fn,
        desc=desc,
        split=split,
        optimizer="adam",
        schedule="constant",
        run_settings=cfg,
    )
    return pd.DataFrame(
        [(r["step"], r["epoch"], steps[r["step"] - 1][1][0], r["loss"]) for r in rows],
        columns=["step", "epoch", "phase", "loss"],
    )


def _batches(n: int, cfg: SpeechBaselineConfig, salt: int) -> list[np.ndarray]:
    from ...engine.determinism import epoch_seed
    from .train import batches

    return batches(n, cfg.batch_size, epoch_seed(cfg.seed, salt))


def run_ga(model, data, cfg):
    """Gradient Ascent on the forget utterances (``data``: ``forget`` / ``retain`` tensors)."""
    import torch

    from .train import classifier_logits

    x, m, y = data["forget"]
    student = _student(model, cfg)
    steps = [(epoch + 1, ("ascent", idx)) for epoch in range(cfg.epochs) for idx in _batches(len(y), cfg, epoch)]

    def ascent(idx):
        b = torch.from_numpy(idx)
        return ga_classifier_loss(classifier_logits(student, x[b], m[b]), y[b])

    curve = _train(student, cfg, steps, {"ascent": ascent}, "ga")
    return _unwrap(student), curve


def run_scrub(model, data, cfg):
    """SCRUB: max-steps on forget, min-steps on retain batches, the frozen fine-tuned model as teacher."""
    import torch

    from .train import classifier_logits

    (xf, mf, yf), (xr, mr, yr) = data["forget"], data["retain"]
    teacher = _frozen_copy(model)
    student = _student(model, cfg)
    steps = []
    for epoch in range(cfg.epochs):
        if epoch < cfg.hparams.max_epochs:
            steps += [(epoch + 1, ("max", idx)) for idx in _batches(len(yf), cfg, 2 * epoch)]
        steps += [(epoch + 1, ("min", idx)) for idx in _batches(len(yr), cfg, 2 * epoch + 1)]

    def max_step(idx):
        b = torch.from_numpy(idx)
        with torch.no_grad():
            t = classifier_logits(teacher, xf[b], mf[b])
        return scrub_max_loss(classifier_logits(student, xf[b], mf[b]), t, cfg.hparams.temperature)

    def min_step(idx):
        b = torch.from_numpy(idx)
        with torch.no_grad():
            t = classifier_logits(teacher, xr[b], mr[b])
        s = classifier_logits(student, xr[b], mr[b])
        return scrub_min_loss(s, t, yr[b], cfg.hparams.alpha, cfg.hparams.gamma, cfg.hparams.temperature)

    curve = _train(student, cfg, steps, {"max": max_step, "min": min_step}, "scrub")
    return _unwrap(student), curve


def run_bad_teaching(model, data, cfg):
    """Bad Teaching: distil forget ∪ retain from the incompetent / competent teacher."""
    import torch

    from .train import classifier_logits

    (xf, mf, _), (xr, mr, _) = data["forget"], data["retain"]
    n_keep = max(1, int(round(cfg.hparams.retain_fraction * len(xr))))
    keep = torch.from_numpy(np.sort(np.random.default_rng(cfg.seed).permutation(len(xr))[:n_keep]))
    x = torch.cat([xf, xr[keep]])
    m = torch.cat([mf, mr[keep]])
    is_forget = torch.cat([torch.ones(len(xf), dtype=torch.bool), torch.zeros(n_keep, dtype=torch.bool)])
    competent = _frozen_copy(model)
    incompetent = random_like(model, cfg.seed + 1)
    student = _student(model, cfg)
    steps = [(epoch + 1, ("distil", idx)) for epoch in range(cfg.epochs) for idx in _batches(len(x), cfg, epoch)]

    def distil(idx):
        b = torch.from_numpy(idx)
        with torch.no_grad():
            tc = classifier_logits(competent, x[b], m[b])
            ti = classifier_logits(incompetent, x[b], m[b])
        s = classifier_logits(student, x[b], m[b])
        return bad_teaching_loss(s, tc, ti, is_forget[b], cfg.hparams.temperature)

    curve = _train(student, cfg, steps, {"distil": distil}, "bad_teaching")
    return _unwrap(student), curve


def run_baseline(
    method: str,
    model,
    arrays: Mapping[str, np.ndarray],
    forget_mask: np.ndarray,
    retain_mask: np.ndarray,
    cfg: SpeechBaselineConfig,
):
    """Unlearn with ``method`` (a registered speech baseline: ``ga`` | ``scrub`` | ``bad_teaching`` or a
    plug-in's) from the fine-tuned ``model`` (modified in place in full mode) with its registered
    ``speech`` implementation. ``forget_mask`` / ``retain_mask`` select the utterances of D_f ∩ train
    and D_r. Returns ``(model, loss_curve)``."""
    from ...engine.determinism import set_determinism
    from ...engine.placement import model_device
    from .train import as_tensors

    known = registry.baselines_of_runner("speech")
    if method not in known:
        raise ValueError(f"speech baseline must be one of {known}, got {method!r}")
    if cfg.method != method:
        raise ValueError(f"speech baseline {method!r}: its config is {cfg.method!r}'s")
    runner = registry.implementation(method, "speech")
    set_determinism(cfg.seed, cfg.threads)
    device = model_device(model)
    data = {"forget": as_tensors(arrays, forget_mask, device), "retain": as_tensors(arrays, retain_mask, device)}
    return runner(model, data, cfg)
