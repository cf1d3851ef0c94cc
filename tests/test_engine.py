"""qrerase.engine + train_steps on HF Accelerate: micro-batches, mixed precision, resumable state.

Real tiny Llama models trained on two real TOFU authors; nothing is mocked.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_text import TINY, TPL, tofu_qa

from qrerase import engine
from qrerase.text.lm import answer_token_nll, collate, encode_qa_many, pad_token_id, qa_pair
from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import TrainConfig, token_mean_split, train_causal_lm


@pytest.fixture(scope="module")
def records():
    return tofu_qa(360, 400)


@pytest.fixture(scope="module")
def tok(tmp_path_factory, records):
    return train_bpe_tokenizer(
        [f"{r['question']} {r['answer']}" for r in records], 500, tmp_path_factory.mktemp("tok") / "tok"
    )


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "batch,micro,world", [(32, None, 1), (32, 8, 1), (32, 8, 2), (30, 4, 2), (7, None, 2), (5, 3, 1)]
)
def test_micro_plan_covers_the_global_batch(batch, micro, world):
    m, acc = engine.micro_plan(batch, micro, world)
    assert m * acc * world >= batch and (m * acc * world == batch or batch % (world * m))
    pieces = engine.chunk(list(range(batch)), world * acc)
    assert len(pieces) == world * acc and all(len(p) <= m for p, live in pieces if live)
    assert [i for p, live in pieces if live for i in p] == list(range(batch))  # the full batch, in order, once


def test_micro_plan_examples_and_errors():
    assert engine.micro_plan(32, 4, 2) == (4, 4)  # 4 examples × 4 accumulation × 2 processes = 32
    assert engine.micro_plan(32, None, 1) == (32, 1)
    assert engine.micro_plan(32, None, 2) == (16, 1)
    pieces = engine.chunk([5, 6], 4)
    assert [live for _, live in pieces].count(False) == 2 and all(len(p) == 1 for p, _ in pieces)
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainConfig(epochs=1, lr=1e-3, batch_size=4, micro_batch_size=0)
    with pytest.raises(ValueError, match="backend"):
        TrainConfig(epochs=1, lr=1e-3, batch_size=4, backend="horovod")


def test_micro_batch_gradient_equals_full_batch_gradient(tok, records):
    """Σ over micro-batches of the token-mean split's losses has the full batch's loss and gradient."""
    model = build_tiny_llama(TINY, tok, seed=3)
    pad = pad_token_id(tok)
    examples = encode_qa_many(tok, TPL, [qa_pair(r) for r in records], 128)
    idx = list(range(12))
    nll, _ = answer_token_nll(model, collate([examples[i] for i in idx], pad))
    full = nll.mean()
    full.backward()
    g_full = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    total = 0.0
    for thunk in token_mean_split(model, examples, pad)(idx, 5):  # uneven pieces of 3,3,2,2,2 examples
        loss, _ = thunk()
        loss.backward()
        total += float(loss)
    assert total == pytest.approx(float(full), rel=1e-6)
    for g, p in zip(g_full, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-7)


def test_training_with_micro_batches_matches_full_batches(tok, records):
    cfg = TrainConfig(epochs=2, lr=3e-3, batch_size=8, seed=4, threads=1)
    start = build_tiny_llama(TINY, tok, seed=4)
    w0 = _weights(start)
    runs = {}
    for micro in (None, 3):
        model = build_tiny_llama(TINY, tok, seed=4)
        frame = train_causal_lm(model, tok, records, TPL, dataclasses.replace(cfg, micro_batch_size=micro), desc="t")
        runs[micro] = (_weights(model), frame)
    (wa, fa), (wb, fb) = runs[None], runs[3]
    assert fa["loss"].to_numpy() == pytest.approx(fb["loss"].to_numpy(), rel=1e-4)
    num = sum(float((wa[k] - wb[k]).norm() ** 2) for k in wa) ** 0.5
    den = sum(float((wa[k] - w0[k]).norm() ** 2) for k in wa) ** 0.5
    assert den > 0 and num / den < 1e-3


def test_bf16_finetune_moves_weights_as_far_as_float32(tok, records):
    """fp32 master weights: a bf16 model at lr 1e-5 is updated as far as a float32 one (not rounded away)."""
    cfg = TrainConfig(epochs=2, lr=1e-5, batch_size=8, seed=5, threads=1)
    norms = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = build_tiny_llama(TINY, tok, seed=5).to(dtype)
        w0 = {k: v.float() for k, v in _weights(model).items()}
        train_causal_lm(model, tok, records, TPL, cfg, desc="t")
        assert next(model.parameters()).dtype == dtype  # saved back in the configured dtype
        w1 = {k: v.float() for k, v in _weights(model).items()}
        # the update of the master weights, as the saved bf16 weights are rounded: compare in float32
        norms[dtype] = sum(float((w1[k] - w0[k]).norm() ** 2) for k in w0) ** 0.5
    ratio = norms[torch.bfloat16] / norms[torch.float32]
    assert 0.7 <= ratio <= 1.3, ratio


class _Abort(Exception):
    pass


def test_resumed_training_is_bit_identical(tok, records, tmp_path):
    cfg = TrainConfig(
        epochs=3, lr=3e-3, batch_size=8, warmup_ratio=0.2, weight_decay=0.01, seed=6, threads=1, checkpoint_every=4
    )
    ref = build_tiny_llama(TINY, tok, seed=6)
    ref_frame = train_causal_lm(ref, tok, records, TPL, cfg, desc="run")
    resume = tmp_path / "resume"

    def abort(step):
        if step == 10:
            raise _Abort

    from qrerase.text import training

    model = build_tiny_llama(TINY, tok, seed=6)
    original = training.train_steps
    with engine.resuming(resume):
        training.train_steps = lambda *a, **k: original(*a, **{**k, "stop": abort})
        try:
            with pytest.raises(_Abort):
                train_causal_lm(model, tok, records, TPL, cfg, desc="run")
        finally:
            training.train_steps = original
        assert [p.name for p in (resume / "run").iterdir()] == ["step-8"]
        model = build_tiny_llama(TINY, tok, seed=6)  # a fresh process would rebuild the start
        frame = train_causal_lm(model, tok, records, TPL, cfg, desc="run")
    assert not (resume / "run").exists()  # removed once training finished
    assert frame.equals(ref_frame)
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def _count_mlp_calls(model, calls, key):
    mlp = model.model.layers[0].mlp
    forward = mlp.forward

    def counted(*args, **kwargs):
        calls[key] += 1
        return forward(*args, **kwargs)

    mlp.forward = counted


def test_gradient_checkpointing_gives_the_same_training(tok, records):
    cfg = TrainConfig(epochs=1, lr=3e-3, batch_size=8, seed=7, threads=1)
    calls = {"a": 0, "b": 0}
    a = build_tiny_llama(TINY, tok, seed=7)
    _count_mlp_calls(a, calls, "a")
    fa = train_causal_lm(a, tok, records, TPL, cfg, desc="t")
    b = build_tiny_llama(TINY, tok, seed=7)
    _count_mlp_calls(b, calls, "b")
    fb = train_causal_lm(b, tok, records, TPL, dataclasses.replace(cfg, gradient_checkpointing=True), desc="t")
    assert calls == {"a": len(fa), "b": 2 * len(fb)}  # the layer's MLP is recomputed in the backward pass
    assert not getattr(b, "is_activation_checkpointing", b.is_gradient_checkpointing)
    assert fa["loss"].to_numpy() == pytest.approx(fb["loss"].to_numpy(), rel=1e-5)
    for k, v in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[k], v, rtol=1e-4, atol=1e-6)
