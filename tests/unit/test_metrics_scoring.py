"""Per-sequence metric statistics of a tiny real Llama on TOFU forget / holdout answers (batched,
qrerase/metrics/scoring.py) against one unbatched full forward pass per answer, and the TOFU privacy
table (qrerase/tracks/tofu/mia.py)."""

from __future__ import annotations

import math

import pytest
import torch
from support import REPO

from qrerase.io import read_jsonl
from qrerase.metrics.mia import auc
from qrerase.metrics.registry import metric_function, metrics_for
from qrerase.metrics.scoring import aggregate, sequence_statistics
from qrerase.reports.tables import render_markdown
from qrerase.text.evaluation import EvalConfig
from qrerase.text.lm import PromptTemplate, encode_qa
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer
from qrerase.tracks.tofu.mia import mia_table

DATA = REPO / "data" / "tofu"
TPL = PromptTemplate()
NAMES = metrics_for("tofu", "auc") + metrics_for("tofu", "mean")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    forget = [{"question": r["prompt"], "answer": r["response"]} for r in read_jsonl(DATA / "forget10.jsonl")[394:]]
    holdout = read_jsonl(DATA / "holdout10.jsonl")[394:]
    tok = train_bpe_tokenizer(
        [f"{r['question']} {r['answer']}" for r in forget + holdout], 300, tmp_path_factory.mktemp("t") / "tok"
    )
    cfg = TinyLlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    )
    return tok, build_tiny_llama(cfg, tok, seed=0), forget, holdout


def _unbatched(model, tok, record):
    """Each metric on one sequence: full forward pass, logits shifted by hand, answer positions kept."""
    ids, labels = encode_qa(tok, TPL, record["question"], record["answer"], 10_000)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    keep = torch.tensor(labels[1:]) != -100
    targets = torch.tensor(labels[1:])[keep]
    return {n: metric_function(n)(logits[keep], targets, record["answer"]) for n in NAMES}


def test_batched_statistics_equal_unbatched(setup):
    tok, model, forget, holdout = setup
    model.train()
    stats = sequence_statistics(model, tok, TPL, forget, NAMES, EvalConfig(batch_size=4))
    assert model.training  # mode restored
    for i, record in enumerate(forget):
        single = _unbatched(model, tok, record)
        for n in NAMES:
            assert stats[n][i] == pytest.approx(single[n], rel=1e-4, abs=1e-5), (n, i)
    hold = sequence_statistics(model, tok, TPL, holdout, NAMES, EvalConfig(batch_size=3))
    values = aggregate(stats, hold, NAMES)
    assert values["mia_min_k"] == auc(stats["mia_min_k"], hold["mia_min_k"])
    assert values["exact_memorisation"] == pytest.approx(sum(stats["exact_memorisation"]) / len(forget))
    with pytest.raises(ValueError, match="record 1 lacks"):
        sequence_statistics(model, tok, TPL, [forget[0], {"question": "q"}], NAMES, EvalConfig())
    with pytest.raises(ValueError, match="'privleak' has no per-sequence function"):
        sequence_statistics(model, tok, TPL, forget, ["privleak"], EvalConfig())


def test_mia_table():
    values = {
        "base": {"mia_loss": 0.9, "mia_min_k": 0.8, "extraction_strength": 0.7, "exact_memorisation": 0.9},
        "retain": {"mia_loss": 0.55, "mia_min_k": 0.6, "extraction_strength": 0.1, "exact_memorisation": 0.5},
        "ga": {"mia_loss": 0.3, "mia_min_k": 0.2, "extraction_strength": 0.0, "exact_memorisation": 0.1},
        "qr_erase": {"mia_loss": 0.6, "mia_min_k": 0.7, "extraction_strength": 0.2, "exact_memorisation": 0.4},
    }
    df, spec = mia_table(values)
    row = df.set_index("method")
    # PrivLeak = (r - a) / (1 - r) * 100 with r the retain row's Min-K% AUC (0.6)
    assert row.loc["base", "privleak"] == pytest.approx((0.6 - 0.8) / 0.4 * 100)
    assert row.loc["ga", "privleak"] == pytest.approx((0.6 - 0.2) / 0.4 * 100)
    assert row.loc["retain", "privleak"] == 0.0
    assert math.isnan(row.loc["ga", "mia_zlib"])  # not given: missing
    md = render_markdown(df, spec)
    assert "MIA AUC (Min-K%) (→ 0.5)" in md and "PrivLeak (→ 0)" in md
    assert "| Gradient Ascent | <u>0.3000</u> |" in md  # LOSS AUC: QR-Erase 0.6 closest to 0.5, GA 0.3 next
    assert "Extraction Strength ↓" in md and "**0.0000**" in md  # GA: best (lowest) extraction strength
    no_ref, _ = mia_table({"ga": values["ga"]})
    assert math.isnan(no_ref.loc[0, "privleak"])
