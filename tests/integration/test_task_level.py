"""qrerase.tracks.task_level.data (generator), qrerase.tracks.task_level.evaluation (normalisation, choice,
table frame) and qrerase.tracks.task_level.baselines (KGA, KU) on small real data."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from support import REPO

from qrerase.baselines.text import kl_divergence
from qrerase.text.lm import PromptTemplate, encode_qa_many
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import TrainConfig, train_causal_lm
from qrerase.tracks.task_level.baselines import (
    TaskLevelBaselineConfig,
    full_sequence,
    kga_loss,
    ku_loss,
    memorization_accuracy,
    train_ku,
)
from qrerase.tracks.task_level.data import (
    SPLITS,
    TaskLevelDataConfig,
    check_task_level_config,
    generate_skill,
    make_task_level_sets,
    skill_universe,
)
from qrerase.tracks.task_level.evaluation import (
    choose_options,
    evaluate_skill,
    exact_match,
    normalise_answer,
    task_level_frame,
)
from qrerase.tracks.task_level.tables import task_level_table

DATA = REPO / "data" / "tofu"
SIZES = {
    "arithmetic": {"train": 300, "eval": 50, "new": 20},
    "word_math": {"train": 200, "eval": 40, "new": 20},
    "knowledge": {"train": 100, "eval": 60, "new": 20},
}


def config(**overrides) -> TaskLevelDataConfig:
    d = {"sizes": SIZES, "knowledge": {"root": str(DATA)}, "arithmetic": {"ops": ["+", "-", "*"], "max_operand": 30}}
    d.update(overrides)
    return TaskLevelDataConfig.from_dict(d)


# ------------------------------------------------------------------------------------------------
# Generator
# ------------------------------------------------------------------------------------------------


def test_generator_is_deterministic_and_seeded():
    a, b, c = make_task_level_sets(config(), 0), make_task_level_sets(config(), 0), make_task_level_sets(config(), 1)
    assert a == b
    assert a["forget"] != c["forget"] and a["eval_retain"] != c["eval_retain"]


@pytest.mark.parametrize("skill", ["arithmetic", "word_math", "knowledge"])
def test_splits_are_distinct_disjoint_and_sized(skill):
    sets = generate_skill(skill, config(), seed=3)
    questions = {s: [r["question"] for r in sets[s]] for s in SPLITS}
    for s in SPLITS:
        assert len(questions[s]) == SIZES[skill][s] == len(set(questions[s]))
    assert not set(questions["train"]) & set(questions["eval"])
    assert not set(questions["train"]) & set(questions["new"])
    assert not set(questions["eval"]) & set(questions["new"])


def _solve(question: str) -> int:
    """An independent reading of the generator's grammar (regexes, not the generator's code)."""
    m = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", question)
    if m:
        a, op, b = int(m[1]), m[2], int(m[3])
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    m = re.fullmatch(r"Solve for x: x ([-+]) (\d+) = (\d+)\.", question)
    if m:
        return int(m[3]) - int(m[2]) if m[1] == "+" else int(m[3]) + int(m[2])
    m = re.fullmatch(r"Solve for x: (\d)x = (\d+)\.", question)
    if m:
        assert int(m[2]) % int(m[1]) == 0
        return int(m[2]) // int(m[1])
    m = re.fullmatch(
        r"(\w+) has (\d+) (\w+)\. (?:He|She) gets (\d+) more and then gives away (\d+)\. "
        r"How many \3 does \1 have now\?",
        question,
    )
    if m:
        return int(m[2]) + int(m[4]) - int(m[5])
    m = re.fullmatch(
        r"(\w+) had (\d+) (\w+) and gave away (\d+)\. Then (?:he|she) bought (\d+) more\. "
        r"How many \3 does \1 have now\?",
        question,
    )
    assert m, question
    return int(m[2]) - int(m[4]) + int(m[5])


def test_answers_are_correct():
    sets = make_task_level_sets(config(), 0)
    numeric = (
        sets["forget"]
        + sets["eval_forget"]
        + sets["eval_retain"]
        + [r for r in sets["retain"] if r["skill"] == "word_math"]
    )
    assert len(numeric) > 500
    for r in numeric:
        value = _solve(r["question"])
        assert value >= 0 and r["answer"] == str(value)
    templates = {re.sub(r"\d+", "N", r["question"]).split(".")[0][:20] for r in numeric if r["skill"] == "word_math"}
    assert len(templates) >= 4  # equations and stories both present
    ops = {r["question"].split()[3] for r in sets["forget"]}
    assert ops == {"+", "-", "*"}
    knowledge = (
        [r for r in sets["retain"] if r["skill"] == "knowledge"] + sets["eval_real_authors"] + sets["eval_world_facts"]
    )
    for r in knowledge:
        options = dict(re.findall(r"([ABCD])\. (.*?)(?= [ABCD]\. |$)", r["question"]))
        assert sorted(options) == ["A", "B", "C", "D"] and options[r["answer"]] == r["fact_answer"]
    letters = {r["answer"] for r in knowledge}
    assert letters == {"A", "B", "C", "D"}  # options are shuffled, not always in the vendored order


def test_set_composition():
    cfg = config()
    sets = make_task_level_sets(cfg, 0)
    assert {r["skill"] for r in sets["forget"]} == {"arithmetic"}
    assert {r["skill"] for r in sets["retain"]} == {"word_math", "knowledge"}
    assert len(sets["finetune_full"]) == 300 + 200 + 100 + skill_universe("knowledge", cfg)
    assert len(sets["new"]) == 60 and len(sets["eval_real_authors"]) + len(sets["eval_world_facts"]) == 60
    assert {r["source"] for r in sets["eval_world_facts"]} == {"world_facts"}
    # pretraining: everything fine-tuning sees except the forget skill (the retained skills, the facts)
    key = lambda r: (r["skill"], r["question"])  # noqa: E731
    assert {r["skill"] for r in sets["pretrain"]} == {"word_math", "knowledge", "knowledge_fact"}
    kept = [r for r in sets["finetune_full"] if r["skill"] != "arithmetic"]
    assert sorted(map(key, sets["pretrain"])) == sorted(map(key, kept))
    # the λ rule's held-out slice: the retained skills' `new` split, in no training or evaluation set
    assert len(sets["tune_retain"]) == 40 and {r["skill"] for r in sets["tune_retain"]} == {"word_math", "knowledge"}
    tune = set(map(key, sets["tune_retain"]))
    for name in ("finetune_full", "retain", "eval_retain", "eval_real_authors", "eval_world_facts"):
        assert not tune & set(map(key, sets[name])), name


def test_knowledge_cloze_items_are_the_plain_question_with_the_same_options():
    letter = make_task_level_sets(config(), 0)
    cloze = make_task_level_sets(config(knowledge={"root": str(DATA), "format": "cloze"}), 0)
    for name in letter:
        assert len(cloze[name]) == len(letter[name])
        for a, b in zip(letter[name], cloze[name]):
            if b["skill"] != "knowledge":
                assert a == b
                continue
            listed = " ".join(f"{x}. {o}" for x, o in zip("ABCD", b["options"]))
            assert a["question"] == f"{b['question']} {listed}"  # same fact and shuffled options
            assert b["answer"] == b["fact_answer"] == b["options"]["ABCD".index(a["answer"])]


def test_universe_counts():
    cfg = config(arithmetic={"ops": ["+", "-"], "min_operand": 0, "max_operand": 9})
    assert skill_universe("arithmetic", cfg) == 100 + 55
    assert skill_universe("knowledge", cfg) == 217
    small = config(
        sizes={**SIZES, "arithmetic": {"train": 100, "eval": 40, "new": 15}},
        arithmetic={"ops": ["+", "-"], "min_operand": 0, "max_operand": 9},
    )
    qs = [r["question"] for s in generate_skill("arithmetic", small, 0).values() for r in s]
    assert len(set(qs)) == 155  # the whole universe, each question once


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"forget": "algebra"}, "task_level.data.forget: unknown skill 'algebra'"),
        ({"similar": "arithmetic"}, "three different skills"),
        ({"sizes": {**SIZES, "word_math": {"train": 10, "eval": 0, "new": 5}}}, "task_level.data.sizes.word_math.eval"),
        ({"arithmetic": {"ops": ["+"], "max_operand": 9}}, "can produce only 100"),
        ({"arithmetic": {"ops": ["/"]}}, "unknown operator '/'"),
        ({"knowledge": {"root": str(DATA), "sources": ["trivia"]}}, "unknown source 'trivia'"),
        ({"knowledge": {"root": str(DATA), "format": "text"}}, "task_level.data.knowledge.format: unknown 'text'"),
    ],
)
def test_bad_config_is_a_one_line_error(overrides, message):
    with pytest.raises(ValueError) as err:
        check_task_level_config(config(**overrides))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_normalise_answer():
    for given, expected in [
        ("85", "85"),
        (" 085.", "85"),
        ("85.0", "85"),
        ("+85", "85"),
        ("1,200", "1200"),
        ("b", "B"),
        ("(C)", "C"),
        ("D) Paris", "D"),
        ("Dublin", "dublin"),
        ("85\nmore", "85"),
        ("A Tale of Two Cities", "a tale of two cities"),
    ]:
        assert normalise_answer(given) == expected
    assert exact_match("  193", "193") and not exact_match("19", "193") and not exact_match("Dublin", "D")
    assert exact_match("A Tale of Two Cities.", "a tale of two cities") and not exact_match("A Brief History", "A Tale")


def test_task_frame_and_table_marks():
    rows = [
        {"model": m, "role": r, "accuracy": acc, "nll": 1.0}
        for m, accs in {"base": (0.9, 0.5, 0.99), "ga": (0.8, 0.2, 0.1), "qr_erase_ll_k4": (0.85, 0.45, 0.3)}.items()
        for r, acc in zip(("unrelated", "similar", "forget"), accs)
    ]
    frame = task_level_frame(rows, ["base", "ga", "qr_erase_ll_k4"])
    frame["method"] = ["base", "ga", "qr_erase_ll"]
    df, spec = task_level_table(frame, {"forget": "arithmetic", "similar": "word_math", "unrelated": "knowledge"})
    from qrerase.reports.tables import render_markdown, table_csv_frame

    csv = table_csv_frame(df, spec).set_index("method")
    assert csv.loc["ga", "forget_accuracy_mark"] == "best" and csv.loc["qr_erase_ll", "similar_accuracy_mark"] == "best"
    assert csv.loc["base", "reference"] == 1
    md = render_markdown(df, spec)
    assert "**Forgotten (arithmetic) ↓**" in md and "**0.100**" in md
    with pytest.raises(ValueError, match="no evaluation"):
        task_level_frame(rows, ["base", "kga"])


# ------------------------------------------------------------------------------------------------
# KGA and KU
# ------------------------------------------------------------------------------------------------


def _kl(p_logits, q_logits):
    p, q = torch.softmax(p_logits.double(), -1), torch.softmax(q_logits.double(), -1)
    return float((p * (p.log() - q.log())).sum(-1).mean())


def test_kga_loss_is_the_gap_difference_plus_retain_kl():
    g = torch.Generator().manual_seed(0)
    theta_f, aux_f = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    ref_r, theta_r = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    gap_new = 0.3
    expected = abs(gap_new - _kl(theta_f, aux_f)) + 0.5 * _kl(ref_r, theta_r)
    assert kga_loss(gap_new, theta_f, aux_f, ref_r, theta_r, 0.5).item() == pytest.approx(expected, rel=1e-5)
    # the gap term vanishes when the forget-set gap equals the new-data gap; retain KL zero at the reference
    gap = kl_divergence(theta_f, aux_f)
    assert kga_loss(gap, theta_f, aux_f, ref_r, ref_r.clone(), 2.0).item() == pytest.approx(0.0, abs=1e-6)
    # the gradient pushes KL(θ ‖ A_f) towards the target gap: below it, descending raises the KL
    theta = theta_f.clone().requires_grad_(True)
    big = _kl(theta_f, aux_f) + 1.0
    kga_loss(big, theta, aux_f, ref_r, ref_r, 0.0).backward()
    with torch.no_grad():
        stepped = theta - 0.1 * theta.grad
    assert _kl(stepped, aux_f) > _kl(theta_f, aux_f)
    with pytest.raises(ValueError):
        kga_loss(0.0, theta_f, aux_f, ref_r, theta_r, -1.0)


def test_ku_loss_is_minus_the_token_mean():
    nll, n = torch.tensor([4.0, 2.0, 6.0]), torch.tensor([2.0, 2.0, 4.0])
    assert ku_loss(nll, n).item() == pytest.approx(-12 / 8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    sets = make_task_level_sets(config(), 0)
    texts = [t for r in sets["finetune_full"] for t in (r["question"], r["answer"])]
    tok = train_bpe_tokenizer(texts, 400, tmp_path_factory.mktemp("tok"), individual_digits=True)
    model = build_tiny_llama(
        TinyLlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=128,
        ),
        tok,
        seed=0,
    )
    train_causal_lm(
        model, tok, sets["finetune_full"], PromptTemplate(), TrainConfig(epochs=2, lr=3e-3, batch_size=32, threads=1)
    )  # MA > 0 on the forget set
    return tok, model, sets


def test_individual_digits(tiny):
    tok, _, _ = tiny
    digits = [t for t in tok.tokenize("What is 47 + 385?") if any(ch.isdigit() for ch in t)]
    assert digits == ["4", "7", "3", "8", "5"]


def test_memorization_accuracy_matches_a_direct_count(tiny):
    tok, model, sets = tiny
    ex = [
        full_sequence(e)
        for e in encode_qa_many(tok, PromptTemplate(), [(r["question"], r["answer"]) for r in sets["forget"][:6]], 96)
    ]
    ma = memorization_accuracy(model, ex, tok.pad_token_id, batch_size=4)
    for (ids, _), value in zip(ex, ma):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        direct = (logits.argmax(-1) == torch.tensor(ids[1:])).float().mean().item()
        assert value == pytest.approx(direct, abs=1e-6)
    assert ((0 <= ma) & (ma <= 1)).all()


def test_cloze_choice_is_the_option_of_lowest_token_mean_nll(tiny):
    from qrerase.text.evaluation import EvalConfig, answer_losses

    tok, model, _ = tiny
    sets = make_task_level_sets(config(knowledge={"root": str(DATA), "format": "cloze"}), 0)
    records = sets["eval_world_facts"][:12]
    cfg = EvalConfig(batch_size=8, max_new_tokens=4, max_length=96)
    chosen = choose_options(model, tok, PromptTemplate(), records, cfg)
    for r, c in zip(records, chosen):
        losses = answer_losses(model, tok, PromptTemplate(), [(r["question"], o) for o in r["options"]], cfg)
        means = [s_ / n for s_, n in losses]
        assert c == r["options"][means.index(min(means))]
    res = evaluate_skill(model, tok, PromptTemplate(), records, cfg)
    assert res["generations"] == chosen
    assert res["accuracy"] == pytest.approx(np.mean([c == r["answer"] for r, c in zip(records, chosen)]))


def test_ku_stops_by_its_criterion(tiny):
    import copy

    tok, model, sets = tiny
    forget, new = sets["forget"][:64], sets["new"]
    # threshold 1: every sequence already counts as forgotten -> no step
    m1, rows, info = train_ku(
        copy.deepcopy(model),
        tok,
        forget,
        new,
        PromptTemplate(),
        TaskLevelBaselineConfig.of(method="ku", ma_threshold=1.0, threads=1),
    )
    assert rows == [] and info["stopped"] and info["steps"] == 0
    # threshold 0 cannot be reached in 2 epochs -> all steps run, forget NLL rises (gradient ascent)
    m2, rows, info = train_ku(
        copy.deepcopy(model),
        tok,
        forget,
        new,
        PromptTemplate(),
        TaskLevelBaselineConfig.of(
            method="ku", ma_threshold=0.0, epochs=2, batch_size=16, lr=1e-2, check_every=3, threads=1
        ),
    )
    assert info["steps"] == len(rows) == 8 and not info["stopped"]
    assert rows[-1]["forget_nll"] > rows[0]["forget_nll"]
    assert np.isfinite(rows[2]["forget_ma"]) and np.isnan(rows[0]["forget_ma"])
    # the default threshold is the fine-tuned model's MA on the new data
    _, _, info = train_ku(
        copy.deepcopy(model),
        tok,
        forget,
        new,
        PromptTemplate(),
        TaskLevelBaselineConfig.of(method="ku", epochs=1, threads=1),
    )
    ex = [
        full_sequence(e)
        for e in encode_qa_many(tok, PromptTemplate(), [(r["question"], r["answer"]) for r in new], 128)
    ]
    assert info["threshold"] == pytest.approx(float(memorization_accuracy(model, ex, tok.pad_token_id).mean()))
