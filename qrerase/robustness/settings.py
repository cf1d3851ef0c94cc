"""The robustness stage's settings (config section ``robustness``) and their planning-time checks.

Standard library and the method registry: the workflow reads them while it plans, before any job runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .quantization import FORMATS, GGUF_FORMATS, missing_backend

__all__ = ["ATTACKS", "MODES", "RobustnessSettings", "robustness_settings", "check_robustness"]

#: The attacks, each declared once: name -> what it trains on (None: no training) and what it scores.
ATTACKS: dict[str, dict[str, str | None]] = {
    "relearn": {"trains_on": "A", "scores": "B"},  # targeted relearning (Deeb & Roger 2024)
    "benign": {"trains_on": "retain", "scores": "forget"},  # benign fine-tuning (Łucki et al. 2024)
    "quantize": {"trains_on": None, "scores": "forget"},  # weight-only GGUF round trip (Zhang et al. 2024)
}
#: How a training attack updates the model: every weight, or a LoRA adapter of the track's shape merged back.
MODES = ("full", "lora")


@dataclass(frozen=True)
class RobustnessSettings:
    """``budgets``: optimiser steps at which a training attack is scored (0 first: the model as given);
    ``lr_factors``: relearning learning rates as multiples of the track's fine-tuning (full) or LoRA
    (lora) rate; ``benign_lr_factors``: those of benign fine-tuning; ``modes``: full and/or lora;
    ``formats``: quantization formats, GGUF or bitsandbytes (:data:`qrerase.robustness.quantization.FORMATS`;
    default the GGUF ones);
    ``a_share``: the share of each entity's forget items in half A; ``utility_questions``: retain
    questions of the utility score (the first ones of the track's retain evaluation set)."""

    budgets: tuple[int, ...] = (0, 1, 2, 4, 8, 16)
    lr_factors: tuple[float, ...] = (1.0, 0.1)
    benign_lr_factors: tuple[float, ...] = (1.0,)
    modes: tuple[str, ...] = MODES
    formats: tuple[str, ...] = tuple(GGUF_FORMATS)
    a_share: float = 0.5
    utility_questions: int = 100

    @property
    def max_budget(self) -> int:
        return max(self.budgets)


def _fail(key: str, expected: str, got: Any) -> None:
    raise ValueError(f"config key 'robustness.{key}': expected {expected}, got {got!r}")


def robustness_settings(section: Mapping[str, Any] | None) -> RobustnessSettings:
    """The settings of config section ``robustness`` (absent keys: the defaults above), checked: a
    one-line ValueError naming the key for a negative or non-integer budget, budgets without 0, an
    unknown mode or format, a non-positive learning-rate factor, or an ``a_share`` that leaves a half
    empty (outside (0, 1))."""
    section = dict(section or {})
    d = RobustnessSettings()
    budgets = section.get("budgets", list(d.budgets))
    if not isinstance(budgets, Sequence) or not budgets:
        _fail("budgets", "a non-empty list of optimiser steps", budgets)
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            _fail("budgets", "integers >= 0 (optimiser steps)", b)
    if 0 not in budgets:
        _fail("budgets", "a list that includes 0 (the model before the attack: every recovery's start)", list(budgets))
    for key in ("lr_factors", "benign_lr_factors"):
        for f in section.get(key, list(getattr(d, key))):
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
                _fail(key, "positive multiples of the track's learning rate", f)
    for m in section.get("modes", list(d.modes)):
        if m not in MODES:
            _fail("modes", f"one of {list(MODES)}", m)
    for f in section.get("formats", list(d.formats)):
        if f not in FORMATS:
            _fail("formats", f"one of {sorted(FORMATS)}", f)
        if missing_backend(f):
            _fail("formats", f"a format whose package is installed ({missing_backend(f)})", f)
    share = section.get("a_share", d.a_share)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        _fail("a_share", "a share in (0, 1) (0 or 1 leaves half A or half B empty)", share)
    n_util = section.get("utility_questions", d.utility_questions)
    if isinstance(n_util, bool) or not isinstance(n_util, int) or n_util < 1:
        _fail("utility_questions", "an integer >= 1", n_util)
    return RobustnessSettings(
        budgets=tuple(sorted(set(budgets))),
        lr_factors=tuple(float(f) for f in section.get("lr_factors", d.lr_factors)),
        benign_lr_factors=tuple(float(f) for f in section.get("benign_lr_factors", d.benign_lr_factors)),
        modes=tuple(section.get("modes", d.modes)),
        formats=tuple(section.get("formats", d.formats)),
        a_share=float(share),
        utility_questions=int(n_util),
    )


def check_robustness(cfg: Mapping[str, Any]) -> None:
    """Planning-time check of config section ``robustness``: its settings (:func:`robustness_settings`)
    and ``robustness.methods.<track>``, each a method registered for that track (the stage attacks
    those of them that ``methods.<track>`` configures, so one subset serves every config)."""
    from ..registry import methods_for

    section = cfg.get("robustness") or {}
    robustness_settings(section)
    for track, chosen in (section.get("methods") or {}).items():
        try:
            known = methods_for(track)
        except (KeyError, ValueError):
            raise ValueError(f"config key 'robustness.methods.{track}': unknown track {track!r}") from None
        unknown = [m for m in chosen or [] if m not in known]
        if unknown:
            raise ValueError(f"config key 'robustness.methods.{track}': {unknown} not methods of track {track} {known}")
