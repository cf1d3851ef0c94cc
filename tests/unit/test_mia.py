"""Membership-inference scores, AUC, PrivLeak and memorisation metrics against independent plain-Python
computations on small hand-built logits (qrerase/metrics/mia.py, privleak.py, memorisation.py)."""

from __future__ import annotations

import itertools
import math
import zlib
from types import SimpleNamespace

import pytest
import torch

from qrerase.metrics.memorisation import exact_memorisation, extraction_strength
from qrerase.metrics.mia import (
    auc,
    gradnorm_score,
    loss_score,
    min_k_plus_plus_score,
    min_k_score,
    token_log_probs,
    zlib_score,
)
from qrerase.metrics.privleak import privleak

# 5 answer positions over a vocabulary of 4
LOGITS = [
    [2.0, 0.5, -1.0, 0.0],
    [0.1, 0.2, 0.3, 0.4],
    [-2.0, 3.0, 1.0, 0.5],
    [1.5, 1.5, -0.5, 2.5],
    [0.0, -1.0, 4.0, 1.0],
]
TARGETS = [0, 3, 2, 1, 2]


def _log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def _token_lp():
    return [_log_softmax(r)[t] for r, t in zip(LOGITS, TARGETS)]


def _t():
    return torch.tensor(LOGITS), torch.tensor(TARGETS)


def test_token_log_probs_and_loss():
    lp = _token_lp()
    assert token_log_probs(*_t()).tolist() == pytest.approx(lp, abs=1e-6)
    assert loss_score(*_t()) == pytest.approx(sum(lp) / 5, abs=1e-6)  # −mean NLL


def test_zlib():
    text = "Basil Mahfouz Al-Kuwaiti was born in Kuwait City."
    n_bytes = len(zlib.compress(text.encode("utf-8")))
    assert zlib_score(*_t(), text) == pytest.approx((sum(_token_lp()) / 5) / n_bytes, abs=1e-7)
    with pytest.raises(ValueError, match="zlib_score: text"):
        zlib_score(*_t(), "")


def test_min_k():
    lp = sorted(_token_lp())
    assert min_k_score(*_t()) == pytest.approx((lp[0] + lp[1]) / 2, abs=1e-6)  # k=0.4 of 5 tokens: 2
    assert min_k_score(*_t(), k=0.1) == pytest.approx(lp[0], abs=1e-6)  # at least one token
    assert min_k_score(*_t(), k=1.0) == pytest.approx(sum(lp) / 5, abs=1e-6)
    for k in (0, 1.5, True):
        with pytest.raises(ValueError, match="k must be a fraction"):
            min_k_score(*_t(), k=k)


def test_min_k_plus_plus():
    z = []
    for row, t in zip(LOGITS, TARGETS):
        lps = _log_softmax(row)
        mu = sum(math.exp(a) * a for a in lps)
        var = sum(math.exp(a) * a * a for a in lps) - mu * mu
        z.append((lps[t] - mu) / math.sqrt(var))
    z.sort()
    assert min_k_plus_plus_score(*_t()) == pytest.approx((z[0] + z[1]) / 2, abs=1e-5)
    assert min_k_plus_plus_score(*_t(), k=0.6) == pytest.approx(sum(z[:3]) / 3, abs=1e-5)


def test_member_scores_higher():
    """A sequence whose targets are the model's modes scores higher than one whose targets are not,
    for every attack (the sign convention: higher = more likely a member)."""
    logits = torch.tensor(LOGITS)
    member = logits.argmax(-1)
    nonmember = logits.argmin(-1)
    for f in (loss_score, min_k_score, min_k_plus_plus_score):
        assert f(logits, member) > f(logits, nonmember)
    assert zlib_score(logits, member, "some text") > zlib_score(logits, nonmember, "some text")


@pytest.mark.parametrize(
    "logits, targets, match",
    [
        (torch.zeros(3), torch.zeros(3, dtype=torch.long), "logits must be a float tensor"),
        (torch.zeros(3, 4), torch.zeros(3), "targets must be an integer tensor"),
        (torch.zeros(3, 4), torch.zeros(2, dtype=torch.long), "need T >= 1"),
        (torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), "need T >= 1"),
        (torch.zeros(2, 4), torch.tensor([0, 4]), r"token ids in \[0, 4\)"),
    ],
)
def test_bad_input(logits, targets, match):
    for f in (loss_score, min_k_score, min_k_plus_plus_score, exact_memorisation, extraction_strength):
        with pytest.raises(ValueError, match=match):
            f(logits, targets)


def _auc_pairs(s, t):
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(s, t)) / (len(s) * len(t))


def test_auc():
    assert auc([3, 2, 1], [0, 1]) == pytest.approx(5.5 / 6)  # one tie (1 vs 1) counts 1/2
    assert auc([1, 1], [1, 1, 1]) == 0.5
    assert auc([5, 6], [1, 2]) == 1.0
    assert auc([1, 2], [5, 6]) == 0.0
    s = [0.3, 0.1, 0.1, 0.7, 0.5, 0.5, 0.9]
    t = [0.1, 0.2, 0.5, 0.5, 0.05, 0.8]
    assert auc(s, t) == pytest.approx(_auc_pairs(s, t), abs=1e-12)
    assert auc(s, t) + auc(t, s) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs members and non-members"):
        auc([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        auc([float("nan")], [1.0])


def test_privleak():
    # MUSE / open-unlearning: ((1 - a) - (1 - r)) / (1 - r) * 100 with a, r member-oriented AUCs
    def muse(a, r):
        return ((1 - a) - (1 - r)) / (1 - r) * 100

    for a, r in ((0.9, 0.5), (0.5, 0.5), (0.3, 0.6), (1.0, 0.45)):
        assert privleak(a, r) == pytest.approx(muse(a, r))
    assert privleak(0.9, 0.5) == pytest.approx(-80.0)  # under-unlearning: negative
    assert privleak(0.3, 0.6) == pytest.approx(75.0)  # over-unlearning: positive
    assert privleak(0.5, 0.5) == 0.0
    with pytest.raises(ValueError, match="auc_retain is 1"):
        privleak(0.5, 1.0)
    with pytest.raises(ValueError, match="auc_model must be an AUC"):
        privleak(1.2, 0.5)


def _one_hot_logits(preds, vocab=4):
    out = torch.full((len(preds), vocab), -1.0)
    out[torch.arange(len(preds)), torch.tensor(preds)] = 3.0
    return out


@pytest.mark.parametrize(
    "preds, em, es",
    [
        ([0, 1, 2, 0, 1], 1.0, 1.0),  # all reproduced
        ([0, 2, 2, 0, 1], 0.8, 1 - 2 / 5),  # wrong at 1: the rest reproduced from prefix length 2
        ([3, 1, 2, 0, 1], 0.8, 1 - 1 / 5),
        ([0, 1, 2, 0, 3], 0.8, 0.0),  # last token wrong: not even the empty-prefix suffix
        ([1, 0, 0, 1, 0], 0.0, 0.0),
        ([1, 1, 0, 0, 1], 0.6, 1 - 3 / 5),  # matches at 1, 3, 4: the suffix from 3
    ],
)
def test_memorisation(preds, em, es):
    targets = torch.tensor([0, 1, 2, 0, 1])
    assert exact_memorisation(_one_hot_logits(preds), targets) == pytest.approx(em)
    assert extraction_strength(_one_hot_logits(preds), targets) == pytest.approx(es)


class _Bigram(torch.nn.Module):
    """A real bigram LM: the logits of the next token are the row of the current token in ``table``."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])


def test_gradnorm():
    table = [[0.5, -1.0, 2.0], [1.0, 0.0, -0.5], [0.2, 0.3, -1.2]]
    ids = [2, 0, 1, 2]
    labels = [-100, -100, 1, 2]  # scored: token 1 after 0, token 2 after 1
    batch = {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])}
    # d(mean NLL)/d table[prev] = (softmax(table[prev]) - onehot(next)) / 2 per scored pair
    grad = [[0.0] * 3 for _ in range(3)]
    for prev, nxt in ((0, 1), (1, 2)):
        p = [math.exp(x) for x in _log_softmax(table[prev])]
        for v in range(3):
            grad[prev][v] += (p[v] - (v == nxt)) / 2
    model = _Bigram(table)
    assert gradnorm_score(model, batch) == pytest.approx(-math.sqrt(sum(g * g for r in grad for g in r)), abs=1e-6)
    assert gradnorm_score(model, batch, p=1) == pytest.approx(-sum(abs(g) for r in grad for g in r), abs=1e-6)
    assert model.table.grad is None
    with pytest.raises(ValueError, match="p must be 1, 2 or inf"):
        gradnorm_score(model, batch, p=3)
