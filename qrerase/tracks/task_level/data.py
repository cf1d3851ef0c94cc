"""Task-level unlearning data and evaluation (the UNLEARN benchmark of the paper's Table 1, small).

A *skill* is a family of questions with one correct short answer. The track forgets one skill and
keeps two: a *similar* one (it shares the forgotten skill's computations) and an *unrelated* one.
Three skills are generated here, deterministically from a seed:

``arithmetic`` (HELM-style two-operand integer arithmetic)
    ``What is {a} {op} {b}?`` → the integer result. ``op`` ∈ ``ops`` (``+``, ``-``, ``*``); operands
    in ``[min_operand, max_operand]``; subtraction only with ``a >= b`` (results are never negative).
``word_math`` (multi-step maths in words: linear equations and two-step word problems)
    ``Solve for x: x + {a} = {b}.`` → ``b - a`` (``b >= a``); ``Solve for x: x - {a} = {b}.`` →
    ``a + b``; ``Solve for x: {a}x = {b}.`` → ``b / a`` (``a`` in 2..9, ``x`` in 0..9);
    ``{Name} has {a} {items}. {He/She} gets {b} more and then gives away {c}. How many {items} does
    {Name} have now?`` → ``a + b - c`` (``a + b >= c``); ``{Name} had {a} {items} and gave away {b}.
    Then {he/she} bought {c} more. How many {items} does {Name} have now?`` → ``a - b + c``
    (``a >= b``). Numbers ``a, b, c`` in ``1..max_number``; names and items from fixed lists.
``knowledge`` (multiple-choice knowledge, MMLU-style)
    TOFU's ``world_facts`` / ``real_authors`` questions with their four options, shuffled with the
    seed and lettered: ``{question} A. {o1} B. {o2} C. {o3} D. {o4}`` → the letter of the correct
    option (``format: letter``, MMLU's format). ``format: cloze`` (MMLU's continuation variant, as
    lm-evaluation-harness scores it): the item is the plain ``question`` → the correct option's text,
    with the four options kept; the model's answer is the option it gives the lowest token-mean NLL
    (:func:`qrerase.tracks.task_level.evaluation.evaluate_skill`). The facts themselves (``question`` → ``answer``)
    are training data of every model (``knowledge_facts``), standing in for what a pretrained LLM
    knows: with ``letter`` the *multiple-choice items* of the evaluation split are never trained;
    with ``cloze`` an evaluation item's question is such a trained fact and only the choice among
    its options is new.

Every skill's question universe is enumerable, so distinct questions are drawn by sampling indices
without replacement (``numpy.random.default_rng(seed + skill offset)``), then cut into disjoint
``train`` / ``eval`` / ``new`` splits (``new``: held-out data for KGA's D_n and KU's threshold).
:func:`check_task_level_config` rejects an unknown skill, an empty split or more questions than the
universe holds before anything runs.

Evaluation lives in :mod:`qrerase.tracks.task_level.evaluation`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...io import read_jsonl_numbered

__all__ = [
    "SKILLS",
    "ROLES",
    "SPLITS",
    "KNOWLEDGE_SOURCES",
    "ArithmeticConfig",
    "WordMathConfig",
    "KnowledgeConfig",
    "TaskLevelDataConfig",
    "check_task_level_config",
    "skill_universe",
    "generate_skill",
    "make_task_level_sets",
]

SKILLS = ("arithmetic", "word_math", "knowledge")
ROLES = ("forget", "similar", "unrelated")
SPLITS = ("train", "eval", "new")
KNOWLEDGE_SOURCES = ("world_facts", "real_authors")
KNOWLEDGE_FORMATS = ("letter", "cloze")
ARITHMETIC_OPS = ("+", "-", "*")
NAMES = ("Anna", "Ben", "Clara", "David", "Emma", "Farid", "Grace", "Hugo")
PRONOUNS = ("She", "He", "She", "He", "She", "He", "She", "He")
ITEMS = ("apples", "marbles", "books", "coins", "stickers", "pencils", "shells", "cards")
LETTERS = "ABCD"


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArithmeticConfig:
    ops: tuple[str, ...] = ("+", "-")
    min_operand: int = 0
    max_operand: int = 99


@dataclass(frozen=True)
class WordMathConfig:
    max_number: int = 30


@dataclass(frozen=True)
class KnowledgeConfig:
    """``format``: ``letter`` (options listed in the question, the answer is a letter) or ``cloze``
    (the plain question, the answer is the correct option's text, the options ranked by likelihood)."""

    root: str = "data/tofu"
    sources: tuple[str, ...] = KNOWLEDGE_SOURCES
    format: str = "letter"


@dataclass(frozen=True)
class TaskLevelDataConfig:
    """The ``task_level.data`` config section.

    ``forget`` / ``similar`` / ``unrelated``: the skill of each role (distinct, from :data:`SKILLS`).
    ``sizes``: per skill ``{train, eval, new}`` question counts. ``knowledge_facts``: train every
    model on the plain knowledge facts (question → answer) of all splits too.
    """

    forget: str = "arithmetic"
    similar: str = "word_math"
    unrelated: str = "knowledge"
    sizes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    word_math: WordMathConfig = WordMathConfig()
    knowledge: KnowledgeConfig = KnowledgeConfig()
    knowledge_facts: bool = True

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskLevelDataConfig:
        d = dict(d)
        sub = {"arithmetic": ArithmeticConfig, "word_math": WordMathConfig, "knowledge": KnowledgeConfig}
        for key, klass in sub.items():
            if key in d:
                v = dict(d[key])
                for k in ("ops", "sources"):
                    if k in v:
                        v[k] = tuple(v[k])
                d[key] = klass(**v)
        return cls(**d)

    def roles(self) -> dict[str, str]:
        return {"forget": self.forget, "similar": self.similar, "unrelated": self.unrelated}


def check_task_level_config(cfg: TaskLevelDataConfig) -> None:
    """``ValueError`` with a one-line message naming the key, for any unusable setting."""
    roles = cfg.roles()
    for role, skill in roles.items():
        if skill not in SKILLS:
            raise ValueError(f"task_level.data.{role}: unknown skill {skill!r}; expected one of {list(SKILLS)}")
    if len(set(roles.values())) != len(roles):
        raise ValueError(f"task_level.data: the roles need three different skills, got {roles}")
    a = cfg.arithmetic
    for op in a.ops:
        if op not in ARITHMETIC_OPS:
            raise ValueError(
                f"task_level.data.arithmetic.ops: unknown operator {op!r}; expected some of {list(ARITHMETIC_OPS)}"
            )
    if not a.ops:
        raise ValueError("task_level.data.arithmetic.ops: needs at least one operator")
    if not 0 <= a.min_operand <= a.max_operand:
        raise ValueError(
            f"task_level.data.arithmetic: need 0 <= min_operand <= max_operand, got {a.min_operand}, {a.max_operand}"
        )
    if cfg.word_math.max_number < 1:
        raise ValueError(f"task_level.data.word_math.max_number: must be >= 1, got {cfg.word_math.max_number}")
    for s in cfg.knowledge.sources:
        if s not in KNOWLEDGE_SOURCES:
            raise ValueError(
                f"task_level.data.knowledge.sources: unknown source {s!r}; expected some of {list(KNOWLEDGE_SOURCES)}"
            )
    if not cfg.knowledge.sources:
        raise ValueError("task_level.data.knowledge.sources: needs at least one source")
    if cfg.knowledge.format not in KNOWLEDGE_FORMATS:
        raise ValueError(
            f"task_level.data.knowledge.format: unknown {cfg.knowledge.format!r}; "
            f"expected one of {list(KNOWLEDGE_FORMATS)}"
        )
    for skill in roles.values():
        sizes = cfg.sizes.get(skill)
        if sizes is None:
            raise ValueError(f"task_level.data.sizes.{skill}: missing (train, eval, new question counts)")
        for split in SPLITS:
            n = sizes.get(split)
            if n is None or n < 1:
                raise ValueError(
                    f"task_level.data.sizes.{skill}.{split}: must be an integer >= 1 (an empty split), got {n}"
                )
        total = sum(sizes[s] for s in SPLITS)
        have = skill_universe(skill, cfg)
        if total > have:
            raise ValueError(
                f"task_level.data.sizes.{skill}: {total} distinct questions requested (train + eval + new) but the "
                f"{skill} settings can produce only {have}"
            )


# --------------------------------------------------------------------------------------------------
# Question universes: count, and decode an index into a question
# --------------------------------------------------------------------------------------------------


def _arith_counts(a: ArithmeticConfig) -> list[tuple[str, int]]:
    r = a.max_operand - a.min_operand + 1
    return [(op, r * (r + 1) // 2 if op == "-" else r * r) for op in a.ops]


def _arith_decode(a: ArithmeticConfig, idx: int) -> dict:
    r = a.max_operand - a.min_operand + 1
    for op, count in _arith_counts(a):  # noqa: B007 - `op` is read after the break
        if idx < count:
            break
        idx -= count
    if op == "-":  # triangular index -> (x, y) with y <= x
        x = int((math.isqrt(8 * idx + 1) - 1) // 2)
        y = idx - x * (x + 1) // 2
    else:
        x, y = divmod(idx, r)
    x, y = x + a.min_operand, y + a.min_operand
    value = {"+": x + y, "-": x - y, "*": x * y}[op]
    return {"question": f"What is {x} {op} {y}?", "answer": str(value)}


def _word_templates(m: int) -> list[tuple[str, np.ndarray, bool]]:
    """(template name, valid number tuples as rows, uses name/item) of the word_math grammar."""
    n = np.arange(1, m + 1)
    a2, b2 = (g.ravel() for g in np.meshgrid(n, n, indexing="ij"))
    a3, b3, c3 = (g.ravel() for g in np.meshgrid(n, n, n, indexing="ij"))
    ax, xx = (g.ravel() for g in np.meshgrid(np.arange(2, 10), np.arange(0, 10), indexing="ij"))
    return [
        ("eq_add", np.stack([a2, b2], 1)[b2 >= a2], False),
        ("eq_sub", np.stack([a2, b2], 1), False),
        ("eq_mul", np.stack([ax, ax * xx], 1), False),
        ("story_gain", np.stack([a3, b3, c3], 1)[a3 + b3 >= c3], True),
        ("story_loss", np.stack([a3, b3, c3], 1)[a3 >= b3], True),
    ]


def _word_decode(templates, idx: int) -> dict:
    per_story = len(NAMES) * len(ITEMS)
    for name, rows, story in templates:  # noqa: B007 - `name` is read after the break
        count = len(rows) * (per_story if story else 1)
        if idx < count:
            break
        idx -= count
    if story:
        idx, who = divmod(idx, len(NAMES))
        idx, what = divmod(idx, len(ITEMS))
    a, b, *rest = (int(v) for v in rows[idx])
    if name == "eq_add":
        return {"question": f"Solve for x: x + {a} = {b}.", "answer": str(b - a)}
    if name == "eq_sub":
        return {"question": f"Solve for x: x - {a} = {b}.", "answer": str(a + b)}
    if name == "eq_mul":
        return {"question": f"Solve for x: {a}x = {b}.", "answer": str(b // a)}
    c = rest[0]
    person, pron, item = NAMES[who], PRONOUNS[who], ITEMS[what]
    if name == "story_gain":
        q = (
            f"{person} has {a} {item}. {pron} gets {b} more and then gives away {c}. "
            f"How many {item} does {person} have now?"
        )
        return {"question": q, "answer": str(a + b - c)}
    q = (
        f"{person} had {a} {item} and gave away {b}. Then {pron.lower()} bought {c} more. "
        f"How many {item} does {person} have now?"
    )
    return {"question": q, "answer": str(a - b + c)}


def _knowledge_facts(k: KnowledgeConfig) -> list[dict]:
    facts = []
    for source in k.sources:
        path = Path(k.root) / f"{source}.jsonl"
        if not path.is_file():
            raise ValueError(f"task_level.data.knowledge.root: {path} not found")
        for line, r in read_jsonl_numbered(path):
            options = [r.get(f"option{j}") for j in range(1, 5)]
            if (
                any(o is None for o in options)
                or r.get("answer") not in options
                or not isinstance(r.get("question"), str)
            ):
                raise ValueError(f"{path}:{line}: needs question and option1..option4 with the answer among them")
            facts.append({"question": r["question"], "answer": r["answer"], "options": options, "source": source})
    return facts


def skill_universe(skill: str, cfg: TaskLevelDataConfig) -> int:
    """How many distinct questions ``skill`` can produce under ``cfg``."""
    if skill == "arithmetic":
        return sum(c for _, c in _arith_counts(cfg.arithmetic))
    if skill == "word_math":
        per_story = len(NAMES) * len(ITEMS)
        return sum(
            len(rows) * (per_story if story else 1) for _, rows, story in _word_templates(cfg.word_math.max_number)
        )
    if skill == "knowledge":
        return len(_knowledge_facts(cfg.knowledge))
    raise ValueError(f"unknown skill {skill!r}; expected one of {list(SKILLS)}")


def _mc_item(fact: dict, rng: np.random.Generator, fmt: str = "letter") -> dict:
    order = rng.permutation(4)
    options = [fact["options"][int(j)] for j in order]
    meta = {"fact_answer": fact["answer"], "source": fact["source"]}
    if fmt == "cloze":
        return {"question": fact["question"], "answer": fact["answer"], "options": options, **meta}
    listed = " ".join(f"{LETTERS[j]}. {o}" for j, o in enumerate(options))
    return {"question": f"{fact['question']} {listed}", "answer": LETTERS[options.index(fact["answer"])], **meta}


def _balanced_picks(counts: Sequence[int], total: int, rng: np.random.Generator) -> np.ndarray:
    """``total`` distinct indices into the concatenation of families of sizes ``counts``, spread as
    evenly as the families allow (each family gets an equal share, a full family's remainder goes to
    the others), drawn without replacement within each family, in a seeded random order."""
    share = [0] * len(counts)
    left = total
    open_ = [j for j, c in enumerate(counts) if c > 0]
    while left > 0 and open_:
        each, extra = divmod(left, len(open_))
        for rank, j in enumerate(open_):
            add = min(each + (1 if rank < extra else 0), counts[j] - share[j])
            share[j] += add
            left -= add
        open_ = [j for j in open_ if share[j] < counts[j]]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    picks = np.concatenate(
        [offsets[j] + rng.choice(counts[j], size=share[j], replace=False) for j in range(len(counts)) if share[j]]
    )
    return picks[rng.permutation(len(picks))]


def generate_skill(skill: str, cfg: TaskLevelDataConfig, seed: int) -> dict[str, list[dict]]:
    """``{split: records}`` of one skill: distinct questions, disjoint splits, sizes from ``cfg.sizes``.

    Records: ``question``, ``answer`` (the single correct short answer), ``skill``; knowledge items
    add ``fact_answer`` and ``source``. Deterministic for (``skill``, ``cfg``, ``seed``).
    """
    sizes = cfg.sizes[skill]
    total = sum(int(sizes[s]) for s in SPLITS)
    rng = np.random.default_rng([int(seed), SKILLS.index(skill)])
    have = skill_universe(skill, cfg)
    if total > have:
        raise ValueError(f"task_level.data.sizes.{skill}: {total} questions requested, the universe holds {have}")
    if skill == "arithmetic":
        picks = _balanced_picks([c for _, c in _arith_counts(cfg.arithmetic)], total, rng)
        records = [_arith_decode(cfg.arithmetic, int(i)) for i in picks]
    elif skill == "word_math":
        templates = _word_templates(cfg.word_math.max_number)
        per_story = len(NAMES) * len(ITEMS)
        counts = [len(rows) * (per_story if story else 1) for _, rows, story in templates]
        records = [_word_decode(templates, int(i)) for i in _balanced_picks(counts, total, rng)]
    else:
        facts = _knowledge_facts(cfg.knowledge)
        records = [
            _mc_item(facts[int(i)], rng, cfg.knowledge.format) for i in rng.choice(have, size=total, replace=False)
        ]
    out, start = {}, 0
    for split in SPLITS:
        n = int(sizes[split])
        out[split] = [{**r, "skill": skill} for r in records[start : start + n]]
        start += n
    return out


def make_task_level_sets(cfg: TaskLevelDataConfig, seed: int) -> dict[str, list[dict]]:
    """Every data set of the track, by file name.

    ``forget`` (forget skill, train split), ``retain`` (similar + unrelated skills, train split),
    ``new`` (the ``new`` split of all three skills), ``finetune_full`` (forget + retain, plus the
    plain knowledge facts when ``knowledge_facts``), ``pretrain`` (``finetune_full`` without the
    forget skill: the retained skills and the facts, what the pretrained checkpoint learns, the
    analogue of TOFU's pretraining on authors in neither set), ``tune_retain`` (the ``new`` split of
    the similar and unrelated skills: the held-out slice the λ rule reads; in no training run of the
    subspace methods and in no table), and the held-out sets under the names the
    generic tokenizer rule reads: ``eval_forget`` (forget skill), ``eval_retain`` (similar skill),
    ``eval_real_authors`` / ``eval_world_facts`` (the unrelated skill's items by TOFU source when it
    is ``knowledge``; otherwise its items and an empty file). :func:`eval_roles` maps them back to roles.
    """
    check_task_level_config(cfg)
    roles = cfg.roles()
    skills = {role: generate_skill(skill, cfg, seed) for role, skill in roles.items()}
    retain = skills["similar"]["train"] + skills["unrelated"]["train"]
    facts = []
    if cfg.knowledge_facts and "knowledge" in roles.values():
        facts = [
            {"question": f["question"], "answer": f["answer"], "skill": "knowledge_fact"}
            for f in _knowledge_facts(cfg.knowledge)
        ]
    full = skills["forget"]["train"] + retain + facts
    unrelated = skills["unrelated"]["eval"]
    if roles["unrelated"] == "knowledge":
        by_source = {s: [r for r in unrelated if r["source"] == s] for s in KNOWLEDGE_SOURCES}
    else:
        by_source = {"real_authors": unrelated, "world_facts": []}
    return {
        "forget": skills["forget"]["train"],
        "retain": retain,
        "new": [r for role in ROLES for r in skills[role]["new"]],
        "finetune_full": full,
        "pretrain": retain + facts,
        "tune_retain": skills["similar"]["new"] + skills["unrelated"]["new"],
        "eval_forget": skills["forget"]["eval"],
        "eval_retain": skills["similar"]["eval"],
        "eval_real_authors": by_source["real_authors"],
        "eval_world_facts": by_source["world_facts"],
    }


#: role -> the data files (see :func:`make_task_level_sets`) holding its held-out items.
EVAL_FILES = {
    "forget": ("eval_forget",),
    "similar": ("eval_retain",),
    "unrelated": ("eval_real_authors", "eval_world_facts"),
}
