"""A metric is its function plus its registration: the toy plug-in tests/plugins/toy_metric.py registers
``toy_confidence`` (mean teacher-forced answer-token probability, closest to 0.5 best) on the tofu
track, and with no other file changed it is validated, imported by the planner and by every job, computed
by the TOFU evaluation (on a tiny real Llama), a column of the TOFU metrics and headline tables ranked by
closeness to 0.5, and named on the results page."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from support import PLUGINS, REPO

from qrerase import registry
from qrerase.io import read_jsonl
from qrerase.metrics import registry as reg
from qrerase.metrics.scoring import track_sequence_metrics
from qrerase.reports.tables import render_markdown, write_table
from qrerase.text.evaluation import EvalConfig
from qrerase.text.lm import PromptTemplate, encode_qa
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer
from qrerase.tracks.tofu.mia import mia_table
from qrerase.tracks.tofu.tables import privacy_frame, privacy_metrics, tofu_table

TPL = PromptTemplate()
BUILT_IN_TOFU = list(reg.metrics_for("tofu"))


@pytest.fixture
def plugin_path(monkeypatch):
    """The registry as loaded and tests/plugins importable; the toy plug-in is imported afresh and
    forgotten after the test (its metric leaks into no other test)."""
    monkeypatch.setattr(reg, "_METRICS", dict(reg._METRICS))
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "toy_metric", raising=False)
    yield
    sys.modules.pop("toy_metric", None)


@pytest.fixture
def toy(plugin_path):
    registry.load_plugins(["toy_metric"])  # what the planner and every job do with the config key `plugins`
    return reg.metric("toy_confidence")


def test_registration_is_validated(plugin_path):
    kw = dict(label="Toy", tracks=("tofu",), needs=("forget",), aggregate="mean", fn="toy_metric:f")
    for over, message in (
        ({"direction": "closest"}, "metric 'toy': direction must be one of ['higher', 'lower', 'target']"),
        ({"direction": "target"}, "metric 'toy': direction 'target' needs a finite target value, got None"),
        ({"direction": "target", "target": 0.5, "headline": -1}, "headline must be a non-negative int"),
        ({"direction": "target", "target": 0.5, "fmt": "{:.3q}"}, "fmt must format one float"),
        ({"direction": "lower", "track_fns": {"speech": "m:f"}}, "track_fns names track(s) ['speech'] not among"),
        ({"direction": "lower", "track_fns": {"tofu": 3}}, "track_fns['tofu'] must be a callable"),
        ({"direction": "lower", "tracks": ("crosslingual",)}, "track(s) ['crosslingual'] compute no registered metric"),
    ):
        with pytest.raises(reg.MetricError) as exc:
            reg.register_metric("toy", **{**kw, **over})
        assert message in str(exc.value) and "\n" not in str(exc.value)
    assert "toy" not in reg.metric_names()
    registry.load_plugins(["toy_metric"])
    m = reg.metric("toy_confidence")
    assert (m.direction, m.target, m.tracks, m.aggregate, m.fmt, m.headline) == (
        "target",
        0.5,
        ("tofu", "speech"),
        "mean",
        "{:.3f}",
        2,
    )
    assert reg.metrics_for("tofu") == [*BUILT_IN_TOFU, "toy_confidence"]
    assert reg.headline_metrics("tofu") == ["privleak", "mia_min_k_plus_plus", "toy_confidence"]
    assert privacy_metrics() == ("privleak", "mia_min_k_plus_plus", "toy_confidence")
    with pytest.raises(reg.MetricError, match="metric 'toy_confidence' is already registered"):
        sys.modules.pop("toy_metric")
        registry.load_plugins(["toy_metric"])  # a second registration of one name


def test_planning_and_jobs_import_the_plugin(plugin_path, tmp_path, monkeypatch):
    """The config's `plugins` register the metric at planning time (validation) and in a job's process
    (qrerase.workflow.job.job, which every evaluation script runs in)."""
    from snakemake.iocontainers import InputFiles, Log, OutputFiles, Params, Snakemake, Wildcards

    from qrerase.workflow.job import job
    from qrerase.workflow.validation import load_config_plugins

    load_config_plugins({"plugins": ["toy_metric"]})
    assert "toy_confidence" in reg.metrics_for("tofu", "mean")
    monkeypatch.setattr(reg, "_METRICS", {k: v for k, v in reg._METRICS.items() if k != "toy_confidence"})
    sys.modules.pop("toy_metric")
    monkeypatch.chdir(tmp_path)
    smk = Snakemake(
        InputFiles([]),
        OutputFiles(["results/out.txt"]),
        Params(fromdict={}),
        Wildcards(fromdict={"model": "ga"}),
        1,
        None,
        Log(["results/logs/x.log"]),
        {"plugins": ["toy_metric"]},
        "evaluate",
        None,
        str(REPO / "workflow_scripts"),
    )
    (tmp_path / "results" / "logs").mkdir(parents=True)
    with job(smk):
        names = reg.metrics_for("tofu", "mean")
        Path(smk.output[0]).write_text("x")
    assert names == ["extraction_strength", "exact_memorisation", "toy_confidence"]


def test_the_tofu_evaluation_computes_it(toy, tmp_path):
    data = REPO / "data" / "tofu"
    forget = [{"question": r["prompt"], "answer": r["response"]} for r in read_jsonl(data / "forget10.jsonl")[396:]]
    holdout = read_jsonl(data / "holdout10.jsonl")[396:]
    tok = train_bpe_tokenizer([f"{r['question']} {r['answer']}" for r in forget + holdout], 300, tmp_path / "tok")
    cfg = TinyLlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    )
    model = build_tiny_llama(cfg, tok, seed=0)
    out = track_sequence_metrics(model, tok, TPL, forget, holdout, EvalConfig(batch_size=4), "tofu")
    assert list(out["metrics"]) == [*reg.metrics_for("tofu", "auc"), *reg.metrics_for("tofu", "mean")]
    assert list(out["metrics"])[-1] == "toy_confidence"
    # independently: one unbatched forward pass per answer, softmax probability of each answer token
    per_answer = []
    for r in forget:
        ids, labels = encode_qa(tok, TPL, r["question"], r["answer"], 10_000)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
        keep = torch.tensor(labels[1:]) != -100
        targets = torch.tensor(labels[1:])[keep]
        probs = torch.softmax(logits[keep], dim=-1)[torch.arange(len(targets)), targets]
        per_answer.append(float(probs.mean()))
    assert out["forget"]["toy_confidence"] == pytest.approx(per_answer, rel=1e-4)
    assert out["metrics"]["toy_confidence"] == pytest.approx(sum(per_answer) / len(per_answer), rel=1e-4)
    assert len(out["holdout"]["toy_confidence"]) == len(holdout)


VALUES = {  # sequence_metrics.json 'metrics' of five models; toy: npo (0.45) is closest to 0.5, then rmu (0.58)
    "base": {"mia_min_k": 0.8, "mia_min_k_plus_plus": 0.85, "toy_confidence": 0.93},
    "retain": {"mia_min_k": 0.6, "mia_min_k_plus_plus": 0.55, "toy_confidence": 0.50},
    "ga": {"mia_min_k": 0.2, "mia_min_k_plus_plus": 0.3, "toy_confidence": 0.05},
    "npo": {"mia_min_k": 0.7, "mia_min_k_plus_plus": 0.6, "toy_confidence": 0.45},
    "rmu": {"mia_min_k": 0.65, "mia_min_k_plus_plus": 0.52, "toy_confidence": 0.58},
    "simnpo": {"mia_min_k": 0.9, "mia_min_k_plus_plus": 0.9, "toy_confidence": 0.99},
}


def test_it_is_a_column_of_the_tofu_tables_and_the_results_page(toy, tmp_path, monkeypatch):
    df, spec = mia_table(VALUES)
    assert list(df.columns)[-1] == "toy_confidence" and spec.columns[-1].target == 0.5
    md = render_markdown(df, spec)
    assert "| **Toy Confidence (→ 0.5)** |" in md
    # the reference rows (base, retain) are not ranked; of the others NPO (|0.45 - 0.5|) is best, RMU second,
    # although GA has the lowest value and SimNPO the highest
    last = {row.split(" | ")[0].strip("| "): row.rsplit(" | ", 1)[-1].strip(" |") for row in md.splitlines()[2:]}
    assert last == {
        "Base Model": "0.930",
        "Retain reference": "0.500",
        "Gradient Ascent": "0.050",
        "NPO": "**0.450**",
        "RMU": "<u>0.580</u>",
        "SimNPO": "0.990",
    }
    tofu_rows = pd.DataFrame({"method": list(VALUES), "model_utility": [0.6, 0.58, 0.1, 0.5, 0.55, 0.57]})
    table, tspec = tofu_table(tofu_rows, privacy=privacy_frame(VALUES))
    assert [c.name for c in tspec.columns][-3:] == ["privleak", "mia_min_k_plus_plus", "toy_confidence"]
    assert table.set_index("method").loc["npo", "toy_confidence"] == 0.45
    tables = tmp_path / "results" / "tables"
    write_table(df, spec, tables / "tofu_mia.csv", tables / "tofu_mia.md", None)
    sys.modules.pop("toy_metric")
    monkeypatch.setattr(reg, "_METRICS", {k: v for k, v in reg._METRICS.items() if k != "toy_confidence"})
    from qrerase.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["results-pages", "results", "--out", "site", "--commit", "abc1234", "--date", "2025-01-01"]
    assert main([*args, "--plugins", "toy_metric"]) == 0  # the run's `plugins`: the note names its metric
    page = (tmp_path / "site" / "tofu.md").read_text(encoding="utf-8")
    assert (tables / "tofu_mia.md").read_text(encoding="utf-8").strip() in page
    note = "- Toy Confidence (`toy_confidence`): closest to 0.5 is best; mean teacher-forced probability"
    assert note in page
    snippet = (tmp_path / "site" / "snippets" / "tofu_mia.txt").read_text(encoding="utf-8")
    assert "| Toy Confidence |" in snippet.split("\n")[2] and "| *ideal* |" in snippet


def test_a_plugin_metric_reaches_the_speech_evaluation_and_table_through_its_track_function(toy):
    import numpy as np

    from qrerase.tracks.speech.privacy import attack_metrics
    from qrerase.tracks.speech.tables import speech_mia_table

    rng = np.random.default_rng(3)
    members = (rng.normal(size=(5, 4)), np.array([0, 1, 2, 3, 0]))
    nonmembers = (rng.normal(size=(3, 4)), np.array([1, 1, 2]))
    got = attack_metrics(members, nonmembers)
    assert list(got) == ["mia_loss", "toy_confidence"]  # registry order: built-in, then the plug-in's
    z, y = members
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    assert got["toy_confidence"] == pytest.approx(float(p[np.arange(5), y].mean()), abs=1e-12)
    values = {("class", m): {"mia_loss": 0.6, "toy_confidence": c} for m, c in (("base", 0.9), ("ga", 0.45))}
    df, spec = speech_mia_table(values, ["class"], ["base", "ga"])
    assert list(df.columns) == ["method", "class_mia_loss", "class_toy_confidence"]
    assert "Toy Confidence (→ 0.5)" in render_markdown(df, spec)
