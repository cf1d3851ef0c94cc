"""The TOFU data cut on the real vendored splits."""

import json

import pytest

from qrerase.text.data import TofuDataConfig, make_tofu_sets

ROOT = "data/tofu"


def test_default_cut_keeps_tofu_structure():
    sets = make_tofu_sets(TofuDataConfig(root=ROOT, split="forget10", n_authors=20))
    assert len(sets["forget"]) == 2 * 20 and len(sets["retain"]) == 18 * 20
    # forget = the last 2 authors of TOFU (rows 3960.. of full), retain = the first 18 authors
    full = [json.loads(line) for line in open(f"{ROOT}/full.jsonl")]
    assert [r["question"] for r in sets["forget"]] == [r["question"] for r in full[3960:]]
    assert [r["question"] for r in sets["retain"]] == [r["question"] for r in full[:360]]
    # the perturbed eval sets line up question by question
    assert [r["question"] for r in sets["eval_forget"]] == [r["question"] for r in sets["forget"]]
    assert all(len(r["perturbed_answer"]) == 5 for r in sets["eval_forget"])
    assert len(sets["eval_retain"]) == 300  # capped at max_eval_questions
    assert {r["question"] for r in sets["eval_retain"]} <= {r["question"] for r in sets["retain"]}
    assert len(sets["eval_real_authors"]) == 100 and len(sets["eval_world_facts"]) == 117
    assert len(sets["finetune_full"]) == 400 + 217 and len(sets["finetune_retain"]) == 360 + 217


def test_full_split_and_forget01():
    sets = make_tofu_sets(TofuDataConfig(root=ROOT, split="forget01", n_authors=None, knowledge=()))
    assert len(sets["forget"]) == 40 and len(sets["retain"]) == 3960
    assert sets["knowledge"] == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"split": "forget20"}, "data.split"),
        ({"n_authors": 5}, "empty forget set"),
        ({"n_authors": 1}, "data.n_authors"),
        ({"root": "no/such/dir"}, "data file not found"),
        ({"knowledge": ("poems",)}, "data.knowledge"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        make_tofu_sets(TofuDataConfig(**{"root": ROOT, **kwargs}))


def test_record_without_answer_names_file_and_line(tmp_path):
    for name in ("forget10", "retain90"):
        (tmp_path / f"{name}.jsonl").write_text('{"question": "q?", "answer": "a"}\n' * 400)
    (tmp_path / "forget10.jsonl").write_text('{"question": "q?"}\n')
    with pytest.raises(ValueError, match=r"forget10.jsonl:1: record lacks a non-empty 'answer'"):
        make_tofu_sets(TofuDataConfig(root=str(tmp_path)))


def test_pretrain_authors_are_disjoint_and_tune_slice_is_not_evaluated():
    sets = make_tofu_sets(TofuDataConfig(root=ROOT, split="forget10", n_authors=20, pretrain_authors=40))
    full = [json.loads(line) for line in open(f"{ROOT}/full.jsonl")]
    # pretraining authors: the 40 authors after the 18 retained ones (full rows 360..1159) + knowledge
    assert [r["question"] for r in sets["pretrain"][:800]] == [r["question"] for r in full[360:1160]]
    assert sets["pretrain"][800:] == sets["knowledge"]
    # (disjoint by author: rows 0..359 retained, 3960.. forgotten; TOFU repeats one generic question,
    # "What is the full name of the author?", across authors, so question texts are not all distinct)
    # the held-out retain slice: retain authors 16-18 (no evaluation set holds them)
    assert [r["question"] for r in sets["tune_retain"]] == [r["question"] for r in full[300:360]]
    evaluated = {r["question"] for name in ("eval_forget", "eval_retain", "eval_real_authors", "eval_world_facts") for r in sets[name]}
    assert not evaluated & {r["question"] for r in sets["tune_retain"]}


def test_too_many_pretrain_authors_is_a_clear_error():
    with pytest.raises(ValueError, match=r"data.pretrain_authors: expected 0..162"):
        make_tofu_sets(TofuDataConfig(root=ROOT, split="forget10", n_authors=20, pretrain_authors=163))
