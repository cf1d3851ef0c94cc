"""Multilingual TOFU: romanisation with the real libraries, language codes, per-language set assembly
(row alignment across languages), file checks, the cross-lingual tables and figures."""

from __future__ import annotations

import json
import shutil
import unicodedata

import numpy as np
import pandas as pd
import pytest
from support import REPO

from qrerase.io import read_jsonl
from qrerase.reports.plots import energy_overlay_plot
from qrerase.reports.tables import render_latex, render_markdown, table_csv_frame
from qrerase.text.evaluation import UnicodeWords
from qrerase.tracks.crosslingual.data import (
    check_language_files,
    language_label,
    load_language_split,
    make_language_sets,
    parse_language,
    romanise_split,
)
from qrerase.tracks.crosslingual.plots import crosslingual_scatter
from qrerase.tracks.crosslingual.romanise import romanise_record, romanise_text
from qrerase.tracks.crosslingual.tables import matrix_table, metrics_rows, pairs_table, scatter_points

EN = REPO / "data" / "tofu"
MTOFU = REPO / "data" / "mtofu"


def _letters(text: str) -> list[str]:
    return [ch for ch in text if unicodedata.category(ch).startswith("L")]


def _all_latin(text: str) -> bool:
    return all("LATIN" in unicodedata.name(ch) for ch in _letters(text))


# ------------------------------------------------------------------------------------------------
# romanisation


def test_devanagari_row_becomes_latin_and_round_trips():
    from indic_transliteration import sanscript

    row = read_jsonl(MTOFU / "hi" / "forget01.jsonl")[0]
    assert any("DEVANAGARI" in unicodedata.name(ch) for ch in _letters(row["answer"]))
    latin = romanise_text(row["answer"], "devanagari")
    assert _all_latin(latin) and latin != row["answer"]
    assert "kuvaita" in latin  # कुवैत (Kuwait), ISO 15919
    back = sanscript.transliterate(latin, sanscript.ISO, sanscript.DEVANAGARI)
    # ISO 15919 is lossless except that ASCII digits come back as Devanagari digits.
    digits = str.maketrans("०१२३४५६७८९", "0123456789")
    assert back.translate(digits) == row["answer"].replace("।", ".")


def test_japanese_row_becomes_latin_romaji():
    row = read_jsonl(MTOFU / "ja" / "forget01.jsonl")[0]
    latin = romanise_text(row["answer"], "japanese")
    assert _all_latin(latin)
    assert "kuueeto" in latin and "1956" in latin  # クウェート (Kuwait) in Hepburn romaji


def test_romanise_record_converts_every_text_field():
    rec = read_jsonl(MTOFU / "hi" / "forget01_perturbed.jsonl")[3]
    out = romanise_record(rec, "devanagari")
    for key in ("question", "answer", "paraphrased_answer", "paraphrased_question"):
        assert _all_latin(out[key]) and out[key] != rec[key]
    assert len(out["perturbed_answer"]) == len(rec["perturbed_answer"]) == 5
    assert all(_all_latin(p) for p in out["perturbed_answer"])
    assert rec == read_jsonl(MTOFU / "hi" / "forget01_perturbed.jsonl")[3]  # input untouched


def test_no_romaniser_is_an_error():
    with pytest.raises(ValueError, match="no romaniser for the hangul script"):
        romanise_text("안녕하세요", "hangul")


# ------------------------------------------------------------------------------------------------
# language codes


def test_language_codes():
    assert parse_language("fr") == ("fr", None)
    assert parse_language("hi_R") == ("hi", "devanagari")
    assert parse_language("ja_R") == ("ja", "japanese")
    assert language_label("hi_R") == "Hindi (R)" and language_label("iw") == "Hebrew"


@pytest.mark.parametrize(
    "code, message",
    [
        ("xx", "unknown language 'xx'"),
        ("es", "unknown language 'es'"),
        ("hi_X", "unknown language 'hi_X'"),
        ("ko_R", "no transliterator for the hangul script of Korean"),
        ("ru_R", "no transliterator for the cyrillic script of Russian"),
        ("fr_R", "already written in Latin script"),
    ],
)
def test_bad_language_codes(code, message):
    with pytest.raises(ValueError, match=message):
        parse_language(code)


# ------------------------------------------------------------------------------------------------
# data: vendored files, set assembly, row alignment


@pytest.mark.parametrize("lang", ["ar", "fa", "fr", "hi", "id", "iw", "ja", "ko", "ru"])
def test_vendored_languages_have_all_splits(lang):
    check_language_files(MTOFU / lang)


def test_english_tofu_files_pass_the_same_checks():
    check_language_files(EN)  # forget01 is spelled prompt/response there: normalised on load
    assert load_language_split(EN, "forget01")[0]["question"].startswith("What is the full name")


def test_sets_are_row_aligned_across_languages():
    en = make_language_sets(EN, n_authors=4, max_questions=30)
    fr = make_language_sets(MTOFU / "fr", n_authors=4, max_questions=30)
    hi = make_language_sets(MTOFU / "hi", n_authors=4, max_questions=30)
    full = read_jsonl(EN / "full.jsonl")
    for sets in (en, fr, hi):
        assert len(sets["forget"]) == 40 and len(sets["retain"]) == 40  # 2 forget + 2 retain authors
        assert len(sets["eval_forget"]) == 30 and len(sets["eval_retain"]) == 30
        assert len(sets["knowledge"]) == 60 and len(sets["eval_world_facts"]) == 30
    # English: the sets are TOFU's rows (retain = the first authors of full, forget = the last two).
    assert [r["question"] for r in en["retain"]] == [r["question"] for r in full[:40]]
    assert [r["question"] for r in en["forget"]] == [r["question"] for r in full[3960:]]
    # The same row is the same QA in French: names of the author appear in both.
    assert all(a["question"] != b["question"] for a, b in zip(fr["retain"], en["retain"]))
    assert "Jaime Vasquez" in en["retain"][0]["answer"] and "Jaime Vasquez" in fr["retain"][0]["answer"]
    assert "Basil Mahfouz Al-Kuwaiti" in en["forget"][0]["answer"]
    assert "Basil Mahfouz al-Kuwait" in fr["forget"][0]["answer"]
    assert en["eval_real_authors"][3]["answer"] == fr["eval_real_authors"][3]["answer"] == "George R.R. Martin"
    assert "paraphrased_answer" not in hi["eval_world_facts"][0]
    assert len(hi["eval_forget"][0]["perturbed_answer"]) == 5


def test_forget_training_text_is_the_evaluated_wording_by_default():
    fr = make_language_sets(MTOFU / "fr", n_authors=3, max_questions=40)
    assert [(r["question"], r["answer"]) for r in fr["forget"]] == [
        (r["question"], r["answer"]) for r in fr["eval_forget"]
    ]
    # forget01 was translated separately: row-aligned (same author) but worded differently
    old = make_language_sets(MTOFU / "fr", n_authors=3, max_questions=40, forget_split="forget01")
    assert all(a["answer"] != b["answer"] for a, b in zip(old["forget"], fr["forget"]))
    assert "Basil Mahfouz" in old["forget"][0]["answer"] and "Basil Mahfouz" in fr["forget"][0]["answer"]
    en = make_language_sets(EN, n_authors=3, max_questions=40)  # English: both files hold the same QA
    assert en["forget"] == make_language_sets(EN, n_authors=3, max_questions=40, forget_split="forget01")["forget"]
    with pytest.raises(ValueError, match="forget_split: expected one of"):
        make_language_sets(EN, n_authors=3, max_questions=40, forget_split="forget05")


def test_eval_retain_only_holds_retained_authors():
    sets = make_language_sets(MTOFU / "fr", n_authors=3, max_questions=300)
    assert len(sets["retain"]) == 20 and len(sets["eval_retain"]) == 20
    retain_q = [r["question"] for r in sets["retain"]]
    assert [r["question"] for r in sets["eval_retain"]] == retain_q


def test_romanised_split_keeps_the_row_structure():
    rows = load_language_split(MTOFU / "hi", "forget01_perturbed")
    out = romanise_split(rows, "devanagari")
    assert len(out) == len(rows)
    assert all(set(a) == set(b) for a, b in zip(rows, out))


def test_missing_field_is_a_clear_error(tmp_path):
    broken = tmp_path / "fr"
    shutil.copytree(MTOFU / "fr", broken)
    rows = read_jsonl(broken / "retain_perturbed.jsonl")
    del rows[6]["perturbed_answer"]
    (broken / "retain_perturbed.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"retain_perturbed.jsonl:7: field 'perturbed_answer' missing"):
        check_language_files(broken)
    with pytest.raises(ValueError, match="n_authors: expected 3..200"):
        make_language_sets(MTOFU / "fr", n_authors=2, max_questions=10)


def test_unicode_rouge_tokens():
    tok = UnicodeWords()
    assert tok.tokenize("कुवैत शहर, है।") == ["कुवैत", "शहर", "है"]
    assert tok.tokenize("1956年の") == ["1956", "年", "の"]
    assert tok.tokenize("Kālpanika LĒKHAKA!") == ["kālpanika", "lēkhaka"]
    from rouge_score import tokenize

    text = read_jsonl(EN / "forget01_perturbed.jsonl")[5]["answer"]
    assert tok.tokenize(text) == tokenize.tokenize(text, None)


# ------------------------------------------------------------------------------------------------
# tables and figures from real-format logs


def _log(rng, n_forget=10, n=6, shift=0.0):
    def one(count, npert):
        return {
            "avg_gt_loss": {str(i): float(rng.uniform(0.5, 2)) for i in range(count)},
            "avg_paraphrased_loss": {str(i): float(rng.uniform(0.5, 2) + shift) for i in range(count)},
            "average_perturb_loss": {str(i): [float(x) for x in rng.uniform(1, 3, npert)] for i in range(count)},
            "rougeL_recall": {str(i): float(rng.uniform(0.2, 1)) for i in range(count)},
            "generated_text": {str(i): ["q", "g", "a"] for i in range(count)},
        }

    return {
        "eval_log.json": one(n, 5),
        "eval_log_forget.json": one(n_forget, 5),
        "eval_real_author_wo_options.json": one(n, 3),
        "eval_real_world_wo_options.json": one(n, 3),
    }


def test_tables_and_figures(tmp_path):
    rng = np.random.default_rng(0)
    langs, unlearn, methods = ["en", "hi_R"], ["en"], ["qr_erase", "qr_erase_ll"]
    reference = {y: _log(rng) for y in langs}
    logs = {("base", "base"): {y: _log(rng, shift=-1.0) for y in langs}}
    for m in methods:
        logs[("en", m)] = {y: _log(rng) for y in langs}
    metrics = metrics_rows(logs, reference)
    assert len(metrics) == (1 + 2 + 1) * 2 and metrics.loc[metrics["method"] == "retain", "forget_quality"].isna().all()

    df, spec = pairs_table(metrics, methods, [(x, y) for x in unlearn for y in langs])
    csv = table_csv_frame(df, spec)
    assert list(csv["method"]) == ["base", "retain", "qr_erase", "qr_erase_ll"]
    assert "en>hi_R:forget" in csv.columns and "en>hi_R:utility_mark" in csv.columns
    assert sorted(csv["en>en:utility_mark"][2:]) == ["best", "second"]
    md, tex = render_markdown(df, spec), render_latex(df, spec)
    assert "**en→hi_R**" in md and r"\textbf{en$\to$hi\_R}" in tex

    df, spec = matrix_table(metrics, "qr_erase_ll", unlearn, langs)
    csv = table_csv_frame(df, spec)
    assert list(csv["pair"]) == ["base>en", "base>hi_R", "en>en", "en>hi_R"]
    assert list(csv["display_label"])[-1] == "English → Hindi (R)" and list(csv["reference"]) == [1, 1, 0, 0]
    assert r"English $\to$ Hindi (R)" in render_latex(df, spec)

    points = scatter_points(metrics, "qr_erase_ll", unlearn, langs)
    assert np.allclose(
        points["relative_utility"] * metrics.query("method == 'base'")["model_utility"].to_numpy(),
        points["model_utility"],
    )
    crosslingual_scatter(points, tmp_path / "s.png", labels={c: language_label(c) for c in langs})
    energy_overlay_plot(
        {"English": {"0": 0.5, "1": 0.3, "2": 0.2}, "Hindi": {"0": 0.2, "1": 0.3, "2": 0.5}}, tmp_path / "e.png"
    )
    assert (tmp_path / "s.png").stat().st_size > 1000 and (tmp_path / "e.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="has layers"):
        energy_overlay_plot({"a": {"0": 1.0}, "b": {"1": 1.0}}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="p-values"):
        crosslingual_scatter(
            pd.DataFrame([{"unlearn": "en", "eval": "en", "relative_utility": 1.0, "forget_quality": 2.0}]),
            tmp_path / "y.png",
        )


def test_pretraining_authors_follow_the_retained_ones_in_every_language():
    en = make_language_sets(EN, n_authors=3, max_questions=40, pretrain_authors=2)
    fr = make_language_sets(MTOFU / "fr", n_authors=3, max_questions=40, pretrain_authors=2)
    retain99 = [json.loads(line) for line in open(MTOFU / "fr" / "retain99.jsonl", encoding="utf-8")]
    # the 2 authors after the retained one (rows 20..59 of retain99), then the knowledge QA
    assert [r["question"] for r in fr["pretrain"][:40]] == [r["question"] for r in retain99[20:60]]
    assert fr["pretrain"][40:] == fr["knowledge"] and len(en["pretrain"]) == len(fr["pretrain"])
    assert make_language_sets(EN, n_authors=3, max_questions=40)["pretrain"] == en["knowledge"]
    with pytest.raises(ValueError, match=r"pretrain_authors: expected 0..197"):
        make_language_sets(EN, n_authors=3, max_questions=40, pretrain_authors=198)
