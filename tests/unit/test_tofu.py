"""TOFU metrics against TOFU's published logs and against hand computations."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import hmean, ks_2samp
from support import REPO

from qrerase.io import write_json
from qrerase.metrics import log_metrics
from qrerase.text import eval_log
from qrerase.text.evaluation import rouge_recalls

LOGS = REPO / "data" / "tofu_reference_logs"
FULL = LOGS / "ft_epoch5_lr1e-05_llama2-7b_full_wd0.01.json"
RETAIN90 = LOGS / "ft_epoch5_lr1e-05_llama2-7b_retain90_wd0.01.json"


@pytest.fixture(scope="module")
def full():
    return eval_log.load_log(FULL)


@pytest.fixture(scope="module")
def retain90():
    return eval_log.load_log(RETAIN90)


# ----------------------------------------------------------------------------------------------
# the published logs


def test_model_utility_of_published_base_model_is_paper_value(full):
    mu = log_metrics.model_utility(full)
    assert round(mu, 4) == 0.6227  # the paper's "Base Model" row
    assert mu == pytest.approx(0.6226773637427152, rel=1e-12)


def test_forget_quality_full_vs_retain90_fails_forgetting(full, retain90):
    fq = log_metrics.forget_quality(full, retain90)
    assert fq < 1e-15  # far below the 0.1 success threshold
    assert fq == pytest.approx(1.834066410994743e-21, rel=1e-9)
    stat, p = log_metrics.forget_ks(full, retain90)
    assert p == fq and stat == pytest.approx(119 / 300)
    # the retain reference against itself: identical samples, p = 1
    assert log_metrics.forget_quality(retain90, retain90) == 1.0


def _tofu_reference_aggregation(log):
    """TOFU's aggregate_eval_stat.get_model_utility, transcribed (dict order, numpy arrays)."""
    out = {}
    for k, v in log.items():
        if "eval_log" in k:
            prob = np.mean(np.exp(-np.array(list(v["avg_gt_loss"].values()))))
        else:
            t = np.exp(-np.array(list(v["avg_gt_loss"].values())))
            f = np.exp(-np.array(list(v["average_perturb_loss"].values())))
            prob = np.mean(t / np.concatenate([t[:, None], f], axis=1).sum(-1))
        rouge = np.array(list(v["rougeL_recall"].values())).mean()
        para = np.array(list(v["avg_paraphrased_loss"].values()))
        pert = np.array(list(v["average_perturb_loss"].values())).mean(-1)
        r = np.exp(pert - para)
        tr = np.mean(np.minimum(r, 1 / r)) if "forget" in k else np.mean(np.maximum(0, 1 - 1 / r))
        out[k] = (prob, rouge, tr)
    return out


def test_components_match_transcribed_tofu_code(full, retain90):
    for log in (full, retain90):
        ref = _tofu_reference_aggregation(log)
        comps = log_metrics.component_metrics(log)
        for name, fname in eval_log.FILES.items():
            p, r, t = ref[fname]
            assert comps[f"{name}_probability"] == pytest.approx(p, rel=1e-12)
            assert comps[f"{name}_rougeL"] == pytest.approx(r, rel=1e-12)
            assert comps[f"{name}_truth_ratio"] == pytest.approx(t, rel=1e-12)
        nine = [v for f, vals in ref.items() if "forget" not in f for v in vals]
        assert log_metrics.model_utility(log) == pytest.approx(hmean(nine), rel=1e-12)
    comps = log_metrics.component_metrics(full)
    assert list(comps) == [f"{s}_{m}" for s in eval_log.LOG_SETS for m in ("probability", "rougeL", "truth_ratio")]
    assert comps["retain_probability"] == pytest.approx(0.9895272273969067, rel=1e-12)
    assert comps["real_authors_rougeL"] == pytest.approx(0.933, rel=1e-12)
    assert comps["world_facts_truth_ratio"] == pytest.approx(0.5390328416393139, rel=1e-12)


def test_published_truth_ratio_field_is_inverse_of_R(full):
    # TOFU stores truth_ratio = 1/R; our R is the statistic the aggregation uses.
    s = full[eval_log.FILES["forget"]]
    r = log_metrics.truth_ratios(s)
    stored = np.array([s["truth_ratio"][q] for q in sorted(s["truth_ratio"], key=int)])
    np.testing.assert_allclose(1 / r, stored, rtol=1e-5)


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L recall as the evaluation scores it (TOFU's tokenizer: stemmed English)."""
    return rouge_recalls([prediction], [reference])[1][0]


def test_rouge_recalls_reproduce_published_values(full):
    # generated_text is [prompt, generation, ground truth] in TOFU's logs
    for fname in (eval_log.FILES["world_facts"], eval_log.FILES["real_authors"]):
        s = full[fname]
        keys = list(s["generated_text"])
        gens = [s["generated_text"][q][1] for q in keys]
        gts = [s["generated_text"][q][2] for q in keys]
        _, rl = rouge_recalls(gens, gts)
        np.testing.assert_allclose(rl, [s["rougeL_recall"][q] for q in keys], rtol=0, atol=1e-12)
    assert rouge_l("The cat sat on the mat", "the cat") == 1.0
    assert rouge_l("a b", "a b c d") == 0.5
    assert rouge_l("running dogs", "the dog runs") == pytest.approx(1 / 3)  # stemmer: dogs->dog


def test_metrics_frame(full, retain90):
    df = log_metrics.metrics_frame(full, retain90, model="base")
    assert list(df.columns) == ["model", "metric", "value"]
    assert len(df) == 16 and set(df["model"]) == {"base"}
    vals = dict(zip(df["metric"], df["value"]))
    assert round(vals["model_utility"], 4) == 0.6227
    assert vals["forget_quality"] == log_metrics.forget_quality(full, retain90)
    assert list(df["metric"])[-4:] == ["forget_nll", "retain_nll", "model_utility", "forget_quality"]
    assert vals["forget_nll"] == pytest.approx(np.mean(list(full["eval_log_forget.json"]["avg_gt_loss"].values())))
    df2 = log_metrics.metrics_frame(full, model="x")
    assert len(df2) == 15 and "forget_quality" not in set(df2["metric"])


# ----------------------------------------------------------------------------------------------
# a hand-made log

L2, L4 = math.log(2.0), math.log(4.0)


def _set(gt, para, pert, rouge, keys=("2", "10")):
    def d(vals):
        return dict(zip(keys, vals))

    return {
        "avg_gt_loss": d(gt),
        "avg_paraphrased_loss": d(para),
        "average_perturb_loss": d(pert),
        "rougeL_recall": d(rouge),
        "generated_text": d([["q", "gen", "gt"]] * len(gt)),
    }


def hand_log():
    # question "2": R = e (perturbed answers less likely than the paraphrase); question "10": R = 1/e
    return {
        "eval_log.json": _set([L2, L4], [1.0, 2.0], [[2.0, 2.0], [1.0, 1.0]], [1.0, 0.5]),
        "eval_log_forget.json": _set([L2, L2], [1.0, 2.0], [[1.5, 2.5], [1.0, 1.0]], [0.25, 0.75]),
        "eval_real_author_wo_options.json": _set([L2, L4], [L2, L4], [[L2, L4], [L4, L4]], [1.0, 0.0]),
        "eval_real_world_wo_options.json": _set([L2, L4], [L2, L4], [[L4, L4], [L4, L4]], [0.5, 0.5]),
    }


def test_hand_log_components():
    log = hand_log()
    eval_log.validate_log(log, source="hand")
    c = log_metrics.component_metrics(log)
    e = math.e
    assert c["retain_probability"] == pytest.approx((0.5 + 0.25) / 2)
    assert c["forget_probability"] == pytest.approx(0.5)
    # normalised: 0.5/(0.5+0.5+0.25) = 0.4 and 0.25/(0.25+0.25+0.25) = 1/3
    assert c["real_authors_probability"] == pytest.approx((0.4 + 1 / 3) / 2)
    # 0.5/(0.5+0.25+0.25) = 0.5 and 1/3
    assert c["world_facts_probability"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert c["retain_rougeL"] == pytest.approx(0.75)
    assert c["real_authors_rougeL"] == pytest.approx(0.5)
    # retain R = (e, 1/e): max(0, 1-1/R) = (1 - 1/e, 0)
    assert c["retain_truth_ratio"] == pytest.approx((1 - 1 / e) / 2)
    # forget R = (e, 1/e): min(R, 1/R) = 1/e each
    assert c["forget_truth_ratio"] == pytest.approx(1 / e)
    # R in integer question order: "2" before "10"
    np.testing.assert_allclose(log_metrics.truth_ratios(log["eval_log.json"]), [e, 1 / e])
    # real authors: R = exp(mean(pert) - para) = (exp((L2+L4)/2 - L2), 1) = (sqrt 2, 1)
    np.testing.assert_allclose(log_metrics.truth_ratios(log["eval_real_author_wo_options.json"]), [math.sqrt(2), 1.0])
    assert c["real_authors_truth_ratio"] == pytest.approx((1 - 1 / math.sqrt(2)) / 2)
    assert log_metrics.probability(log["eval_log.json"], "eval_log.json") == c["retain_probability"]
    assert log_metrics.truth_ratio_metric(log["eval_log_forget.json"], forget=False) == pytest.approx((1 - 1 / e) / 2)
    nine = [c[f"{s}_{m}"] for s in eval_log.UTILITY_SETS for m in ("probability", "rougeL", "truth_ratio")]
    assert log_metrics.model_utility(log) == pytest.approx(len(nine) / sum(1 / v for v in nine))


def test_model_utility_zero_when_a_component_is_zero():
    log = hand_log()
    s = log["eval_log.json"]
    s["average_perturb_loss"] = {"2": [0.5, 0.5], "10": [1.0, 1.0]}  # every R < 1 -> truth ratio 0
    assert log_metrics.component_metrics(log)["retain_truth_ratio"] == 0.0
    assert log_metrics.model_utility(log) == 0.0


def test_forget_quality_hand():
    a, b = hand_log(), hand_log()
    b["eval_log_forget.json"]["avg_paraphrased_loss"] = {"2": 5.0, "10": 6.0}
    ra = log_metrics.truth_ratios(a["eval_log_forget.json"])
    rb = log_metrics.truth_ratios(b["eval_log_forget.json"])
    assert log_metrics.forget_quality(a, b) == pytest.approx(ks_2samp(ra, rb).pvalue)
    assert log_metrics.forget_quality(a, a) == 1.0


def test_forget_quality_question_count_mismatch_names_both(full):
    small = hand_log()
    with pytest.raises(ValueError, match=r"qr_erase.*300.*retain90.*2"):
        log_metrics.forget_quality(full, small, name="qr_erase", reference_name="retain90")


# ----------------------------------------------------------------------------------------------
# bad inputs


def _drop_field(log):
    del log["eval_log_forget.json"]["avg_paraphrased_loss"]
    return "eval_log_forget.json", "avg_paraphrased_loss"


def _nan_loss(log):
    log["eval_log.json"]["avg_gt_loss"]["10"] = float("nan")
    return "eval_log.json", "avg_gt_loss"


def _inf_perturb(log):
    log["eval_real_world_wo_options.json"]["average_perturb_loss"]["2"] = [1.0, float("inf")]
    return "eval_real_world_wo_options.json", "average_perturb_loss"


def _short_field(log):
    del log["eval_real_author_wo_options.json"]["rougeL_recall"]["10"]
    return "eval_real_author_wo_options.json", "rougeL_recall"


def _empty_set(log):
    log["eval_log_forget.json"] = {f: {} for f in eval_log.REQUIRED_FIELDS}
    return "eval_log_forget.json", "avg_gt_loss"


def _bad_perturb_len(log):
    log["eval_log.json"]["num_token_perturb"] = {"2": [3, 4], "10": [3]}
    return "eval_log.json", "num_token_perturb"


def _bad_generated(log):
    log["eval_log.json"]["generated_text"]["2"] = ["only one"]
    return "eval_log.json", "generated_text"


def _empty_perturb(log):
    log["eval_log_forget.json"]["average_perturb_loss"]["10"] = []
    return "eval_log_forget.json", "average_perturb_loss"


def _string_loss(log):
    log["eval_log.json"]["avg_paraphrased_loss"]["2"] = "1.0"
    return "eval_log.json", "avg_paraphrased_loss"


BREAKERS = [
    _drop_field,
    _nan_loss,
    _inf_perturb,
    _short_field,
    _empty_set,
    _bad_perturb_len,
    _bad_generated,
    _empty_perturb,
    _string_loss,
]


@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda f: f.__name__.strip("_"))
def test_bad_aggregated_log_names_file_set_and_field(tmp_path, breaker):
    log = hand_log()
    fname, field = breaker(log)
    path = tmp_path / "eval_log_aggregated.json"
    write_json(path, log)
    with pytest.raises(ValueError) as err:
        eval_log.load_log(path)
    msg = str(err.value)
    assert str(path) in msg and fname in msg and repr(field) in msg, msg
    with pytest.raises(ValueError, match=field):
        eval_log.validate_log(log, source="in-memory")


@pytest.mark.parametrize("breaker", BREAKERS, ids=lambda f: f.__name__.strip("_"))
def test_bad_log_directory_names_the_file_and_field(tmp_path, breaker):
    log = hand_log()
    fname, field = breaker(log)
    for f, content in log.items():
        write_json(tmp_path / f, content)
    with pytest.raises(ValueError) as err:
        eval_log.load_log(tmp_path)
    msg = str(err.value)
    assert str(tmp_path / fname) in msg and repr(field) in msg, msg


def test_missing_set_and_bad_json(tmp_path):
    log = hand_log()
    del log["eval_real_world_wo_options.json"]
    path = tmp_path / "agg.json"
    write_json(path, log)
    with pytest.raises(ValueError, match=r"agg\.json.*eval_real_world_wo_options\.json"):
        eval_log.load_log(path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        eval_log.load_log(bad)
    with pytest.raises(FileNotFoundError, match="missing"):
        eval_log.load_log(tmp_path)  # a directory without the four files
    with pytest.raises(ValueError, match="unknown TOFU set"):
        log_metrics.probability(hand_log()["eval_log.json"], "holdout")


def test_write_log_refuses_invalid_log(tmp_path):
    log = hand_log()
    _nan_loss(log)
    with pytest.raises(ValueError, match="avg_gt_loss"):
        eval_log.write_log(log, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# round trips


def test_round_trip_directory_and_aggregated(tmp_path, full):
    eval_log.write_log(full, tmp_path / "eval")
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == sorted(eval_log.FILES.values())
    back = eval_log.load_log(tmp_path / "eval")
    assert back == full
    eval_log.write_aggregated(full, tmp_path / "agg" / "eval_log_aggregated.json")
    back2 = eval_log.load_log(tmp_path / "agg" / "eval_log_aggregated.json")
    assert back2 == full
    assert eval_log.load_log(tmp_path / "agg") == full  # directory holding only the aggregated file
    assert log_metrics.model_utility(back) == log_metrics.model_utility(full)
    # byte-identical when written twice
    eval_log.write_aggregated(full, tmp_path / "agg2.json")
    assert (tmp_path / "agg2.json").read_bytes() == (tmp_path / "agg" / "eval_log_aggregated.json").read_bytes()


def test_write_log_accepts_numpy_values(tmp_path):
    log = hand_log()
    s = log["eval_log.json"]
    s["avg_gt_loss"] = {k: np.float32(v) for k, v in s["avg_gt_loss"].items()}
    s["average_perturb_loss"] = {k: np.asarray(v) for k, v in s["average_perturb_loss"].items()}
    s["num_token_gt"] = {"2": np.int64(3), "10": np.int64(4)}
    eval_log.write_log(log, tmp_path)
    back = eval_log.load_log(tmp_path)
    assert back["eval_log.json"]["num_token_gt"] == {"2": 3, "10": 4}
    assert log_metrics.component_metrics(back) == pytest.approx(log_metrics.component_metrics(log))


def test_alias_keys_of_forked_aggregated_files(tmp_path):
    log = hand_log()
    alias = {
        "log": log["eval_log.json"],
        "log_forget": log["eval_log_forget.json"],
        "real_author_wo_options": log["eval_real_author_wo_options.json"],
        "real_world_wo_options": log["eval_real_world_wo_options.json"],
    }
    path = tmp_path / "a.json"
    path.write_text(json.dumps(alias))
    assert eval_log.load_log(path) == hand_log()


# ----------------------------------------------------------------------------------------------
# plot


def test_truth_ratio_plot(tmp_path, full, retain90):
    from qrerase.reports.plots import truth_ratio_plot

    f = eval_log.FILES["forget"]
    ratios = {"base": log_metrics.truth_ratios(full[f]), "retain": log_metrics.truth_ratios(retain90[f])}
    pv = truth_ratio_plot(ratios, "retain", tmp_path / "a.png")
    assert pv == {"base": log_metrics.forget_quality(full, retain90)}
    truth_ratio_plot(ratios, "retain", tmp_path / "b.png")
    data = (tmp_path / "a.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data == (tmp_path / "b.png").read_bytes()
    truth_ratio_plot(ratios, "retain", tmp_path / "a.svg")
    truth_ratio_plot(ratios, "retain", tmp_path / "b.svg")
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()
    with pytest.raises(ValueError, match="reference"):
        truth_ratio_plot(ratios, "nope", tmp_path / "c.png")
    assert not list(tmp_path.glob(".*tmp"))


def test_the_metrics_command_prints_the_metrics_frame_of_a_log(capsys):
    """``qrerase metrics LOG --reference REF``: the CSV of :func:`metrics_frame` on the published logs."""
    import io

    import pandas as pd

    from qrerase.cli import main

    assert main(["metrics", str(FULL), "--reference", str(RETAIN90), "--name", "base"]) == 0
    printed = pd.read_csv(io.StringIO(capsys.readouterr().out))
    expected = log_metrics.metrics_frame(eval_log.load_log(FULL), eval_log.load_log(RETAIN90), model="base")
    assert list(printed["metric"]) == list(expected["metric"])
    assert np.allclose(printed["value"], expected["value"], rtol=1e-5, equal_nan=True)
    mu = float(printed.loc[printed["metric"] == "model_utility", "value"].iloc[0])
    assert round(mu, 4) == 0.6227
