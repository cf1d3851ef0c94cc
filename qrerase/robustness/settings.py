"""The robustness stage's settings (config section ``robustness``) and their planning-time checks.

Standard library and the method registry: the workflow reads them while it plans, before any job runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .quantization import FORMATS, GGUF_FORMATS, missing_backend

__all__ = [
    "ATTACKS",
    "PROMPT_ATTACKS",
    "MODES",
    "RobustnessSettings",
    "robustness_settings",
    "check_robustness",
    "check_prompt_room",
    "model_context",
]

#: The attacks, each declared once: name -> its kind (``train``: optimiser steps on the weights; ``weights``: a
#: round trip of the weights; ``prompt``: the weights as given, the prompt changed), what it trains on (None: no
#: training) and the sets it is scored on (the first: the one its summary column reads).
ATTACKS: dict[str, dict[str, Any]] = {
    "relearn": {"kind": "train", "trains_on": "A", "scores": ("B",)},  # targeted relearning (Deeb & Roger 2024)
    # benign fine-tuning (Łucki et al. 2024): on B, as relearning, and on the whole forget set (hypothesis 4)
    "benign": {"kind": "train", "trains_on": "retain", "scores": ("B", "forget")},
    "quantize": {"kind": "weights", "trains_on": None, "scores": ("forget",)},  # GGUF / bitsandbytes round trip
    # B's paraphrased questions (TOFU's paraphrased_question) in place of its questions
    "paraphrase": {"kind": "prompt", "trains_on": None, "scores": ("B",)},
    # an affirmative prefix opening the assistant turn before the answer (the UDS page's jailbreak prefix)
    "prefix": {"kind": "prompt", "trains_on": None, "scores": ("B",)},
    # in-context relearning: m question-answer pairs of the same entity's half A before B's question
    "in_context": {"kind": "prompt", "trains_on": None, "scores": ("B",)},
}
#: The prompt attacks, in :data:`ATTACKS` order.
PROMPT_ATTACKS = tuple(a for a, spec in ATTACKS.items() if spec["kind"] == "prompt")
#: How a training attack updates the model: every weight, or a LoRA adapter of the track's shape merged back.
MODES = ("full", "lora")


@dataclass(frozen=True)
class RobustnessSettings:
    """``budgets``: optimiser steps at which a training attack is scored (0 first: the model as given);
    ``lr_factors``: relearning learning rates as multiples of the track's fine-tuning (full) or LoRA
    (lora) rate; ``benign_lr_factors``: those of benign fine-tuning; ``modes``: full and/or lora;
    ``formats``: quantization formats, GGUF or bitsandbytes (:data:`qrerase.robustness.quantization.FORMATS`;
    default the GGUF ones); ``optional_formats``: formats run where their package is installed and skipped
    (with a note at planning) where it is not; ``prompt_attacks``: the prompt attacks run (:data:`PROMPT_ATTACKS`;
    on a track whose data lack what one needs, e.g. paraphrased questions, it is skipped); ``prefix``: the
    affirmative answer prefix; ``in_context``: the grid of m, facts of half A in the prompt;
    ``a_share``: the share of each entity's forget items in half A; ``utility_questions``: retain
    questions of the utility score (the first ones of the track's retain evaluation set)."""

    budgets: tuple[int, ...] = (0, 1, 2, 4, 8, 16)
    lr_factors: tuple[float, ...] = (1.0, 0.1)
    benign_lr_factors: tuple[float, ...] = (1.0,)
    modes: tuple[str, ...] = MODES
    formats: tuple[str, ...] = tuple(GGUF_FORMATS)
    optional_formats: tuple[str, ...] = ()
    prompt_attacks: tuple[str, ...] = PROMPT_ATTACKS
    prefix: str = "Sure, here is the answer:"
    in_context: tuple[int, ...] = (1, 2)
    a_share: float = 0.5
    utility_questions: int = 100

    @property
    def max_budget(self) -> int:
        return max(self.budgets)

    @property
    def quantized(self) -> tuple[str, ...]:
        """The formats a job runs: ``formats``, then the ``optional_formats`` whose package is installed."""
        return self.formats + tuple(
            f for f in self.optional_formats if f not in self.formats and not missing_backend(f)
        )


def _fail(key: str, expected: str, got: Any) -> None:
    raise ValueError(f"config key 'robustness.{key}': expected {expected}, got {got!r}")


def robustness_settings(section: Mapping[str, Any] | None) -> RobustnessSettings:
    """The settings of config section ``robustness`` (absent keys: the defaults above), checked: a
    one-line ValueError naming the key for a negative or non-integer budget, budgets without 0, an
    unknown mode or format (or one of ``formats`` whose package is missing), a non-positive learning-rate
    factor, an ``a_share`` that leaves a half empty (outside (0, 1)), an unknown prompt attack, an empty
    prefix or an ``in_context`` m that is not an integer >= 1."""
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
    for f in section.get("optional_formats", list(d.optional_formats)):
        if f not in FORMATS:
            _fail("optional_formats", f"one of {sorted(FORMATS)}", f)
    for a in section.get("prompt_attacks", list(d.prompt_attacks)):
        if a not in PROMPT_ATTACKS:
            _fail("prompt_attacks", f"one of {list(PROMPT_ATTACKS)}", a)
    prefix = section.get("prefix", d.prefix)
    if not isinstance(prefix, str) or not prefix.strip():
        _fail("prefix", "a non-empty string (the answer prefix)", prefix)
    grid = section.get("in_context", list(d.in_context))
    if not isinstance(grid, Sequence) or isinstance(grid, str):
        _fail("in_context", "a list of m, facts in the prompt", grid)
    for m in grid:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            _fail("in_context", "integers m >= 1 (facts of half A in the prompt; m = 0 is the plain prompt)", m)
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
        optional_formats=tuple(section.get("optional_formats", d.optional_formats)),
        prompt_attacks=tuple(a for a in PROMPT_ATTACKS if a in section.get("prompt_attacks", d.prompt_attacks)),
        prefix=str(prefix),
        in_context=tuple(sorted(set(grid))),
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


def model_context(model: Mapping[str, Any]) -> int | None:
    """The context (``max_position_embeddings``) of config section ``model`` where planning can read it: the
    embedded tiny model's (``model.tiny``), or a local checkpoint folder's ``config.json``; None otherwise (a
    hub id, a checkpoint a rule builds: the job checks in tokens)."""
    import json
    from pathlib import Path

    name = model.get("name_or_path")
    if name is None:
        value = (model.get("tiny") or {}).get("max_position_embeddings")
        return int(value) if value else None
    config = Path(str(name)) / "config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text()).get("max_position_embeddings")
    return int(value) if value else None


def check_prompt_room(settings: RobustnessSettings, track: str, block: int | None, context: int | None) -> None:
    """Planning-time bounds of a text track's prompt attacks (one-line ValueError naming the key):

    * ``robustness.in_context``: each m at most the facts an entity has in half A, ceil(block · a_share)
      (``block``: the forget set's items per entity; None: one entity, checked by the job);
    * ``robustness.prefix``: a prefix that cannot fit the model's ``context`` (None: unknown at planning)
      beside the BOS and EOS tokens every scored sequence has. Its whitespace-separated words bound its
      tokens from below (the Llama, SmolLM2 and embedded tokenizers split words before merging), so one of
      more words than ``context − 2`` is refused here; a prefix that fits so but not beside a question and
      its answer is refused by the job in tokens, before any attack runs.
    """
    if "in_context" in settings.prompt_attacks and block is not None:
        per_entity = math.ceil(block * settings.a_share)
        too_many = [m for m in settings.in_context if m > per_entity]
        if too_many:
            _fail(
                "in_context",
                f"m <= {per_entity} on track {track} "
                f"(each entity's facts in half A: ceil({block} x {settings.a_share}))",
                too_many[0],
            )
    if "prefix" in settings.prompt_attacks and context is not None:
        words = len(settings.prefix.split())
        if words > context - 2:
            _fail(
                "prefix",
                f"a prefix that fits the model's context of {context} tokens beside BOS and EOS on track {track}; "
                f"its {words} words are at least {words} tokens",
                settings.prefix[:40] + ("..." if len(settings.prefix) > 40 else ""),
            )
