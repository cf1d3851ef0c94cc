"""TOFU evaluation protocol: answer losses, greedy generations and ROUGE recall per eval set.

:func:`evaluate_log` produces, for the four TOFU eval sets, the per-question fields of TOFU's eval
logs (``eval_log_forget.json``, ``eval_log.json``, ``eval_real_author_wo_options.json``,
``eval_real_world_wo_options.json``), keyed like TOFU's by the question index as a string:

=========================  ===============================================================
``gt_loss``                summed NLL of the answer tokens (EOS included)
``num_token_gt``           number of answer tokens
``avg_gt_loss``            ``gt_loss / num_token_gt``
``paraphrased_loss`` ...   the same for the paraphrased answer (``answer`` when absent)
``perturb_loss`` ...       lists, one entry per perturbed answer
``rouge1_recall``          ROUGE-1 / ROUGE-L recall of the greedy answer vs the answer (TOFU's stemmed
                           English tokenizer, or :class:`UnicodeWords` for other languages)
``rougeL_recall``
``generated_text``         ``[prompt, generation, answer]`` (TOFU's order: input, output, truth)
=========================  ===============================================================

Metric aggregation (truth ratio, probability, Model Utility, Forget Quality) is done elsewhere
(:mod:`qrerase.metrics.log_metrics`) from these logs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config import from_mapping
from ..engine.placement import model_device
from .data import EVAL_FIELDS
from .eval_log import EVAL_SETS, FILES
from .lm import (
    PromptTemplate,
    answer_token_nll,
    bucketed_batches,
    collate,
    encode_prompts,
    encode_qa_many,
    pad_token_id,
    qa_pair,
)

__all__ = [
    "EvalConfig",
    "UnicodeWords",
    "ROUGE_TOKENIZERS",
    "rouge_recalls",
    "answer_losses",
    "example_losses",
    "greedy_generate",
    "evaluate_set",
    "evaluate_log",
    "LOG_FILES",
]

#: ROUGE tokenizers: TOFU's (English, stemmed) and :class:`UnicodeWords` (any language).
ROUGE_TOKENIZERS = ("english", "unicode")

#: eval-set key -> TOFU eval-log file name (:data:`qrerase.text.eval_log.FILES`, in the eval-set order)
LOG_FILES = {s: FILES[s] for s in EVAL_SETS}


_log = logging.getLogger("qrerase.evaluation")


#: the keys of an ``evaluate`` config section that size the evaluation sets (read by the data rules)
SET_CAPS = ("max_questions", "max_forget_questions")


@dataclass
class EvalConfig:
    """Batch size (loss and generation), generation length and the per-example token cap.

    ``max_length`` ``None`` (the default): no cap, every sequence is scored whole, so its length comes
    from the data and the template. A cap shortens longer answers; each evaluation then logs how many
    sequences it cut (the job's log, logger ``qrerase.evaluation``).
    """

    batch_size: int = 32
    max_new_tokens: int = 48
    max_length: int | None = None  # None: no cap (every sequence whole); a cap's cuts are logged
    # "english": rouge_score's English tokenizer + stemmer; "unicode": see UnicodeWords
    rouge_tokenizer: str = "english"

    def __post_init__(self):
        if self.rouge_tokenizer not in ROUGE_TOKENIZERS:
            raise ValueError(
                f"evaluation config: rouge_tokenizer must be one of {list(ROUGE_TOKENIZERS)}, "
                f"got {self.rouge_tokenizer!r}"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> EvalConfig:
        return from_mapping(cls, d, "evaluation config")

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None) -> EvalConfig:
        """From a config ``evaluate`` section, less its set-size caps (:data:`SET_CAPS`: the data
        rules cut the sets; the evaluation scores whatever set it is given)."""
        return cls.from_dict({k: v for k, v in (section or {}).items() if k not in SET_CAPS})


def _length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches in increasing length, ties in index order (no shuffling: evaluation order is fixed)."""
    return bucketed_batches(lengths, batch_size, seed=0, shuffle=False)


def answer_losses(
    model, tokenizer, template: PromptTemplate, pairs: Sequence[tuple[str, str]], cfg: EvalConfig, progress=None
) -> list[tuple[float, int]]:
    """``(sum_nll, n_tokens)`` over the answer tokens (EOS included) of every ``(question, answer)``.

    Pairs are sorted by length and right-padded into batches of ``cfg.batch_size`` (one forward pass
    each, under ``torch.inference_mode``); results come back in input order and equal the unbatched
    values up to float rounding. ``progress`` is an optional tqdm bar advanced once per pair.
    """
    cut: list[int] = []
    examples = encode_qa_many(tokenizer, template, pairs, cfg.max_length, cut=cut)
    if cfg.max_length is not None:  # the evaluation log counts every sequence the cap shortened
        _log.info("answer losses: %d of %d sequences cut at max_length %d", len(cut), len(pairs), cfg.max_length)
    return example_losses(model, examples, cfg.batch_size, pad_token_id(tokenizer), progress)


def example_losses(
    model, examples: Sequence[tuple[list[int], list[int]]], batch_size: int, pad_id: int, progress=None
) -> list[tuple[float, int]]:
    """``(sum_nll, n_tokens)`` over the labelled tokens of every encoded ``(input_ids, labels)`` example
    (labels ``-100`` elsewhere), as :func:`answer_losses` scores them: sorted by length, right-padded into
    batches of ``batch_size``, one forward pass each under ``torch.inference_mode``, input order kept."""
    out: list[tuple[float, int]] = [(0.0, 0)] * len(examples)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for idx in _length_batches([len(e[0]) for e in examples], batch_size):
                nll, mask = answer_token_nll(model, collate([examples[i] for i in idx], pad_id))
                per_tok = torch.zeros(mask.shape, dtype=nll.dtype).masked_scatter(mask, nll)
                sums, counts = per_tok.sum(1).tolist(), mask.sum(1).tolist()
                for j, i in enumerate(idx):
                    out[i] = (float(sums[j]), int(counts[j]))
                if progress is not None:
                    progress.update(len(idx))
    finally:
        model.train(was_training)
    return out


def greedy_generate(
    model, tokenizer, template: PromptTemplate, questions: Sequence[str], cfg: EvalConfig, progress=None
) -> list[str]:
    """Greedy answers to ``questions`` (decoded new tokens only, special tokens dropped, stripped).

    Prompts are encoded exactly as in training (BOS + prompt), sorted by length and LEFT-padded into
    batches of ``cfg.batch_size``; decoding stops at EOS or after ``cfg.max_new_tokens``. The
    tokenizer's ``padding_side`` is left as it was.
    """
    prompts = encode_prompts(tokenizer, template, questions)
    pad_id = pad_token_id(tokenizer)
    eos_id = tokenizer.eos_token_id
    out = [""] * len(prompts)
    saved_side = getattr(tokenizer, "padding_side", None)
    was_training = model.training
    model.eval()
    try:
        if saved_side is not None:
            tokenizer.padding_side = "left"
        with torch.inference_mode():
            for idx in _length_batches([len(p) for p in prompts], cfg.batch_size):
                width = max(len(prompts[i]) for i in idx)
                input_ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
                attention_mask = torch.zeros((len(idx), width), dtype=torch.long)
                for j, i in enumerate(idx):
                    ids = prompts[i]
                    input_ids[j, width - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
                    attention_mask[j, width - len(ids) :] = 1
                device = model_device(model)
                gen = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    max_new_tokens=cfg.max_new_tokens,
                    do_sample=False,
                    num_beams=1,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    pad_token_id=pad_id,
                    eos_token_id=eos_id,
                )
                texts = tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
                for j, i in enumerate(idx):
                    out[i] = texts[j].strip()
                if progress is not None:
                    progress.update(len(idx))
    finally:
        if saved_side is not None:
            tokenizer.padding_side = saved_side
        model.train(was_training)
    return out


#: CJK ideographs, kana and CJK punctuation blocks: scripts written without spaces, one token per character.
_CJK_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF66, 0xFF9F))


class UnicodeWords:
    """A ROUGE tokenizer for any language (``rouge_score`` accepts any object with ``tokenize``).

    ``rouge_score``'s default tokenizer keeps only ``[a-z0-9]`` and so scores every Devanagari,
    Arabic or Japanese answer 0 (and splits romanised words at diacritics). Here text is NFKC-normalised
    and case-folded; tokens are maximal runs of letters, combining marks and digits (Unicode categories
    L*, M*, N*); characters of scripts written without spaces (CJK ideographs, kana) are one token
    each. No stemming. On plain English it gives the same tokens as ``rouge_score`` without stemmer.
    """

    def tokenize(self, text: str) -> list[str]:
        import unicodedata

        tokens: list[str] = []
        word: list[str] = []
        for ch in unicodedata.normalize("NFKC", text).casefold():
            code = ord(ch)
            if any(a <= code <= b for a, b in _CJK_RANGES):
                if word:
                    tokens.append("".join(word))
                    word = []
                tokens.append(ch)
            elif unicodedata.category(ch)[0] in "LMN":
                word.append(ch)
            elif word:
                tokens.append("".join(word))
                word = []
        if word:
            tokens.append("".join(word))
        return tokens


def rouge_recalls(
    generations: Sequence[str], answers: Sequence[str], tokenizer: str = "english"
) -> tuple[list[float], list[float]]:
    """ROUGE-1 and ROUGE-L recall of each generation against its answer: ``(rouge1, rougeL)``, floats.

    ``tokenizer="english"`` is TOFU's own scoring (``RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    .score(answer, generation)``, English, stemmed); ``"unicode"`` splits words with
    :class:`UnicodeWords` (any language, no stemming). Pairs are zipped in order.
    """
    from rouge_score import rouge_scorer

    if tokenizer == "english":
        scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    elif tokenizer == "unicode":
        scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], tokenizer=UnicodeWords())
    else:
        raise ValueError(f"evaluation: rouge_tokenizer must be one of {list(ROUGE_TOKENIZERS)}, got {tokenizer!r}")
    r1, rl = [], []
    for gen, gt in zip(generations, answers):
        s = scorer.score(gt, gen)
        r1.append(float(s["rouge1"].recall))
        rl.append(float(s["rougeL"].recall))
    return r1, rl


def evaluate_set(
    model,
    tokenizer,
    template: PromptTemplate,
    records: Sequence[Mapping[str, Any]],
    cfg: EvalConfig,
    desc: str = "eval",
    paraphrased: bool = True,
) -> dict[str, dict[str, Any]]:
    """TOFU eval-log fields for one eval set (see the module docstring); keys ``"0"``, ``"1"``, ...

    Each record needs ``question``, ``answer`` and ``perturbed_answer`` (a non-empty list), and, where
    the set's format has paraphrases (``paraphrased``: TOFU's forget and retain sets,
    :data:`qrerase.text.data.EVAL_FIELDS`), ``paraphrased_answer``. A set whose format has none
    (``paraphrased=False``: TOFU's real-authors and world-facts sets) scores the answer in its place.
    A missing required field is a ValueError naming the set and the record. All answer losses of the
    set go through one batched pass, then the greedy generations.
    """
    questions, answers, paraphrases, perturbed = [], [], [], []
    for k, r in enumerate(records):
        q, a = qa_pair(r)
        pert = r.get("perturbed_answer")
        if isinstance(pert, str):
            pert = [pert]
        if not pert:
            raise ValueError(f"{desc}: record {k} has no perturbed_answer list")
        para = r.get("paraphrased_answer")
        if paraphrased and not (isinstance(para, str) and para.strip()):
            raise ValueError(f"{desc}: record {k} has no paraphrased_answer")
        questions.append(q)
        answers.append(a)
        paraphrases.append(str(para) if paraphrased else str(para or a))
        perturbed.append([str(p) for p in pert])
    pairs = [(q, a) for q, a in zip(questions, answers)]
    pairs += [(q, p) for q, p in zip(questions, paraphrases)]
    for q, ps in zip(questions, perturbed):
        pairs += [(q, p) for p in ps]
    n = len(questions)
    bar = tqdm(total=len(pairs) + n, desc=desc, file=sys.stderr, mininterval=1.0, dynamic_ncols=True, leave=False)
    try:
        losses = answer_losses(model, tokenizer, template, pairs, cfg, progress=bar)
        generations = greedy_generate(model, tokenizer, template, questions, cfg, progress=bar)
    finally:
        bar.close()
    r1, rl = rouge_recalls(generations, answers, cfg.rouge_tokenizer)

    log: dict[str, dict[str, Any]] = {
        name: {}
        for name in (
            "avg_gt_loss",
            "gt_loss",
            "num_token_gt",
            "avg_paraphrased_loss",
            "paraphrased_loss",
            "num_token_paraphrased",
            "average_perturb_loss",
            "perturb_loss",
            "num_token_perturb",
            "rouge1_recall",
            "rougeL_recall",
            "generated_text",
        )
    }
    pos = 2 * n
    for i in range(n):
        key = str(i)
        gt_sum, gt_n = losses[i]
        pa_sum, pa_n = losses[n + i]
        pert = losses[pos : pos + len(perturbed[i])]
        pos += len(perturbed[i])
        log["gt_loss"][key], log["num_token_gt"][key], log["avg_gt_loss"][key] = gt_sum, gt_n, gt_sum / gt_n
        log["paraphrased_loss"][key], log["num_token_paraphrased"][key] = pa_sum, pa_n
        log["avg_paraphrased_loss"][key] = pa_sum / pa_n
        log["perturb_loss"][key] = [s for s, _ in pert]
        log["num_token_perturb"][key] = [c for _, c in pert]
        log["average_perturb_loss"][key] = [s / c for s, c in pert]
        log["rouge1_recall"][key], log["rougeL_recall"][key] = r1[i], rl[i]
        log["generated_text"][key] = [template.prompt(questions[i]), generations[i], answers[i]]
    return log


def evaluate_log(
    model, tokenizer, template: PromptTemplate, eval_sets: Mapping[str, Sequence[Mapping[str, Any]]], cfg: EvalConfig
) -> dict[str, dict[str, dict[str, Any]]]:
    """Evaluate the four TOFU sets; returns ``{TOFU log file name: evaluate_set(...)}``.

    ``eval_sets`` maps ``forget``, ``retain``, ``real_authors`` and ``world_facts`` to records (any
    subset of these keys may be given; unknown keys are an error).
    """
    unknown = sorted(set(eval_sets) - set(LOG_FILES))
    if unknown:
        raise ValueError(f"unknown eval set(s) {unknown}; expected some of {sorted(LOG_FILES)}")
    return {
        LOG_FILES[name]: evaluate_set(
            model,
            tokenizer,
            template,
            eval_sets[name],
            cfg,
            desc=f"eval {name}",
            paraphrased="paraphrased_answer" in EVAL_FIELDS[name],
        )
        for name in LOG_FILES
        if name in eval_sets
    }
