"""qrerase.baselines.text: each loss against a hand computation; training on real TOFU QA; determinism; LoRA; errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support.tiny_text import DATA, TINY, TPL

from qrerase.baselines.text import (
    TEXT_BASELINES,
    TextBaselineConfig,
    dpo_loss,
    flat_loss,
    ga_loss,
    graddiff_loss,
    kl_divergence,
    kl_loss,
    npo_loss,
    read_refusals,
    train_baseline,
)
from qrerase.io import read_jsonl
from qrerase.text.lm import collate, encode_qa_many, sequence_nll
from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import TrainConfig, train_causal_lm

# ------------------------------------------------------------------------------------------------
# Losses against direct hand computations
# ------------------------------------------------------------------------------------------------


def test_ga_and_graddiff_are_token_means():
    nll = torch.tensor([6.0, 2.0, 4.0])
    n = torch.tensor([3.0, 1.0, 4.0])
    assert ga_loss(nll, n).item() == pytest.approx(-(6 + 2 + 4) / 8)
    r_nll, r_n = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0])
    assert graddiff_loss(nll, n, r_nll, r_n, 0.5).item() == pytest.approx(-12 / 8 + 0.5 * 4 / 4)


def test_npo_equals_its_formula_and_tends_to_gradient_ascent():
    nll = torch.tensor([2.0, 5.0, 0.5], requires_grad=True)
    ref = torch.tensor([2.5, 4.0, 0.5])
    beta = 0.3
    # (2/β) mean log(1 + (π/π_ref)^β) with π = exp(−nll)
    ratio = torch.exp(-nll.detach()) / torch.exp(-ref)
    expected = (2 / beta) * torch.log1p(ratio**beta).mean()
    assert npo_loss(nll, ref, beta).item() == pytest.approx(expected.item(), rel=1e-6)
    assert npo_loss(ref.clone(), ref, beta).item() == pytest.approx(2 * math.log(2) / beta, rel=1e-6)
    # β → 0: the gradient tends to that of −mean(nll) (gradient ascent on sequence NLL)
    npo_loss(nll, ref, 1e-6).backward()
    torch.testing.assert_close(nll.grad, torch.full((3,), -1 / 3), rtol=1e-4, atol=1e-6)
    # larger β: a sequence already far from π_ref (more forgotten) gets a smaller weight
    nll.grad = None
    npo_loss(nll, ref, 2.0).backward()
    assert abs(nll.grad[1]) < abs(nll.grad[2]) < abs(nll.grad[0])


def test_dpo_loss_with_beta():
    chosen, rejected = torch.tensor([3.0, 1.0]), torch.tensor([2.0, 6.0])
    ref_chosen, ref_rejected = torch.tensor([4.0, 1.5]), torch.tensor([2.5, 3.0])
    beta = 0.1
    margins = [((4.0 - 3.0) - (2.5 - 2.0)), ((1.5 - 1.0) - (3.0 - 6.0))]
    expected = sum(-math.log(1 / (1 + math.exp(-beta * m))) for m in margins) / 2
    assert dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta).item() == pytest.approx(expected, rel=1e-6)
    assert dpo_loss(ref_chosen, ref_rejected, ref_chosen, ref_rejected, beta).item() == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(chosen, rejected, ref_chosen, ref_rejected, 0.0)
    with pytest.raises(ValueError, match="beta"):
        npo_loss(chosen, ref_chosen, -1.0)


def test_kl_zero_for_equal_models_and_matches_definition():
    gen = torch.Generator().manual_seed(0)
    ref, cur = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)
    assert kl_divergence(ref, ref.clone()).item() == pytest.approx(0.0, abs=1e-7)
    p, q = ref.softmax(-1).double(), cur.softmax(-1).double()
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    assert kl_divergence(ref, cur).item() == pytest.approx(expected.item(), rel=1e-5)
    assert kl_divergence(ref, cur).item() > 0
    nll, n = torch.tensor([4.0]), torch.tensor([2.0])
    assert kl_loss(nll, n, ref, cur, 2.0).item() == pytest.approx(-2.0 + 2 * expected.item(), rel=1e-5)
    with pytest.raises(ValueError, match="shapes differ"):
        kl_divergence(ref, cur[:4])


@pytest.mark.parametrize(
    "divergence, g, fg",
    [
        ("tv", lambda v: math.tanh(v) / 2, lambda v: math.tanh(v) / 2),
        ("kl", lambda v: v, lambda v: math.exp(v - 1)),
        ("pearson", lambda v: v, lambda v: v * v / 4 + v),
        ("js", lambda v: math.log(2) - math.log1p(math.exp(-v)), lambda v: -math.log(2 - 2 / (1 + math.exp(-v)))),
    ],
)
def test_flat_loss_matches_the_variational_pair(divergence, g, fg):
    pe, pf = torch.tensor([0.2, 0.4]), torch.tensor([0.9, 0.7])
    expected = -g(0.3) + fg(0.8)
    assert flat_loss(pe, pf, divergence).item() == pytest.approx(expected, rel=1e-5)
    # minimising it raises the template probability and lowers the forget probability
    pe.requires_grad_(True)
    pf.requires_grad_(True)
    flat_loss(pe, pf, divergence).backward()
    assert (pe.grad < 0).all() and (pf.grad > 0).all()


def test_config_strict_and_validated():
    cfg = TextBaselineConfig.from_dict({"method": "npo", "epochs": 2, "lr": 1e-3, "batch_size": 4, "beta": 0.5})
    assert cfg.train_config().epochs == 2 and cfg.train_config().lr == 1e-3 and cfg.hparams.beta == 0.5
    with pytest.raises(ValueError, match="unknown key"):
        TextBaselineConfig.from_dict({"method": "ga", "learning_rate": 1})
    with pytest.raises(ValueError, match="unknown method 'sgd'"):
        TextBaselineConfig.of(method="sgd")
    for method, bad in (  # each key with a method that has it (a hyperparameter is its method's own)
        ("npo", {"beta": 0.0}),
        ("npo", {"beta": -1}),
        ("npo", {"lr": 0}),
        ("npo", {"epochs": 0}),
        ("npo", {"mode": "qlora"}),
        ("flat", {"divergence": "hellinger"}),
        ("graddiff", {"retain_weight": -1}),
    ):
        with pytest.raises(ValueError, match=f"'{next(iter(bad))}' must be"):
            TextBaselineConfig.of(method=method, **bad)
    with pytest.raises(ValueError, match=r"baseline config \(npo\): unknown key\(s\) \['divergence'\]"):
        TextBaselineConfig.of(method="npo", divergence="tv")


def test_read_refusals(tmp_path):
    lines = read_refusals(DATA / "idontknow.txt")
    assert len(lines) >= 90 and all(lines)
    (tmp_path / "empty.txt").write_text("\n  \n")
    with pytest.raises(ValueError, match="no refusal answers"):
        read_refusals(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="not found"):
        read_refusals(tmp_path / "missing.txt")


# ------------------------------------------------------------------------------------------------
# Training on real TOFU QA with a small model fine-tuned here
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sets():
    rows = read_jsonl(DATA / "forget10.jsonl")[360:400]  # two authors
    qa = [{"question": r["prompt"], "answer": r["response"]} for r in rows]
    return qa[20:], qa[:20]  # forget = the last author, retain = the other


@pytest.fixture(scope="module")
def tok(tmp_path_factory, sets):
    forget, retain = sets
    texts = [f"{r['question']} {r['answer']}" for r in forget + retain] + read_refusals(DATA / "idontknow.txt")
    return train_bpe_tokenizer(texts, 500, tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="module")
def finetuned(tok, sets):
    forget, retain = sets
    model = build_tiny_llama(TINY, tok, seed=0)
    train_causal_lm(model, tok, forget + retain, TPL, TrainConfig(epochs=6, lr=3e-3, batch_size=8, seed=0, threads=1))
    return model


def _nll(model, tok, records):
    ex = encode_qa_many(tok, TPL, [(r["question"], r["answer"]) for r in records], 128)
    with torch.no_grad():
        s, n = sequence_nll(model, collate(ex, tok.pad_token_id))
    return float(s.sum() / n.sum())


def _run(finetuned, tok, sets, **kw):
    forget, retain = sets
    cfg = TextBaselineConfig.of(**{"epochs": 2, "lr": 2e-3, "batch_size": 8, "seed": 3, "threads": 1, **kw})
    model = copy.deepcopy(finetuned)
    ref = copy.deepcopy(finetuned)
    return train_baseline(model, ref, tok, forget, retain, TPL, cfg, refusals=read_refusals(DATA / "idontknow.txt"))


#: Trained on their own fixtures in tests/integration/test_new_baselines.py: SimNPO needs a model that memorised its
#: answers (here the forget NLL is ~4.8 nats / token: sigma(-beta x 4.8) ~ 0 at the reference beta 4.5),
#: RMU a layer of this 2-layer model (its reference layer is 7).
OWN_FIXTURE = ("simnpo", "rmu")


@pytest.mark.parametrize("method", [m for m in TEXT_BASELINES if m not in OWN_FIXTURE])
def test_every_method_trains_and_raises_forget_nll(finetuned, tok, sets, method):
    forget, _ = sets
    before = _nll(finetuned, tok, forget)
    model, curve = _run(finetuned, tok, sets, method=method)
    assert len(curve) == 2 * 3 and [r["step"] for r in curve] == list(range(1, 7))
    assert {"step", "epoch", "loss", "lr", "forget_nll"} <= set(curve[0])
    extra = {"graddiff": "retain_nll", "kl": "retain_kl", "dpo": "refusal_nll", "flat": "forget_prob"}
    if method in extra:
        assert extra[method] in curve[0]
    assert all(math.isfinite(r["loss"]) for r in curve)
    assert not model.training
    assert _nll(model, tok, forget) > before + 0.05  # the forget answers got less likely
    if method == "npo":
        assert curve[0]["loss"] == pytest.approx(2 * math.log(2) / 0.1, rel=1e-3)  # starts at π_θ = π_ref
    if method == "dpo":
        assert curve[0]["loss"] == pytest.approx(math.log(2), rel=1e-3)
    if method == "kl":
        assert curve[0]["retain_kl"] == pytest.approx(0.0, abs=1e-5)


def test_deterministic_under_the_seed(finetuned, tok, sets):
    m1, c1 = _run(finetuned, tok, sets, method="kl")
    m2, c2 = _run(finetuned, tok, sets, method="kl")
    assert c1 == c2
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    m3, _ = _run(finetuned, tok, sets, method="kl", seed=4)
    assert not torch.equal(m3.lm_head.weight, m1.lm_head.weight)


def test_lora_mode_gives_a_plain_checkpoint(finetuned, tok, sets, tmp_path):
    from transformers import AutoModelForCausalLM

    from qrerase.models.checkpoints import save_model

    model, curve = _run(finetuned, tok, sets, method="graddiff", mode="lora", lora_r=4, lora_alpha=8, lr=1e-2)
    assert type(model) is type(finetuned)
    names = set(model.state_dict())
    assert names == set(finetuned.state_dict()) and not any("lora" in k for k in names)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, finetuned.state_dict()[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)  # only the adapted linear layers moved
    save_model(model, tok, tmp_path / "m")
    assert not (tmp_path / "m" / "adapter_config.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    ids = torch.tensor([[tok.bos_token_id, 10, 20, 30]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_bad_input_is_a_clear_error(finetuned, tok, sets):
    forget, retain = sets
    cfg = TextBaselineConfig.of(method="npo", epochs=1, lr=1e-3, batch_size=8, threads=1)
    with pytest.raises(ValueError, match="forget set is empty"):
        train_baseline(finetuned, finetuned, tok, [], retain, TPL, cfg)
    with pytest.raises(ValueError, match="needs the reference"):
        train_baseline(finetuned, None, tok, forget, retain, TPL, cfg)
    with pytest.raises(ValueError, match="needs a non-empty retain set"):
        train_baseline(finetuned, finetuned, tok, forget, [], TPL, TextBaselineConfig.of(method="graddiff", threads=1))
    with pytest.raises(ValueError, match="needs refusal answers"):
        train_baseline(finetuned, finetuned, tok, forget, retain, TPL, TextBaselineConfig.of(method="dpo", threads=1))


def test_workflow_schema_lists_exactly_these_baselines():
    from qrerase.workflow.validation import load_schema  # the schema file with the registry's enums

    schema = load_schema()
    enum = schema["properties"]["methods"]["properties"]["tofu"]["items"]["enum"]
    subspace = {"unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"}
    assert [m for m in enum if m not in subspace] == list(TEXT_BASELINES)
    assert set(schema["properties"]["tofu"]["properties"]["baselines"]["properties"]) >= set(TEXT_BASELINES)
