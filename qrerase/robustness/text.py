"""The robustness stage on a text track's causal LM: its :class:`~qrerase.robustness.runner.AttackTarget`.

The forget statistic is the answer NLL (nats per answer token, EOS included; the mean over questions
of each question's token mean, as TOFU's loss), under the track's prompt template; utility is the same
statistic on the first questions of the retain evaluation set. Training attacks use the fine-tuning
loss (the answer-only NLL of :func:`qrerase.text.training.train_causal_lm`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..text.evaluation import EvalConfig, answer_losses, example_losses
from ..text.lm import PromptTemplate, answer_token_nll, collate, encode_qa_many, pad_token_id, qa_pair
from .prompts import prompt_examples
from .runner import AttackTarget

_log = logging.getLogger("qrerase.robustness")

__all__ = ["text_target", "linear_weights", "rule_scale", "attacked_model", "PromptSetup", "entity_facts"]


@dataclass(frozen=True)
class PromptSetup:
    """What a text track's prompt attacks need: ``attacks`` to run (those its data allow), the ``prefix``,
    the ``grid`` of m, per B row its ``paraphrase`` (None: the data have none) and ``facts``, the question-
    answer pairs of the same entity in half A (file order; m takes the first m), and the model's
    ``context`` in tokens (None: unknown, unchecked)."""

    attacks: Sequence[str]
    prefix: str
    grid: Sequence[int]
    paraphrases: Sequence[str] | None
    facts: Sequence[Sequence[tuple[str, str]]]
    context: int | None


def entity_facts(
    half_a: Sequence[Mapping[str, Any]], half_b: Sequence[Mapping[str, Any]]
) -> list[list[tuple[str, str]]]:
    """Per row of half B, the (question, answer) pairs of half A with the same ``entity`` (rule
    robustness_halves writes it; rows without one form a single entity), in A's order."""
    by_entity: dict[str, list[tuple[str, str]]] = {}
    for r in half_a:
        by_entity.setdefault(str(r.get("entity", "")), []).append(qa_pair(r))
    return [by_entity.get(str(r.get("entity", "")), []) for r in half_b]


def rule_scale(selection_csv: str, method: str, rank: int) -> float:
    """λ the track's λ rule picked for ``method`` at ``rank`` (rule tradeoff's
    ``<track>_tradeoff_selection.csv``: columns method, rank, selected_scale); a one-line ValueError
    naming the file where the row is missing."""
    import pandas as pd

    sel = pd.read_csv(selection_csv)
    hit = sel[(sel["method"] == method) & (sel["rank"] == int(rank))]
    if len(hit) != 1:
        raise ValueError(f"{selection_csv}: no selected λ of {method} at k={rank}")
    return float(hit["selected_scale"].iloc[0])


def attacked_model(model):
    """The weights an attacker holds, every parameter trainable: an erase adapter (a PEFT model) merged
    into the weights it edits. PEFT loads a model's own weights frozen, and the merge keeps them so; a
    full-parameter attack trains them all, as it does a checkpoint loaded on its own."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model.requires_grad_(True)


def linear_weights(model) -> dict[str, torch.Tensor]:
    """{module: weight} of every ``torch.nn.Linear`` (d_out, d_in), by the module names the erase uses."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {n: m.weight for n, m in inner.named_modules() if isinstance(m, torch.nn.Linear)}


def text_target(
    tokenizer,
    template: PromptTemplate,
    scored: Mapping[str, Sequence[Mapping[str, Any]]],
    training: Mapping[str, Sequence[Mapping[str, Any]]],
    eval_cfg: EvalConfig,
    rates: Mapping[str, tuple[float, int]],
    max_length: int,
    lora_cfg: Any = None,
    prompts: PromptSetup | None = None,
) -> AttackTarget:
    """The attack target of a text model. ``scored``: set name -> QA rows scored after every budget;
    ``training``: ``A`` and ``retain`` QA rows; ``rates``: mode -> (lr, batch size); ``max_length``:
    the training token cap; ``lora_cfg``: a :class:`qrerase.text.training.LoraTrainConfig` (None: no
    LoRA attack); ``prompts``: the prompt attacks on set ``B`` (None: none). Their examples are built here,
    before any attack runs: an m larger than an entity's facts in half A is a one-line ValueError naming
    ``robustness.in_context``; an attack (at an m) whose prompts do not all fit the model's context is not
    run, with a warning in the job's log naming the key (the table shows it empty).
    """
    pairs = {name: [qa_pair(r) for r in rows] for name, rows in scored.items()}
    attacked = _prompt_examples(tokenizer, template, pairs.get("B", []), eval_cfg, prompts) if prompts else {}
    runs = sorted(attacked, key=lambda k: (list(prompts.attacks).index(k[0]), k[1])) if prompts else []
    for name, rows in training.items():
        if not rows:
            raise ValueError(f"robustness: training set {name!r} is empty")
    examples = {
        name: encode_qa_many(tokenizer, template, [qa_pair(r) for r in rows], max_length)
        for name, rows in training.items()
    }
    pad_id = pad_token_id(tokenizer)

    def score(model, names=None) -> dict[str, float]:
        out = {}
        for name, ps in pairs.items():
            if names is not None and name not in names:
                continue
            losses = answer_losses(model, tokenizer, template, ps, eval_cfg)
            out[name] = float(np.mean([s / max(n, 1) for s, n in losses]))
        return out

    def prompt(model, attack: str, budget: int) -> dict[str, float]:
        losses = example_losses(model, attacked[(attack, budget)], eval_cfg.batch_size, pad_id)
        return {"B": float(np.mean([s / max(n, 1) for s, n in losses]))}

    def loss(model, name: str, idx: list[int]) -> torch.Tensor:
        nll, _ = answer_token_nll(model, collate([examples[name][i] for i in idx], pad_id))
        return nll.mean()

    def add_lora(model):
        from ..text.training import add_lora as wrap

        return wrap(model, lora_cfg)

    return AttackTarget(
        score=score,
        sizes={name: len(ex) for name, ex in examples.items()},
        loss=loss,
        rates=rates,
        add_lora=add_lora if lora_cfg is not None else None,
        weights=linear_weights,
        prompt=prompt if prompts else None,
        prompt_runs=tuple(runs),
    )


def _prompt_examples(tokenizer, template, pairs, eval_cfg: EvalConfig, setup: PromptSetup) -> dict:
    """{(attack, budget): encoded examples} of every prompt attack of ``setup`` on ``pairs`` (set B)."""
    out = {}
    for attack in setup.attacks:
        key = {"paraphrase": "prompt_attacks"}.get(attack, attack)
        for budget in setup.grid if attack == "in_context" else (1,):
            kw: dict[str, Any] = {}
            if attack == "paraphrase":
                if setup.paraphrases is None:
                    raise ValueError("robustness.prompt_attacks: paraphrase, but half B has no paraphrased questions")
                kw["paraphrases"] = setup.paraphrases
            elif attack == "prefix":
                kw["prefix"] = setup.prefix
            else:
                short = min((len(f) for f in setup.facts), default=0)
                if budget > short:
                    raise ValueError(
                        f"config key 'robustness.in_context': m = {budget}, but an entity has {short} fact(s) in half A"
                    )
                kw["facts"] = [f[:budget] for f in setup.facts]
            examples = prompt_examples(tokenizer, template, pairs, eval_cfg.max_length, attack, **kw)
            longest = max((len(e[0]) for e in examples), default=0)
            if setup.context is not None and longest > setup.context:  # not run: the data do not fit
                _log.warning(
                    "%s at %d not run: its prompts reach %d tokens, beyond the model's context of %d (robustness.%s)",
                    attack,
                    budget,
                    longest,
                    setup.context,
                    key,
                )
                continue
            out[(attack, budget)] = examples
    return out
