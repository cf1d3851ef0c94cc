"""SimNPO, RMU and UNDIAL (qrerase.baselines.simnpo / rmu / undial): each loss against its paper's formula
computed here in plain Python, their registration and hyperparameters, RMU's control vector and
parameter subset, the micro-batch split, and a short real training run of each on a tiny Llama
fine-tuned on TOFU QA (no mocks)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support.tiny_text import TINY, TPL, tofu_qa

from qrerase import registry
from qrerase.baselines.rmu import RMU, RmuHparams, activation_mse, control_vector, layer_output
from qrerase.baselines.simnpo import SimNPO, SimNpoHparams, simnpo_loss
from qrerase.baselines.text import AdapterDisabled, TextBaselineConfig, objective_of, train_baseline
from qrerase.baselines.undial import UNDIAL, UndialHparams, undial_teacher, undial_token_loss
from qrerase.text.lm import answer_token_logits, collate, encode_qa_many, pad_token_id, qa_pair, sequence_nll
from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import LoraTrainConfig, TrainConfig, add_lora, train_causal_lm

NEW = {"simnpo": (SimNPO, SimNpoHparams), "rmu": (RMU, RmuHparams), "undial": (UNDIAL, UndialHparams)}

# ------------------------------------------------------------------------------------------------
# Losses against the papers' formulas, by hand
# ------------------------------------------------------------------------------------------------


def _log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z))


def test_simnpo_loss_is_the_papers_formula():
    nll, n = [6.0, 2.0, 9.0], [3, 1, 4]
    beta, gamma = 2.5, 0.4
    # −(2/β) mean_i log σ(−(β/|y_i|) log π(y_i|x_i) − γ), log π = −nll
    expected = -(2 / beta) * sum(_log_sigmoid(-(beta / k) * (-s) - gamma) for s, k in zip(nll, n)) / 3
    got = simnpo_loss(torch.tensor(nll), torch.tensor(n), beta, gamma)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # at per-token NLL γ/β the argument is 0: 2 log 2 / β; the loss falls as the NLL rises
    at_margin = simnpo_loss(torch.tensor([gamma / beta * 5]), torch.tensor([5]), beta, gamma)
    assert at_margin.item() == pytest.approx(2 * math.log(2) / beta, rel=1e-6)
    x = torch.tensor(nll, requires_grad=True)
    simnpo_loss(x, torch.tensor(n), beta, gamma).backward()
    assert (x.grad < 0).all()
    with pytest.raises(ValueError, match="'beta'"):
        simnpo_loss(x, torch.tensor(n), 0.0)
    with pytest.raises(ValueError, match="forget_n"):
        simnpo_loss(x, torch.tensor([3, 0, 4]), beta)


def test_undial_teacher_and_loss_are_the_formula():
    gen = torch.Generator().manual_seed(0)
    ref, cur = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    targets, beta = torch.tensor([4, 0, 2]), 3.0
    q = undial_teacher(ref, targets, beta)
    for t in range(3):  # softmax(z_ref − β onehot(y)), one row at a time
        z = [float(v) - (beta if v_id == int(targets[t]) else 0.0) for v_id, v in enumerate(ref[t])]
        total = sum(math.exp(v) for v in z)
        assert q[t].tolist() == pytest.approx([math.exp(v) / total for v in z], rel=1e-5)
        logp = [float(v) - math.log(sum(math.exp(float(w)) for w in cur[t])) for v in cur[t]]
        ce = -sum(qv * lv for qv, lv in zip(q[t].tolist(), logp))
        assert undial_token_loss(cur, ref, targets, beta)[t].item() == pytest.approx(ce, rel=1e-5)
    torch.testing.assert_close(undial_teacher(ref, targets, 0.0), ref.softmax(-1))  # β = 0: π_ref itself
    with pytest.raises(ValueError, match="token ids"):
        undial_teacher(ref, torch.tensor([4, 0, 5]), beta)
    with pytest.raises(ValueError, match="shapes differ"):
        undial_token_loss(cur[:2], ref, targets, beta)


def test_rmu_control_vector_and_activation_mse():
    u = control_vector(48, 7)
    assert u.shape == (48,) and u.dtype == torch.float32
    assert u.norm().item() == pytest.approx(1.0, abs=1e-6) and bool((u >= 0).all())
    assert torch.equal(u, control_vector(48, 7)) and not torch.equal(u, control_vector(48, 8))
    gen = torch.Generator().manual_seed(1)
    h, ref = torch.randn(2, 4, 3, generator=gen), torch.randn(2, 4, 3, generator=gen)
    mask = torch.tensor([[False, True, True, False], [True, True, True, True]])
    for i in range(2):  # (1/|T_i|) Σ_{t∈T_i} (1/d) ‖h_it − ref_it‖²
        pos = [t for t in range(4) if mask[i, t]]
        expected = sum(sum((float(h[i, t, k]) - float(ref[i, t, k])) ** 2 for k in range(3)) / 3 for t in pos) / len(
            pos
        )
        assert activation_mse(h, ref, mask)[i].item() == pytest.approx(expected, rel=1e-5)
    c = 2.0 * u[:3]
    expected = sum((float(h[1, t, k]) - float(c[k])) ** 2 for t in range(4) for k in range(3)) / 12
    assert activation_mse(h, c, mask)[1].item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="at least one"):
        activation_mse(h, ref, torch.zeros(2, 4, dtype=torch.bool))


def test_registered_with_their_hparams_and_reference_defaults():
    for name, (objective, hp_cls) in NEW.items():
        m = registry.method(name)
        assert m.tracks == ("tofu", "crosslingual") and m.decomp is None
        assert objective_of(name) is objective and registry.hparams_of(name, "text") is hp_cls
    assert [registry.method(n).plan_shape for n in NEW] == [(2, 0), (2, 1), (2, 1)]
    assert (SimNpoHparams().beta, SimNpoHparams().forget_weight, SimNpoHparams().retain_weight) == (4.5, 0.125, 1.0)
    assert (UndialHparams().beta, UndialHparams().retain_weight) == (10.0, 0.0)
    rmu = RmuHparams()
    assert (rmu.layer, rmu.layers_updated(), rmu.steering_coeff, rmu.alpha) == (7, (5, 6, 7), 20.0, 100.0)
    assert rmu.trains("model.layers.6.mlp.down_proj.weight")
    assert rmu.trains("base_model.model.model.layers.5.mlp.down_proj.lora_B.default.weight")
    assert not rmu.trains("model.layers.4.mlp.down_proj.weight") and not rmu.trains("model.layers.7.mlp.up_proj.weight")
    assert RmuHparams(layer=1, update_modules=["*"]).trains("model.layers.0.self_attn.q_proj.weight")
    assert RmuHparams(layer=1, update_layers=[1, 0]).update_layers == (1, 0)  # a list becomes a tuple
    for cls, key, bad in (
        (SimNpoHparams, "beta", 0.0),
        (SimNpoHparams, "gamma", -1.0),
        (SimNpoHparams, "retain_weight", float("nan")),
        (UndialHparams, "beta", -2),
        (RmuHparams, "layer", -1),
        (RmuHparams, "update_layers", [8]),
        (RmuHparams, "update_layers", [-1]),
        (RmuHparams, "update_modules", []),
        (RmuHparams, "steering_coeff", 0),
        (RmuHparams, "control_seed", 1.5),
    ):
        with pytest.raises(ValueError, match=f"'{key}' must be"):
            cls(**{key: bad})
    # a job config: the shared training keys plus the method's own, strictly
    job = TextBaselineConfig.of(method="undial", epochs=1, lr=1e-3, batch_size=4, beta=3.0)
    assert job.hparams == UndialHparams(beta=3.0, retain_weight=0.0) and job.lr == 1e-3
    with pytest.raises(ValueError, match=r"baseline config \(simnpo\): unknown key\(s\) \['delta'\]"):
        TextBaselineConfig.of(method="simnpo", epochs=1, lr=1e-3, batch_size=4, delta=0.0)
    with pytest.raises(ValueError, match="'update_layers' must be"):
        TextBaselineConfig.of(method="rmu", epochs=1, lr=1e-3, batch_size=4, layer=1, update_layers=[2])


# ------------------------------------------------------------------------------------------------
# On a tiny Llama fine-tuned on TOFU QA
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sets():
    qa = tofu_qa(360, 376)
    return qa[8:], qa[:8]  # forget, retain


@pytest.fixture(scope="module")
def tok(tmp_path_factory, sets):
    texts = [f"{r['question']} {r['answer']}" for r in sets[0] + sets[1]]
    return train_bpe_tokenizer(texts, 300, tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="module")
def finetuned(tok, sets):
    """Memorises the 16 answers (forget NLL ~0.2 nats / token), as a TOFU fine-tuned model: SimNPO's
    weight σ(−β ℓ̄) vanishes on answers the model never learnt (ℓ̄ ≫ 1/β)."""
    model = build_tiny_llama(TINY, tok, seed=0)
    cfg = TrainConfig(epochs=40, lr=1e-2, batch_size=16, max_length=64, seed=0, threads=1)
    train_causal_lm(model, tok, sets[0] + sets[1], TPL, cfg)
    return model


def _examples(tok, records):
    return encode_qa_many(tok, TPL, [qa_pair(r) for r in records], 64)


def _cfg(method, hp, **kw):
    """The job config of a new baseline with its hyperparameters ``hp``."""
    train = {"epochs": 2, "lr": 1e-5, "batch_size": 4, "max_length": 64, "threads": 1, **kw}
    return TextBaselineConfig(method=method, train=train, hparams=hp)


def _objective(name, model, ref, tok, sets, hp):
    forget, retain = sets
    cls = NEW[name][0]
    return cls(
        _cfg(name, hp), model, ref, pad_token_id(tok), _examples(tok, forget), _examples(tok, retain), [], None, None
    )


@pytest.mark.parametrize(
    "name, hp",
    [
        ("simnpo", SimNpoHparams(beta=2.0, gamma=0.3)),
        ("undial", UndialHparams(beta=5.0, retain_weight=0.5)),
        ("rmu", RmuHparams(layer=1, steering_coeff=4.0, alpha=2.0)),
    ],
)
def test_micro_batch_pieces_sum_to_the_step_loss(finetuned, tok, sets, name, hp):
    model, ref = copy.deepcopy(finetuned), copy.deepcopy(finetuned).eval()
    obj = _objective(name, model, ref, tok, sets, hp)
    if name == "rmu":  # start away from π_ref, so that the retain term is not 0
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    payload = ([0, 2, 5, 6, 7], [1, 3, 4])
    full, terms = obj.full(payload)
    assert all(math.isfinite(v) and v > 0 for v in terms.values())
    for parts in (2, 4):  # 4 parts: the retain batch has a padding piece
        pieces = sum(float(thunk()[0]) for thunk in obj.split(payload, parts))
        assert pieces == pytest.approx(float(full), rel=1e-5)


def test_rmu_trains_only_the_chosen_parameters(finetuned, tok, sets):
    model, ref = copy.deepcopy(finetuned), copy.deepcopy(finetuned).eval()
    obj = _objective("rmu", model, ref, tok, sets, RmuHparams(layer=1, steering_coeff=4.0))
    chosen = {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    assert set(obj.trained) == chosen
    assert {n for n, p in model.named_parameters() if p.requires_grad} == chosen
    assert torch.equal(obj.u, control_vector(48, 0))  # the run's seed (0) when control_seed is None
    loss, terms = obj.full(([0, 1, 2], [0, 1]))
    assert terms["retain_mse"] == pytest.approx(0.0, abs=1e-10)  # the model is still π_ref
    loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads == chosen
    # the hooked output of layer 0 is the decoder's hidden state after layer 0
    batch = collate(_examples(tok, sets[0][:2]), pad_token_id(tok))
    with torch.no_grad():
        out = model.model(batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        torch.testing.assert_close(layer_output(model, batch, 0), out.hidden_states[1])
    with pytest.raises(ValueError, match="'layer' 2 is out of range"):
        _objective("rmu", copy.deepcopy(finetuned), ref, tok, sets, RmuHparams(layer=2))
    with pytest.raises(ValueError, match="no trainable parameter"):
        _objective("rmu", copy.deepcopy(finetuned), ref, tok, sets, RmuHparams(layer=1, update_modules=["mlp.w9"]))


def test_rmu_lora_reference_is_the_adapter_disabled_model(finetuned, tok, sets):
    peft = add_lora(copy.deepcopy(finetuned), LoraTrainConfig(r=4, train=TrainConfig(epochs=1, lr=1e-3, batch_size=4)))
    with torch.no_grad():  # a non-zero adapter: the model is no longer its adapter-disabled self
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.fill_(0.05)
    obj = _objective("rmu", peft, AdapterDisabled(peft), tok, sets, RmuHparams(layer=1, steering_coeff=4.0))
    assert obj.trained and all("lora_" in n and "down_proj" in n for n in obj.trained)
    _, terms = obj.full(([0, 1], [0, 1, 2]))
    assert terms["retain_mse"] > 1e-6  # h_θ (adapter on) against h_ref (adapter off)


def _forget_objective(name, model, ref, tok, records, hp) -> tuple[float, float]:
    """(the method's forget term on the whole of ``records``, their token-mean answer NLL)."""
    batch = collate(_examples(tok, records), pad_token_id(tok))
    with torch.no_grad():
        nll, n = sequence_nll(model, batch)
        if name == "simnpo":
            term = simnpo_loss(nll, n, hp.beta, hp.gamma)
        elif name == "undial":
            logits, targets, _ = answer_token_logits(model, batch)
            term = undial_token_loss(logits, answer_token_logits(ref, batch)[0], targets, hp.beta).mean()
        else:
            h = layer_output(model, batch, hp.layer)
            term = activation_mse(h, hp.steering_coeff * control_vector(48, 3), batch["labels"] != -100).mean()
    return float(term), float(nll.sum() / n.sum())


@pytest.mark.parametrize(
    "name, hp, lr",
    [
        ("simnpo", SimNpoHparams(), 3e-3),
        ("undial", UndialHparams(), 3e-3),
        ("rmu", RmuHparams(layer=1, steering_coeff=4.0, alpha=1.0), 1e-2),
    ],
)
def test_training_moves_the_forget_loss_the_intended_way(finetuned, tok, sets, name, hp, lr):
    forget, retain = sets
    model, ref = copy.deepcopy(finetuned), copy.deepcopy(finetuned)
    term, nll = _forget_objective(name, model, finetuned, tok, forget, hp)
    model, curve = train_baseline(model, ref, tok, forget, retain, TPL, _cfg(name, hp, lr=lr, seed=3))
    assert len(curve) == 2 * 2 and all(math.isfinite(r["loss"]) for r in curve) and not model.training
    term_after, nll_after = _forget_objective(name, model, finetuned, tok, forget, hp)
    assert term_after < 0.9 * term  # the forget term fell, on the whole forget set
    assert nll_after > nll + 0.1  # and the forget answers got less likely
    if name == "rmu":  # only the chosen weights moved
        moved = {k for k, v in model.state_dict().items() if not torch.equal(v, finetuned.state_dict()[k])}
        assert moved == {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
