"""TOFU data: load the vendored (or hub) splits and cut the forget / retain / evaluation sets of a run.

TOFU (Maini et al., 2024) has 200 fictitious authors with 20 QA each. The standard split ``forgetXX``
holds the *last* XX% of authors, ``retain(100-XX)`` the others in ``full`` order, and
``forgetXX_perturbed`` / ``retain_perturbed`` add a paraphrased answer and perturbed answers per
question (the Truth Ratio needs them). ``retain_perturbed`` is the first 400 QA of ``full`` (the first
20 authors).

A run may subsample authors (``n_authors``) while keeping the TOFU structure: the forget set is the
*last* ``round(n_authors * XX / 100)`` authors of the forget split (or ``forget_authors`` of them),
the retain set the *first* ``n_authors - n_forget`` authors of the retain split — both therefore
have perturbed evaluation versions in the standard ``*_perturbed`` files.

The embedded tiny model is *pretrained* before it is fine-tuned, as the paper's models are: on the
``pretrain_authors`` TOFU authors that follow the retain authors in the retain split (in neither the
forget nor the retain set) plus the knowledge sets. A pretrained model knows the language of author
biographies but not the run's authors, so the retain reference's truth ratios on the forget set are
informative (a model trained from scratch on the run's QA alone has flat, ~log|V| losses there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...io import read_jsonl_numbered
from ...text.data import (
    KNOWLEDGE_SETS,
    check_distinct,
    check_eval_set,
    check_not_trained,
    log_repeats,
    normalise,
)

__all__ = [
    "QA_PER_AUTHOR",
    "N_AUTHORS",
    "SPLITS",
    "TofuDataConfig",
    "required_splits",
    "holdout_split",
    "load_split",
    "load_split_numbered",
    "author_counts",
    "check_author_blocks",
    "forget_cap",
    "make_holdout_set",
    "make_tofu_sets",
]


QA_PER_AUTHOR = 20


N_AUTHORS = 200


SPLITS = {"forget01": 1, "forget05": 5, "forget10": 10}


@dataclass(frozen=True)
class TofuDataConfig:
    """Which TOFU data a run uses (config section ``data``)."""

    source: str = "local"  # "local" (vendored JSON Lines under root) or "hub" (datasets.load_dataset)
    root: str = "data/tofu"
    hub_name: str = "locuslab/TOFU"
    split: str = "forget10"
    n_authors: int | None = 20  # None: all 200 authors
    knowledge: tuple[str, ...] = KNOWLEDGE_SETS  # QA mixed into model training (the tiny model's world knowledge)
    max_eval_questions: int = 300
    pretrain_authors: int = 0  # authors of the pretraining set (after the retain authors), disjoint from both
    forget_authors: int | None = None  # None: round(n_authors * XX / 100)
    max_forget_questions: int | None = None  # cap of eval_forget and eval_holdout; None: max_eval_questions

    @classmethod
    def from_dict(cls, d: dict) -> TofuDataConfig:
        d = dict(d)
        if "knowledge" in d:
            d["knowledge"] = tuple(d["knowledge"] or ())
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


def required_splits(split: str, knowledge=KNOWLEDGE_SETS) -> list[str]:
    """Names of the TOFU splits a run of ``split`` reads (the workflow checks and tracks these files)."""
    if split not in SPLITS:
        raise ValueError(f"data.split: expected one of {sorted(SPLITS)}, got {split!r}")
    return [
        split,
        f"{split}_perturbed",
        f"retain{100 - SPLITS[split]}",
        "retain_perturbed",
        "real_authors_perturbed",
        "world_facts_perturbed",
        *knowledge,
    ]


def holdout_split(split: str) -> str:
    """The TOFU holdout split matching a forget split (``forget10`` -> ``holdout10``): QA of other
    fictitious authors, in no training set (the non-members of the membership-inference metrics)."""
    if split not in SPLITS:
        raise ValueError(f"data.split: expected one of {sorted(SPLITS)}, got {split!r}")
    return "holdout" + split.removeprefix("forget")


def load_split(cfg: TofuDataConfig, name: str) -> list[dict]:
    """Load one TOFU split (e.g. ``retain90``, ``forget10_perturbed``) as normalised records."""
    return load_split_numbered(cfg, name)[0]


def load_split_numbered(cfg: TofuDataConfig, name: str) -> tuple[list[dict], list[str]]:
    """One TOFU split as normalised records and, per record, where it came from (``file:line``)."""
    if cfg.source == "local":
        path = Path(cfg.root) / f"{name}.jsonl"
        numbered = read_jsonl_numbered(path)
        rows = [r for _, r in numbered]
        where = [f"{path}:{line}" for line, _ in numbered]
        if not rows:
            raise ValueError(f"{path}: split is empty")
        return [normalise(r, w) for r, w in zip(rows, where)], where
    elif cfg.source == "hub":
        try:
            import datasets  # optional dependency for online users
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("data.source: hub needs the 'datasets' package (pip install datasets)") from exc
        rows = [dict(r) for r in datasets.load_dataset(cfg.hub_name, name)["train"]]
        split = f"{cfg.hub_name}:{name}"
    else:
        raise ValueError(f"data.source: expected 'local' or 'hub', got {cfg.source!r}")
    if not rows:
        raise ValueError(f"{split}: split is empty")
    lines = [f"{split}:{i + 1}" for i in range(len(rows))]
    return [normalise(r, w) for r, w in zip(rows, lines)], lines


def author_counts(cfg: TofuDataConfig) -> tuple[int, int]:
    """``(forgotten, retained)`` authors of a run: ``forget_authors`` (at most the split's, fewer than
    ``n_authors``), else ``round(n_authors * XX / 100)`` for split ``forgetXX``; the rest are retained.
    A bad count is a one-line ``ValueError`` naming the key (the workflow checks it at planning time)."""
    if cfg.split not in SPLITS:
        raise ValueError(f"data.split: expected one of {sorted(SPLITS)}, got {cfg.split!r}")
    pct = SPLITS[cfg.split]
    n = N_AUTHORS if cfg.n_authors is None else int(cfg.n_authors)
    if not 2 <= n <= N_AUTHORS:
        raise ValueError(f"data.n_authors: expected 2..{N_AUTHORS} (or null for all), got {cfg.n_authors!r}")
    in_split = N_AUTHORS * pct // 100
    if cfg.forget_authors is not None:
        n_forget = int(cfg.forget_authors)
        if not 1 <= n_forget <= min(in_split, n - 1):
            raise ValueError(
                f"data.forget_authors: expected 1..{min(in_split, n - 1)} (the {cfg.split} split has {in_split} "
                f"authors; at least one of the {n} authors is retained), got {cfg.forget_authors!r}"
            )
        return n_forget, n - n_forget
    n_forget = round(n * pct / 100)
    if n_forget < 1:
        raise ValueError(
            f"data.n_authors: {n} authors at {pct}% leave an empty forget set; use at least {round(100 / pct)} authors"
        )
    n_forget = min(n_forget, in_split)
    return n_forget, n - n_forget


def forget_cap(cfg: TofuDataConfig) -> int:
    """Questions kept in ``eval_forget`` and ``eval_holdout``: ``max_forget_questions``, else
    ``max_eval_questions`` (the cap of every other evaluation set)."""
    cap = cfg.max_eval_questions if cfg.max_forget_questions is None else cfg.max_forget_questions
    if int(cap) < 1:
        key = "max_questions" if cfg.max_forget_questions is None else "max_forget_questions"
        raise ValueError(f"evaluate.{key}: expected a positive integer, got {cap}")
    return int(cap)


def _pretrain_authors(cfg: TofuDataConfig, n_retain: int) -> int:
    n_pre = int(cfg.pretrain_authors)
    room = N_AUTHORS - N_AUTHORS * SPLITS[cfg.split] // 100 - n_retain
    if not 0 <= n_pre <= room:
        raise ValueError(
            f"data.pretrain_authors: expected 0..{room} (the retain split's authors after the {n_retain} "
            f"retained ones), got {cfg.pretrain_authors!r}"
        )
    return n_pre


def _file_of(where: list[str]) -> str:
    """The file (or hub split) of a split's ``file:line`` list."""
    return where[0].rsplit(":", 1)[0] if where else "?"


def check_author_blocks(
    rows: list[dict], where: list[str], aligned: tuple[list[dict], list[str]] | None = None
) -> None:
    """A TOFU split has no author field: an author is a block of :data:`QA_PER_AUTHOR` consecutive rows, so
    a split is refused (one line naming the file and its row count) unless its rows are whole blocks and,
    for a perturbed split, as many as its training split's (``aligned``: rows, ``file:line``), whose blocks
    it must line up with. A last author with fewer questions would otherwise shift every block: the
    forget set, the last ``20 n`` rows, would be mostly another author, and the robustness halves (cut
    within each block) would split that mixture."""
    if len(rows) % QA_PER_AUTHOR:
        raise ValueError(
            f"{_file_of(where)}: {len(rows)} rows, not a multiple of {QA_PER_AUTHOR} (a TOFU split holds "
            f"{QA_PER_AUTHOR} questions per author in file order, so its authors cannot be cut)"
        )
    if aligned is not None and len(aligned[0]) != len(rows):
        raise ValueError(
            f"{_file_of(where)}: {len(rows)} rows, but {_file_of(aligned[1])} has {len(aligned[0])} "
            "(the two splits are row-aligned, author by author)"
        )


def _check_aligned(train: list[dict], evals: list[dict], train_where: list[str], eval_where: list[str]) -> None:
    for a, b, wa, wb in zip(train, evals, train_where, eval_where):
        if a["question"] != b["question"]:
            raise ValueError(f"{wb}: question differs from the training split's {wa} (the files must be row-aligned)")


def _training_splits(cfg: TofuDataConfig) -> dict[str, tuple[list[dict], list[str]]]:
    """The whole files of a run's training splits: the forget split, the retain split (retain and
    pretraining authors) and the knowledge sets, as records with their ``file:line``."""
    splits = {
        "forget": load_split_numbered(cfg, cfg.split),
        "retain": load_split_numbered(cfg, f"retain{100 - SPLITS[cfg.split]}"),
    }
    splits.update({name: load_split_numbered(cfg, name) for name in cfg.knowledge if name in KNOWLEDGE_SETS})
    return splits


def make_holdout_set(cfg: TofuDataConfig) -> list[dict]:
    """The membership-inference non-members of a TOFU run: question/answer of the last authors of
    the holdout split (:func:`holdout_split`), as many authors as the forget set has (the forget set
    is the last authors of the forget split), capped like ``eval_forget`` (:func:`forget_cap`).
    Kept out of :func:`make_tofu_sets` (and of the embedded tokenizer's text), so that no training or
    evaluation set, nor the tokenizer, depends on the holdout file. A holdout row that is a row of a
    training split (:func:`_training_splits`) is refused, naming both (:func:`check_not_trained`)."""
    n_forget, _ = author_counts(cfg)
    rows, where = load_split_numbered(cfg, holdout_split(cfg.split))
    check_author_blocks(rows, where)
    check_not_trained("holdout", rows, where, _training_splits(cfg))
    held = rows[max(0, len(rows) - n_forget * QA_PER_AUTHOR) :]
    return [{"question": r["question"], "answer": r["answer"]} for r in held][: forget_cap(cfg)]


def make_tofu_sets(cfg: TofuDataConfig) -> dict[str, list[dict]]:
    """Cut the sets of a TOFU run.

    Returns a dict with the training sets ``forget``, ``retain``, ``knowledge`` (question/answer),
    ``finetune_full`` (forget + retain + knowledge: TOFU's ``full``), ``finetune_retain`` (retain +
    knowledge: the retain-only reference), ``pretrain`` (the ``pretrain_authors`` authors after the
    retain authors + knowledge: the embedded model's pretraining text), the evaluation sets
    ``eval_forget``, ``eval_retain``, ``eval_real_authors``, ``eval_world_facts`` (with
    ``paraphrased_answer`` / ``perturbed_answer``), and ``tune_retain``: the retain QA that no
    evaluation set holds (retain authors past ``max_eval_questions``), the held-out slice on which
    settings such as λ are chosen without looking at the evaluation sets.
    """
    n_forget, n_retain = author_counts(cfg)
    n_pre = _pretrain_authors(cfg, n_retain)
    # whole files: the forget split, the retain split (retain and pretraining authors) and the knowledge
    # mixed into both models must not share a question
    splits = _training_splits(cfg)
    (forget_all, forget_where), retain_all = splits["forget"], splits["retain"][0]
    known = {name: splits[name] for name in splits if name in KNOWLEDGE_SETS}
    log_repeats(check_distinct(splits, strict=("forget",)))
    check_author_blocks(forget_all, forget_where)
    check_author_blocks(*splits["retain"])
    start = len(forget_all) - n_forget * QA_PER_AUTHOR
    forget = forget_all[start:]
    retain = retain_all[: n_retain * QA_PER_AUTHOR]
    pretrain = retain_all[n_retain * QA_PER_AUTHOR : (n_retain + n_pre) * QA_PER_AUTHOR]
    if not forget:
        raise ValueError(f"data.split {cfg.split}: the forget set is empty")

    forget_pert, pert_where = load_split_numbered(cfg, f"{cfg.split}_perturbed")
    check_author_blocks(forget_pert, pert_where, aligned=(forget_all, forget_where))
    cut = len(forget_pert) - len(forget)
    forget_pert = forget_pert[cut:]
    _check_aligned(forget, forget_pert, forget_where[start:], pert_where[cut:])
    check_eval_set("forget", forget_pert, pert_where[cut:])

    retain_pert, retain_pert_where = load_split_numbered(cfg, "retain_perturbed")
    retain_q = {r["question"] for r in retain}
    kept = [i for i, r in enumerate(retain_pert) if r["question"] in retain_q]
    eval_retain = [retain_pert[i] for i in kept]
    check_eval_set("retain", eval_retain, [retain_pert_where[i] for i in kept])
    if not eval_retain:
        raise ValueError("retain_perturbed: no question overlaps the retain set of this run")

    cap = int(cfg.max_eval_questions)
    if cap < 1:
        raise ValueError(f"evaluate.max_questions: expected a positive integer, got {cap}")
    sets = {
        "forget": [{"question": r["question"], "answer": r["answer"]} for r in forget],
        "retain": [{"question": r["question"], "answer": r["answer"]} for r in retain],
        "eval_forget": forget_pert[: forget_cap(cfg)],
        "eval_retain": eval_retain[:cap],
    }
    for name in ("real_authors", "world_facts"):
        rows, where = load_split_numbered(cfg, f"{name}_perturbed")
        check_eval_set(name, rows[:cap], where[:cap])
        sets[f"eval_{name}"] = rows[:cap]
    knowledge: list[dict] = []
    for name in cfg.knowledge:
        if name not in KNOWLEDGE_SETS:
            raise ValueError(f"data.knowledge: expected a subset of {list(KNOWLEDGE_SETS)}, got {name!r}")
        knowledge += [{"question": r["question"], "answer": r["answer"]} for r in known[name][0]]
    sets["knowledge"] = knowledge
    evaluated = {r["question"] for r in sets["eval_retain"]}
    sets["tune_retain"] = [r for r in sets["retain"] if r["question"] not in evaluated]
    sets["pretrain"] = [{"question": r["question"], "answer": r["answer"]} for r in pretrain] + knowledge
    sets["finetune_full"] = sets["forget"] + sets["retain"] + knowledge
    sets["finetune_retain"] = sets["retain"] + knowledge
    return sets
