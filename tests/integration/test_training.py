"""qrerase.text.training: full fine-tuning and LoRA on two real TOFU authors; determinism; adapter I/O."""

from __future__ import annotations

import pytest
import torch
from support.tiny_text import TINY, TPL, tofu_qa

from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import LoraTrainConfig, TrainConfig, save_adapter, train_causal_lm, train_lora


@pytest.fixture(scope="module")
def records():
    return tofu_qa(360, 400)  # two authors, TOFU's prompt/response keys


@pytest.fixture(scope="module")
def tok(tmp_path_factory, records):
    return train_bpe_tokenizer(
        [f"{r['question']} {r['answer']}" for r in records], 500, tmp_path_factory.mktemp("tok") / "tok"
    )


def _train(tok, records, cfg):
    model = build_tiny_llama(TINY, tok, seed=cfg.seed)
    frame = train_causal_lm(model, tok, records, TPL, cfg, desc="test")
    return model, frame


def test_configs_from_dict():
    cfg = TrainConfig.from_dict({"epochs": 2, "lr": 1e-3, "batch_size": 4, "seed": 5})
    assert (cfg.epochs, cfg.batch_size, cfg.seed, cfg.threads) == (2, 4, 5, 2)
    lcfg = LoraTrainConfig.from_dict(
        {"r": 4, "target_modules": ["q_proj"], "train": {"epochs": 1, "lr": 1e-3, "batch_size": 8}}
    )
    assert isinstance(lcfg.train, TrainConfig) and lcfg.target_modules == ("q_proj",) and lcfg.r == 4
    with pytest.raises(ValueError, match="unknown key"):
        TrainConfig.from_dict({"epochs": 1, "lr": 1e-3, "batch_size": 4, "lr_max": 1})


def test_training_reduces_loss_and_is_bit_deterministic(tok, records):
    cfg = TrainConfig(epochs=6, lr=3e-3, batch_size=8, warmup_ratio=0.1, weight_decay=0.01, seed=11, threads=1)
    m1, f1 = _train(tok, records, cfg)
    m2, f2 = _train(tok, records, cfg)
    assert list(f1.columns) == ["step", "epoch", "loss", "lr"]
    assert len(f1) == 6 * 5 and f1["step"].tolist() == list(range(1, 31)) and f1["epoch"].max() == 6
    per_epoch = f1.groupby("epoch")["loss"].mean()
    assert per_epoch.iloc[-1] < per_epoch.iloc[0] - 1.0
    # linear warmup then linear decay
    lr = f1["lr"].to_numpy()
    assert lr[:3].tolist() == sorted(lr[:3]) and lr.max() <= cfg.lr + 1e-12 and lr[-1] < 0.1 * cfg.lr
    assert not m1.training
    assert f1.equals(f2)
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    m3, _ = _train(tok, records, TrainConfig(epochs=1, lr=3e-3, batch_size=8, seed=12, threads=1))
    assert not torch.equal(m3.model.embed_tokens.weight, m1.model.embed_tokens.weight)


def test_lora_trains_saves_and_reloads(tok, records, tmp_path):
    from peft import PeftModel

    base_seed = 2
    model = build_tiny_llama(TINY, tok, seed=base_seed)
    base_before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = LoraTrainConfig(r=4, alpha=8, train=TrainConfig(epochs=3, lr=5e-3, batch_size=8, seed=1, threads=1))
    peft_model, frame = train_lora(model, tok, records[:20], TPL, cfg, desc="lora-test")
    assert len(frame) == 3 * 3 and frame["loss"].iloc[-1] < frame["loss"].iloc[0]
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any(float(p.detach().abs().max()) > 0 for n, p in peft_model.named_parameters() if "lora_B" in n)
    base_after = {
        k.replace("base_model.model.", "").replace("base_layer.", ""): v
        for k, v in peft_model.state_dict().items()
        if "lora_" not in k
    }
    assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)  # base frozen

    save_adapter(peft_model, tmp_path / "adapter")
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    reloaded = PeftModel.from_pretrained(build_tiny_llama(TINY, tok, seed=base_seed), tmp_path / "adapter").eval()
    ids = torch.tensor([[tok.bos_token_id] + tok(records[0]["question"], add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, peft_model(input_ids=ids).logits)


def test_memorisation_probe_scores_each_probed_epoch_without_changing_training(tok, records):
    """The probe's greedy scoring after epochs 2 and 4 leaves the run as a plain 4-epoch fine-tune
    (same loss curve, same weights); its ROUGE-L is the training answers' recall of the greedy output."""
    from qrerase.text.evaluation import EvalConfig, greedy_generate, rouge_recalls
    from qrerase.text.probe import PROBE_COLUMNS, memorisation_probe

    cfg = TrainConfig(epochs=1, lr=3e-3, batch_size=8, warmup_ratio=0.1, seed=11, threads=1)
    ecfg = EvalConfig(batch_size=8, max_new_tokens=24)
    probe = records[:6]
    model = build_tiny_llama(TINY, tok, seed=cfg.seed)
    table = memorisation_probe(model, tok, records, TPL, cfg, probe, [4, 2], ecfg)
    plain, curve = _train(tok, records, TrainConfig(**{**cfg.__dict__, "epochs": 4}))
    assert list(table.columns) == PROBE_COLUMNS and table["epoch"].tolist() == [2, 4]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))
    assert table["train_loss"].tolist() == pytest.approx(curve.groupby("epoch")["loss"].mean()[[2, 4]].tolist())
    _, rl = rouge_recalls(
        greedy_generate(plain, tok, TPL, [r["question"] for r in probe], ecfg), [r["answer"] for r in probe]
    )
    assert table["rouge_l"].iloc[-1] == pytest.approx(sum(rl) / len(rl))
    assert table["questions"].tolist() == [6, 6] and ((table["rouge_l"] >= 0) & (table["rouge_l"] <= 1)).all()
    with pytest.raises(ValueError, match="probe.epochs"):
        memorisation_probe(model, tok, records, TPL, cfg, probe, [2, 2], ecfg)


def test_pick_epochs_is_the_smallest_epoch_meeting_the_threshold():
    import pandas as pd

    from qrerase.text.probe import pick_epochs

    table = pd.DataFrame({"epoch": [5, 10, 15, 20], "rouge_l": [0.5, 0.92, 0.89, 0.95]})
    assert [pick_epochs(table, t) for t in (0.5, 0.9, 0.93, 0.96)] == [5, 10, 20, None]
    with pytest.raises(ValueError, match="probe.min_rouge_l"):
        pick_epochs(table, 0.0)
