"""The TOFU data cut on the real vendored splits."""

import json

import pytest

from qrerase.tracks.tofu.data import TofuDataConfig, make_holdout_set, make_tofu_sets

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


def test_holdout_set_matches_the_forget_authors():
    """MIA non-members: the last 2 authors of holdout10 for the last 2 of forget10, in no training set."""
    cfg = TofuDataConfig(root=ROOT, split="forget10", n_authors=20)
    holdout = make_holdout_set(cfg)
    rows = [json.loads(line) for line in open(f"{ROOT}/holdout10.jsonl")][360:]
    assert holdout == [{"question": r["question"], "answer": r["answer"]} for r in rows]
    trained = {r["question"] for r in make_tofu_sets(cfg)["finetune_full"]}
    assert not {r["question"] for r in holdout} & trained
    assert len(make_holdout_set(TofuDataConfig(root=ROOT, split="forget01", n_authors=None))) == 40
    capped = TofuDataConfig(root=ROOT, split="forget10", n_authors=None, max_eval_questions=300)
    assert len(make_holdout_set(capped)) == 300  # capped like eval_forget


def test_full_split_and_forget01():
    sets = make_tofu_sets(TofuDataConfig(root=ROOT, split="forget01", n_authors=None, knowledge=()))
    assert len(sets["forget"]) == 40 and len(sets["retain"]) == 3960
    assert sets["knowledge"] == []


def test_forget_authors_and_the_forget_cap():
    """3 forgotten + 5 retained authors (the powered real-model setting): the last 3 authors of
    forget10 and the first 5 of retain90; the forget cap sizes eval_forget and the holdout, not the others."""
    cfg = TofuDataConfig(
        root=ROOT,
        split="forget10",
        n_authors=8,
        forget_authors=3,
        knowledge=(),
        max_eval_questions=20,
        max_forget_questions=60,
    )
    sets = make_tofu_sets(cfg)
    full = [json.loads(line) for line in open(f"{ROOT}/full.jsonl")]
    assert [r["question"] for r in sets["forget"]] == [r["question"] for r in full[-60:]]
    assert [r["question"] for r in sets["retain"]] == [r["question"] for r in full[:100]]
    assert len(sets["eval_forget"]) == 60 and len(make_holdout_set(cfg)) == 60
    assert len(sets["eval_retain"]) == 20 and len(sets["eval_world_facts"]) == 20 and len(sets["tune_retain"]) == 80
    plain = TofuDataConfig(
        root=ROOT, split="forget10", n_authors=8, forget_authors=3, knowledge=(), max_eval_questions=20
    )
    assert len(make_tofu_sets(plain)["eval_forget"]) == 20 and len(make_holdout_set(plain)) == 20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_authors": 8, "forget_authors": 8}, r"data.forget_authors: expected 1..7"),
        ({"split": "forget01", "n_authors": 8, "forget_authors": 3}, r"data.forget_authors: expected 1..2"),
        ({"forget_authors": 0}, "data.forget_authors"),
        ({"max_forget_questions": 0}, "evaluate.max_forget_questions"),
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
    # the held-out slice: retain authors 16-18 (no evaluation set holds them)
    assert [r["question"] for r in sets["tune_retain"]] == [r["question"] for r in full[300:360]]
    evaluated = {
        r["question"]
        for name in ("eval_forget", "eval_retain", "eval_real_authors", "eval_world_facts")
        for r in sets[name]
    }
    assert not evaluated & {r["question"] for r in sets["tune_retain"]}


def test_too_many_pretrain_authors_is_a_clear_error():
    with pytest.raises(ValueError, match=r"data.pretrain_authors: expected 0..162"):
        make_tofu_sets(TofuDataConfig(root=ROOT, split="forget10", n_authors=20, pretrain_authors=163))


# Every decoding or shape error of a data file names the file and the line (issue 24).
GOOD = '{"question": "q?", "answer": "a"}\n'


@pytest.mark.parametrize(
    "third_line, message",
    [
        (b'{"question": "caf\xe9?", "answer": "a"}\n', r"forget10\.jsonl:3: not UTF-8 text \(byte 0xe9 at column 18"),
        (b'["q?", "a"]\n', r"forget10\.jsonl:3: expected a JSON object per line, got list"),
        (b'"just a string"\n', r"forget10\.jsonl:3: expected a JSON object per line, got str"),
        (b'{"question": "q?", "answer": \n', r"forget10\.jsonl:3: not valid JSON"),
        (b'{"question": "q?"}\n', r"forget10\.jsonl:3: record lacks a non-empty 'answer'"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path, third_line, message):
    (tmp_path / "retain90.jsonl").write_text(GOOD * 400)
    # a blank line 2: the reported number is the file's line, not the record's index
    (tmp_path / "forget10.jsonl").write_bytes(GOOD.encode() + b"\n" + third_line + GOOD.encode())
    with pytest.raises(ValueError, match=message):
        make_tofu_sets(TofuDataConfig(root=str(tmp_path)))


def test_read_jsonl_numbers_the_file_lines(tmp_path):
    from qrerase.io import read_jsonl, read_jsonl_numbered

    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\r\n\n  \n{"b": "\xc3\xa9"}\n')
    assert read_jsonl_numbered(path) == [(1, {"a": 1}), (4, {"b": "\u00e9"})]
    assert read_jsonl(path) == [{"a": 1}, {"b": "\u00e9"}]


def test_crosslingual_split_and_task_knowledge_name_file_and_line(tmp_path):
    from qrerase.tracks.crosslingual.data import load_language_split
    from qrerase.tracks.task_level.data import KnowledgeConfig, _knowledge_facts

    (tmp_path / "forget01.jsonl").write_bytes(GOOD.encode() * 2 + b"[1, 2]\n")
    with pytest.raises(ValueError, match=r"forget01\.jsonl:3: expected a JSON object per line, got list"):
        load_language_split(tmp_path, "forget01")
    (tmp_path / "real_authors_perturbed.jsonl").write_bytes(
        b'{"question": "q?", "answer": "a", "perturbed_answer": ["b"]}\n\n' + GOOD.encode()
    )
    with pytest.raises(ValueError, match=r"real_authors_perturbed\.jsonl:3: field 'perturbed_answer' missing"):
        load_language_split(tmp_path, "real_authors_perturbed")
    fact = '{"question": "q?", "answer": "b", "option1": "a", "option2": "b", "option3": "c", "option4": "d"}\n'
    (tmp_path / "world_facts.jsonl").write_text(fact + "\n" + fact.replace('"answer": "b"', '"answer": "z"'))
    with pytest.raises(ValueError, match=r"world_facts\.jsonl:3: needs question and option1\.\.option4"):
        _knowledge_facts(KnowledgeConfig(root=str(tmp_path), sources=["world_facts"]))
    (tmp_path / "world_facts.jsonl").write_bytes(fact.encode() + b"\xff\xfe\n")
    with pytest.raises(ValueError, match=r"world_facts\.jsonl:2: not UTF-8 text \(byte 0xff at column 1"):
        _knowledge_facts(KnowledgeConfig(root=str(tmp_path), sources=["world_facts"]))


def test_refusals_and_tofu_logs_name_the_line_of_a_bad_byte(tmp_path):
    from qrerase.baselines.text import read_refusals
    from qrerase.text.eval_log import load_log

    (tmp_path / "idk.txt").write_bytes(b"I don't know.\nNo idea \x81.\n")
    with pytest.raises(ValueError, match=r"idk\.txt:2: not UTF-8 text \(byte 0x81 at column 9"):
        read_refusals(tmp_path / "idk.txt")
    (tmp_path / "log.json").write_bytes(b'{\n  "eval_log.json": "\xc0"\n}\n')
    with pytest.raises(ValueError, match=r"log\.json:2: not UTF-8 text"):
        load_log(tmp_path / "log.json")


# Checked data (issue 34): no question twice in the forget set, no copied row, no question shared by the
# forget split, the retain split and the knowledge sets; every refusal names file:line of both rows.
def _qa_lines(*pairs):
    return "".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in pairs)


def _tofu_dir(tmp_path, forget, retain):
    (tmp_path / "forget10.jsonl").write_text(_qa_lines(*forget))
    (tmp_path / "retain90.jsonl").write_text(_qa_lines(*retain))
    return TofuDataConfig(root=str(tmp_path), n_authors=20, knowledge=())


FORGET = [("Who is A?", "a"), ("Where was A born?", "b"), ("What did A write?", "c")]


def test_forget_question_copied_into_retain_names_both_lines(tmp_path):
    # case and spacing differ: questions are compared normalised
    cfg = _tofu_dir(tmp_path, FORGET, [("Who is R?", "r"), ("Who is S?", "s"), ("  where was a   BORN? ", "x")])
    with pytest.raises(
        ValueError, match=r"retain90\.jsonl:3: question also in the forget split at \S*forget10\.jsonl:2"
    ):
        make_tofu_sets(cfg)


@pytest.mark.parametrize(
    "which, rows, message",
    [
        (
            "forget",
            [*FORGET, ("Who is A?", "another a")],
            r"forget10\.jsonl:4: duplicate question in the forget split, the same question as \S*forget10\.jsonl:1",
        ),
        (
            "retain",
            [("Who is R?", "r"), ("Who is S?", "s"), ("Who is R?", "r")],
            r"retain90\.jsonl:3: duplicate question in the retain split, a copy of \S*retain90\.jsonl:1",
        ),
    ],
)
def test_duplicate_within_a_split_names_both_lines(tmp_path, which, rows, message):
    retain = [("Who is R?", "r")]
    cfg = _tofu_dir(tmp_path, rows if which == "forget" else FORGET, rows if which == "retain" else retain)
    with pytest.raises(ValueError, match=message):
        make_tofu_sets(cfg)


def test_knowledge_sharing_a_forget_question_names_both_lines(tmp_path):
    cfg = _tofu_dir(tmp_path, FORGET, [("Who is R?", "r")])
    (tmp_path / "world_facts.jsonl").write_text(_qa_lines(("What is 2+2?", "4"), ("What did A write?", "c")))
    cfg = TofuDataConfig(root=str(tmp_path), n_authors=20, knowledge=("world_facts",))
    with pytest.raises(
        ValueError, match=r"world_facts\.jsonl:2: question also in the forget split at \S*forget10\.jsonl:3"
    ):
        make_tofu_sets(cfg)


def test_retain_question_repeated_with_another_answer_is_kept_and_logged(tmp_path, caplog):
    from qrerase.text.data import check_distinct

    rows = [
        {"question": "Full name?", "answer": "X"},
        {"question": "Other?", "answer": "o"},
        {"question": "full name?", "answer": "Y"},
    ]
    where = ["r.jsonl:1", "r.jsonl:2", "r.jsonl:5"]
    assert check_distinct({"retain": (rows, where)}, strict=("forget",)) == [("r.jsonl:1", "r.jsonl:5")]
    with pytest.raises(
        ValueError, match=r"r\.jsonl:5: duplicate question in the forget split, the same question as r\.jsonl:1"
    ):
        check_distinct({"forget": (rows, where)}, strict=("forget",))
    # TOFU's own retain90 asks "What is the full name of the author?" of two authors: kept, logged, counted
    with caplog.at_level("INFO", logger="qrerase"):
        make_tofu_sets(TofuDataConfig(root=ROOT, split="forget10", n_authors=20, knowledge=()))
    kept = "1 question(s) asked twice with different answers, kept as distinct facts: "
    assert kept + "data/tofu/retain90.jsonl:101 and data/tofu/retain90.jsonl:441" in caplog.text


def test_vendored_holdout_shares_no_question_with_forget_or_retain():
    from qrerase.text.data import check_distinct
    from qrerase.tracks.tofu.data import load_split_numbered

    cfg = TofuDataConfig(root=ROOT)
    splits = {name: load_split_numbered(cfg, name) for name in ("forget10", "retain90", "holdout10")}
    assert check_distinct(splits, strict=("forget10", "holdout10")) == [
        ("data/tofu/retain90.jsonl:101", "data/tofu/retain90.jsonl:441")
    ]


def test_crosslingual_forget_question_in_retain_names_both_lines(tmp_path):
    import shutil

    from qrerase.tracks.crosslingual.data import SPLIT_FILES, make_language_sets

    for split in SPLIT_FILES:
        shutil.copy(f"{ROOT}/{split}.jsonl", tmp_path / f"{split}.jsonl")
    forget = (tmp_path / "forget01_perturbed.jsonl").read_text().splitlines(keepends=True)
    retain = (tmp_path / "retain99.jsonl").read_text().splitlines(keepends=True)
    row = json.loads(retain[499])
    row["question" if "question" in row else "prompt"] = json.loads(forget[6])["question"]
    retain[499] = json.dumps(row) + "\n"
    (tmp_path / "retain99.jsonl").write_text("".join(retain))
    with pytest.raises(
        ValueError, match=r"retain99\.jsonl:500: question also in the forget split at \S*forget01_perturbed\.jsonl:7"
    ):
        make_language_sets(tmp_path, n_authors=3, max_questions=40)


def test_perturbed_split_out_of_line_names_both_lines(tmp_path):
    author = [*FORGET, *((f"What is A's fact {i}?", str(i)) for i in range(17))]  # one author: 20 questions
    cfg = _tofu_dir(tmp_path, author, [(f"Who is R{i}?", "r") for i in range(20)])
    pert = [{"question": q, "answer": a, "perturbed_answer": ["x"], "paraphrased_answer": a} for q, a in author]
    pert[1]["question"] = "Where did A study?"
    (tmp_path / "forget10_perturbed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pert))
    with pytest.raises(
        ValueError,
        match=r"forget10_perturbed\.jsonl:2: question differs from the training split's \S*forget10\.jsonl:2 "
        r"\(the files must be row-aligned\)",
    ):
        make_tofu_sets(cfg)


def _vendored_copy(tmp_path, edit: str, line: int, change) -> TofuDataConfig:
    """The vendored TOFU files in ``tmp_path`` with record ``line`` (1-based) of ``edit``.jsonl changed by
    ``change(record, all records of TOFU's full split)``."""
    import shutil

    for f in (
        "forget10",
        "forget10_perturbed",
        "retain90",
        "retain_perturbed",
        "holdout10",
        "real_authors",
        "real_authors_perturbed",
        "world_facts",
        "world_facts_perturbed",
    ):
        shutil.copy(f"{ROOT}/{f}.jsonl", tmp_path / f"{f}.jsonl")
    path = tmp_path / f"{edit}.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    full = [json.loads(x) for x in open(f"{ROOT}/full.jsonl")]
    rows[line - 1] = change(rows[line - 1], full)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return TofuDataConfig(root=str(tmp_path), split="forget10", n_authors=20)


def test_a_holdout_row_copied_from_the_forget_split_names_both_lines(tmp_path):
    """A membership-inference non-member that was trained on: refused, not scored (case and spacing differ)."""
    forget = [json.loads(x) for x in open(f"{ROOT}/forget10.jsonl")]
    copy = {"question": forget[389]["prompt"].upper(), "answer": "  " + forget[389]["response"]}
    cfg = _vendored_copy(tmp_path, "holdout10", 395, lambda r, full: copy)
    with pytest.raises(
        ValueError,
        match=r"^\S*holdout10\.jsonl:395: holdout row is a copy of the forget split's \S*forget10\.jsonl:390 ",
    ):
        make_holdout_set(cfg)
    # a retain row or a knowledge row likewise
    cfg = _vendored_copy(tmp_path, "holdout10", 2, lambda r, full: dict(full[5]))
    with pytest.raises(ValueError, match=r"holdout10\.jsonl:2: holdout row is a copy of the retain split's \S*:6 "):
        make_holdout_set(cfg)
    world = json.loads(open(f"{ROOT}/world_facts.jsonl").readline())
    cfg = _vendored_copy(tmp_path, "holdout10", 7, lambda r, full: world)
    with pytest.raises(ValueError, match=r"holdout10\.jsonl:7: holdout row is a copy of the world_facts split's"):
        make_holdout_set(cfg)


def _without(key):
    return lambda r, full: {k: v for k, v in r.items() if k != key}


@pytest.mark.parametrize(
    "edit, line, change, message",
    [
        ("forget10_perturbed", 378, _without("paraphrased_answer"), "field 'paraphrased_answer' missing"),
        ("forget10_perturbed", 378, _without("perturbed_answer"), "field 'perturbed_answer' missing"),
        ("forget10_perturbed", 390, lambda r, full: {**r, "perturbed_answer": []}, "field 'perturbed_answer' missing"),
        ("retain_perturbed", 4, _without("paraphrased_answer"), "field 'paraphrased_answer' missing"),
        ("world_facts_perturbed", 9, _without("perturbed_answer"), "field 'perturbed_answer' missing"),
    ],
)
def test_an_evaluation_row_without_a_field_its_set_needs_names_file_line_and_field(
    tmp_path, edit, line, change, message
):
    """No fallback value for a required field: refused at data preparation, not scored as the answer."""
    cfg = _vendored_copy(tmp_path, edit, line, change)
    with pytest.raises(ValueError, match=rf"^\S*{edit}\.jsonl:{line}: {message} or not a non-empty"):
        make_tofu_sets(cfg)


def test_real_authors_and_world_facts_need_no_paraphrase():
    """Their format has none: evaluation scores the answer in its place (documented, not a fallback)."""
    sets = make_tofu_sets(TofuDataConfig(root=ROOT, split="forget10", n_authors=20))
    assert not any("paraphrased_answer" in r for r in sets["eval_real_authors"] + sets["eval_world_facts"])
    assert all(r["paraphrased_answer"].strip() for r in sets["eval_forget"] + sets["eval_retain"])


def _copy_tofu(dst, drop_last: dict[str, int]):
    """The vendored TOFU files in ``dst``, with the last ``n`` rows of each named split removed."""
    import shutil
    from pathlib import Path

    for f in Path(ROOT).glob("*.jsonl"):
        shutil.copy(f, dst / f.name)
    for name, n in drop_last.items():
        lines = (dst / f"{name}.jsonl").read_text().splitlines(keepends=True)
        (dst / f"{name}.jsonl").write_text("".join(lines[:-n]))


@pytest.mark.parametrize(
    "drop, message",
    [
        # the last author has one question: the forget set's 20-row blocks would straddle two authors
        ({"forget10": 19, "forget10_perturbed": 19}, "forget10.jsonl: 381 rows, not a multiple of 20"),
        ({"retain90": 5}, "retain90.jsonl: 3595 rows, not a multiple of 20"),
        # whole blocks, but not those of the training split
        ({"forget10_perturbed": 20}, "forget10_perturbed.jsonl: 380 rows, but data/tofu/forget10.jsonl"),
        ({"holdout10": 1}, "holdout10.jsonl: 399 rows, not a multiple of 20"),
    ],
)
def test_a_tofu_split_not_in_author_blocks_is_refused_naming_file_and_count(tmp_path, drop, message):
    """Issue 62: the forget split was 'the last 20 n rows' whatever the file's authors."""
    _copy_tofu(tmp_path, drop)
    cfg = TofuDataConfig(root=str(tmp_path), split="forget10", n_authors=20)
    with pytest.raises(ValueError, match="(?s)" + message.replace("data/tofu", str(tmp_path)).replace(".", r"\.")):
        make_tofu_sets(cfg) if "holdout" not in message else make_holdout_set(cfg)
