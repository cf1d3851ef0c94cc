"""qrerase.tracks.task_level.tradeoff: the in-process erase of the λ / k sweep (against the erase rules'
closed form), the held-out NLL, the λ rule's pick turned into table rows; on real small tensors and
the tiny text model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from support.tiny_text import DATA, TINY

from qrerase.method.decompose import decompose_dense
from qrerase.method.discriminate import discriminate
from qrerase.text.evaluation import EvalConfig
from qrerase.text.lm import PromptTemplate
from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
from qrerase.text.tradeoff import select_scale
from qrerase.tracks.task_level.data import TaskLevelDataConfig, make_task_level_sets
from qrerase.tracks.task_level.evaluation import evaluate_skill
from qrerase.tracks.task_level.tradeoff import erase_points, held_out_nll, picked_rows, point_row

MODULES = ("a", "b")


def _net_and_factors(ranks=(1, 2)):
    g = torch.Generator().manual_seed(0)
    net = torch.nn.Module()
    net.a, net.b = torch.nn.Linear(6, 5, bias=False), torch.nn.Linear(6, 5, bias=False)
    tasks = {s: {m: torch.randn(5, 3, generator=g) @ torch.randn(3, 6, generator=g) for m in MODULES} for s in "fr"}
    factors = {
        k: tuple({m: decompose_dense(tasks[s][m].numpy(), k, "cpqr", name=m) for m in MODULES} for s in "fr")
        for k in ranks
    }
    return net, factors


def test_points_are_the_erase_rules_edit_and_weights_come_back():
    net, factors = _net_and_factors()
    original = {m: net.get_submodule(m).weight.detach().clone() for m in MODULES}
    seen = []
    for k, lam in erase_points(net, factors, [0, 0.5, 3.0]):
        # what forget_update + erase build at this λ: W' = W - U V with U V from discriminate(scale=λ)
        upd = discriminate(*factors[k], scale=lam)
        for m in MODULES:
            expected = original[m].numpy() - np.asarray(upd[m].U) @ np.asarray(upd[m].V)
            np.testing.assert_allclose(net.get_submodule(m).weight.detach().numpy(), expected, atol=1e-5)
        seen.append((k, lam))
    assert seen == [(1, 0.0), (1, 0.5), (1, 3.0), (2, 0.0), (2, 0.5), (2, 3.0)]
    for m in MODULES:
        assert torch.equal(net.get_submodule(m).weight, original[m])


def test_a_selection_edits_only_its_modules_and_an_abandoned_sweep_restores():
    net, factors = _net_and_factors(ranks=(2,))
    original = {m: net.get_submodule(m).weight.detach().clone() for m in MODULES}
    points = erase_points(net, factors, [2.0], modules=["b"])
    next(points)
    assert torch.equal(net.a.weight, original["a"]) and not torch.equal(net.b.weight, original["b"])
    points.close()  # the consumer stopped (an error in an evaluation): the weights still come back
    assert torch.equal(net.b.weight, original["b"])


@pytest.mark.parametrize(
    "kwargs, message",
    [({"scales": []}, "no ranks or no scales"), ({"scales": [-1]}, ">= 0"), ({"modules": ["c"]}, "have no factors")],
)
def test_bad_sweeps_are_errors(kwargs, message):
    net, factors = _net_and_factors(ranks=(1,))
    args = {"scales": [1.0], **kwargs}
    with pytest.raises(ValueError, match=message):
        list(erase_points(net, factors, args.pop("scales"), **args))


def test_held_out_nll_is_the_evaluations_token_mean(tmp_path):
    cfg = TaskLevelDataConfig.from_dict(
        {
            "forget": "arithmetic",
            "similar": "word_math",
            "unrelated": "knowledge",
            "sizes": {
                "arithmetic": {"train": 20, "eval": 8, "new": 4},
                "word_math": {"train": 20, "eval": 8, "new": 6},
                "knowledge": {"train": 10, "eval": 8, "new": 6},
            },
            "knowledge": {"root": str(DATA), "format": "cloze"},
        }
    )
    sets = make_task_level_sets(cfg, 0)
    texts = [t for r in sets["finetune_full"] for t in (r["question"], r["answer"])]
    tok = train_bpe_tokenizer(texts, 400, tmp_path, individual_digits=True)
    model = build_tiny_llama(TINY, tok, seed=0)
    ecfg = EvalConfig(batch_size=8, max_new_tokens=2, max_length=96)
    tune = sets["tune_retain"]
    assert {r["skill"] for r in tune} == {"word_math", "knowledge"}
    # on one skill at a time it is evaluate_skill's NLL (cloze items: the correct option's text)
    for skill in ("word_math", "knowledge"):
        part = [r for r in tune if r["skill"] == skill]
        expected = evaluate_skill(model, tok, PromptTemplate(), part, ecfg)["nll"]
        assert held_out_nll(model, tok, PromptTemplate(), part, ecfg) == pytest.approx(expected, rel=1e-6)
    assert held_out_nll(model, tok, PromptTemplate(), tune, ecfg) > 0
    with pytest.raises(ValueError, match="empty"):
        held_out_nll(model, tok, PromptTemplate(), [], ecfg)


def test_the_rule_reads_the_held_out_slice_and_the_pick_becomes_table_rows():
    roles = lambda acc: [  # noqa: E731
        {"role": r, "accuracy": acc, "nll": 1.0 + acc, "n": 4} for r in ("forget", "similar", "unrelated")
    ]
    # held-out NLL: 2.00, 2.05, 2.30 at λ 0, 1, 4 -> the rule (rise <= 0.1) picks λ = 1
    grid = ((0, 2.0, 0.9), (1, 2.05, 0.5), (4, 2.3, 0.1))
    points = pd.DataFrame([point_row("qr_erase", 2, lam, nll, roles(acc)) for lam, nll, acc in grid])
    selection = select_scale(points, 0.1)
    assert selection[["method", "rank", "selected_scale"]].values.tolist() == [["qr_erase", 2, 1.0]]
    # the evaluation columns do not move the pick: same held-out column, other accuracies
    other = points.assign(forget_accuracy=[0.0, 1.0, 0.0], similar_accuracy=[1.0, 0.0, 1.0])
    assert select_scale(other, 0.1)["selected_scale"].tolist() == [1.0]
    rows = picked_rows(points, selection, {"forget": "arithmetic", "similar": "word_math", "unrelated": "knowledge"})
    assert [r["model"] for r in rows] == ["qr_erase_k2"] * 3
    assert {r["role"]: r["accuracy"] for r in rows} == {"forget": 0.5, "similar": 0.5, "unrelated": 0.5}
    assert rows[0]["skill"] == "arithmetic" and rows[0]["n"] == 4
