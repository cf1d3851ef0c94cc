"""Speech track, issue 14: held-out slice, digit pretraining task, encoder grafting, trade-off sweeps, λ rule."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from support import REPO
from support.tiny_hubert import TINY_HUBERT

from qrerase.tracks.speech import data as sd
from qrerase.tracks.speech import model as sm
from qrerase.tracks.speech import tradeoff as st
from qrerase.tracks.speech import train as strain

FSDD = REPO / "data" / "fsdd"
SPEAKERS = ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]


@pytest.fixture(scope="module")
def val_data():
    """Real FSDD audio: indices 0-3 of every speaker x digit (240 utterances), 0.3 s, with a held-out slice."""
    cfg = sd.SpeechDataConfig(
        root=str(FSDD),
        max_seconds=0.3,
        max_per_digit=4,
        test_fraction=0.25,
        val_fraction=0.2,
        forget_speakers=("theo",),
        seed=0,
    )
    return sd.make_speech_data(cfg, progress=False)


def _model(labels=SPEAKERS, seed=0):
    return sm.build_tiny_hubert(sm.TinyHubertConfig(**TINY_HUBERT), labels, seed)


# ------------------------------------------------------------------------------------------------ data


def test_validation_slice_is_held_out_of_every_set(val_data):
    _, index, _ = val_data
    split = index["split"].to_numpy()
    per_speaker = index[split != "test"].groupby("speaker").size()
    val_per_speaker = index[split == "val"].groupby("speaker").size()
    assert (val_per_speaker == (0.2 * per_speaker).round().astype(int)).all()  # round(0.2 * 30) = 6 each
    assert (index[split == "test"].groupby(["speaker", "digit"]).size() == 1).all()  # test split unchanged
    is_val, is_theo = split == "val", index["speaker"].to_numpy() == "theo"
    for setting in ("sample", "class"):
        masks = sd.eval_masks(index, setting)
        assert not ((masks["D_t"] | masks["D_r"]) & is_val).any()
        assert not (sd.train_mask(index, setting, "forget") & is_val).any()
        assert not (sd.train_mask(index, setting, "retain") & is_val).any()
    assert not (sd.eval_masks(index, "sample")["D_f"] & is_val).any()
    assert (sd.eval_masks(index, "class")["D_f"] & is_val).sum() == (is_theo & is_val).sum() == 6  # all of theo's
    v = sd.val_mask(index, "class")
    assert v.sum() == 5 * 6 and not index.loc[v, "speaker"].eq("theo").any()  # retained speakers only
    assert sd.val_mask(index, "sample").sum() == 6 * 6
    assert (index.loc[sd.eval_masks(index, "class")["D_f"], "speaker"] == "theo").all()
    assert sd.eval_masks(index, "class")["D_f"].sum() == 40  # train, val and test utterances of theo


def test_validation_split_is_seeded_and_zero_means_none():
    speakers = np.array(["a"] * 10 + ["b"] * 10)
    test = np.zeros(20, dtype=bool)
    test[::5] = True
    v1, v2 = sd.split_validation(speakers, test, 0.25, seed=0), sd.split_validation(speakers, test, 0.25, seed=0)
    assert (v1 == v2).all() and v1.sum() == 4 and not (v1 & test).any()
    assert not (sd.split_validation(speakers, test, 0.25, seed=1) == v1).all()
    assert not sd.split_validation(speakers, test, 0.0, seed=0).any()
    with pytest.raises(ValueError, match="speech.val_fraction"):
        sd.split_validation(speakers, test, 1.0, seed=0)
    with pytest.raises(ValueError, match="speech.val_fraction"):
        sd.SpeechDataConfig(val_fraction=-0.1)


def test_digit_task_relabels_by_digit(val_data):
    arrays, index, _ = val_data
    digits, names = sd.digit_task(arrays, index)
    assert names == [str(d) for d in range(10)]
    assert (digits["labels"] == index["digit"].to_numpy()).all()
    assert digits["input_values"] is arrays["input_values"]  # same audio, other labels
    assert (arrays["labels"] == index["label"].to_numpy()).all()  # the speaker labels are untouched
    with pytest.raises(ValueError, match="index rows"):
        sd.digit_task(arrays, index.iloc[:5])


# ------------------------------------------------------------------------------------------------ models


def test_graft_encoder_keeps_the_head_and_takes_the_encoder(tmp_path, val_data):
    import torch

    arrays, _, _ = val_data
    finetuned, pretrained = _model(seed=0), _model([str(d) for d in range(10)], seed=1)
    head = {k: v.clone() for k, v in finetuned.state_dict().items() if not k.startswith("hubert.")}
    sm.graft_encoder(finetuned, pretrained)
    state = finetuned.state_dict()
    assert all(torch.equal(state[k], v) for k, v in head.items())  # projector + classifier: fine-tuned
    assert all(torch.equal(state[k], v) for k, v in pretrained.state_dict().items() if k.startswith("hubert."))
    x = torch.from_numpy(arrays["input_values"][:4])
    with torch.no_grad():  # same encoder output as the pretrained model
        assert torch.equal(finetuned.hubert(x).last_hidden_state, pretrained.hubert(x).last_hidden_state)
    other = sm.build_tiny_hubert(
        sm.TinyHubertConfig(**{**TINY_HUBERT, "hidden_size": 8, "classifier_proj_size": 8}), SPEAKERS, 0
    )
    with pytest.raises(ValueError, match="graft_encoder"):
        sm.graft_encoder(finetuned, other)


def test_load_pretrained_from_checkpoint_or_config(tmp_path):
    pre = _model([str(d) for d in range(10)])
    sm.save_speech_model(pre, tmp_path / "pre")
    a = sm.load_pretrained({"name_or_path": None}, tmp_path / "pre", SPEAKERS, seed=2)
    b = sm.load_pretrained({"name_or_path": str(tmp_path / "pre"), "local_files_only": True}, None, SPEAKERS, seed=2)
    assert a.classifier.out_features == 6 and a.config.id2label[3] == "nicolas"
    assert all((a.state_dict()[k] == b.state_dict()[k]).all() for k in a.state_dict())
    with pytest.raises(ValueError, match="speech.model.name_or_path"):
        sm.load_pretrained({"name_or_path": None})


# ------------------------------------------------------------------------------------------------ sweeps


@pytest.fixture(scope="module")
def adapters(val_data, tmp_path_factory):
    """Forget / retain task matrices of a briefly trained tiny classifier (class setting), and the model."""
    from qrerase.method.adapters import task_matrices
    from qrerase.text.training import LoraTrainConfig, TrainConfig, save_adapter

    arrays, index, _ = val_data
    out = tmp_path_factory.mktemp("adapters")
    model = _model()
    strain.train_classifier(
        model,
        arrays,
        index["split"].to_numpy() == "train",
        TrainConfig(epochs=2, lr=5e-3, batch_size=32, seed=0, threads=1),
    )
    sm.save_speech_model(model, out / "ft")
    T = {}
    for which in ("forget", "retain"):
        cfg = LoraTrainConfig(
            r=4,
            alpha=8,
            target_modules=("q_proj", "k_proj", "v_proj", "out_proj"),
            train=TrainConfig(epochs=1, lr=1e-2, batch_size=32, seed=0, threads=1),
        )
        peft_model, _ = strain.train_speech_lora(
            sm.load_speech_model(out / "ft"), arrays, sd.train_mask(index, "class", which), cfg
        )
        save_adapter(peft_model, out / which)
        T[which] = task_matrices(out / which)
    return out / "ft", T


def _factors(T, k, decomp="cpqr"):
    from qrerase.method.decompose import decompose

    return tuple(
        {m: decompose(f.B, f.A, k, decomp=decomp, name=m) for m, f in T[s].items()} for s in ("forget", "retain")
    )


def test_subspace_sweep_equals_the_merged_erase_and_restores_the_model(val_data, adapters):
    import torch

    from qrerase.method.discriminate import discriminate
    from qrerase.method.erase import apply_updates

    arrays, index, _ = val_data
    ft, T = adapters
    sets = st.sweep_sets(index, "class")
    model = sm.load_speech_model(ft)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    factors = {k: _factors(T, k) for k in (1, 2)}
    modules = sorted(T["forget"])[:4]  # block 0 only, as an LL selection would
    frame = st.subspace_sweep(
        model,
        factors,
        [1.0, 3.0],
        lambda m: st.evaluate_point(m, arrays, sets, 1, 64),
        "class",
        "qr_erase_ll",
        modules=modules,
    )
    assert list(frame.columns) == st.SWEEP_COLUMNS
    assert list(zip(frame["rank"], frame["value"])) == [(1, 1.0), (1, 3.0), (2, 1.0), (2, 3.0)]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # restored after the sweep
    # the point (k=2, λ=3) is the workflow's erase: discriminate at scale 3, W' = W − U V on the selection
    ref = sm.load_speech_model(ft)
    updates = discriminate(*factors[2], scale=3.0)
    apply_updates(ref, {m: updates[m] for m in modules})
    want = st.evaluate_point(ref, arrays, sets, 1, 64)
    got = frame[(frame["rank"] == 2) & (frame["value"] == 3.0)].iloc[0]
    assert {s: got[s] for s in want} == pytest.approx(want)
    with pytest.raises(ValueError, match="have no factors"):
        st.subspace_sweep(model, factors, [1.0], lambda m: {}, "class", "x", modules=["nope"])


def test_baseline_sweep_reuses_the_trained_model_at_the_configured_value(val_data, adapters):
    arrays, index, _ = val_data
    ft, _ = adapters
    sets = st.sweep_sets(index, "sample")
    forget, retain = sd.train_mask(index, "sample", "forget"), sd.train_mask(index, "sample", "retain")
    cfg = {"mode": "full", "epochs": 1, "lr": 5e-4, "batch_size": 32, "seed": 0, "threads": 1}
    calls = []

    def trained():
        calls.append(1)
        return sm.load_speech_model(ft)  # stands for the workflow's model: here the unchanged fine-tuned one

    def evaluate(m):
        return st.evaluate_point(m, arrays, sets, 1, 64)

    frame = st.baseline_sweep(
        "ga",
        lambda: sm.load_speech_model(ft),
        arrays,
        forget,
        retain,
        cfg,
        "lr",
        [5e-4, 5e-3],
        evaluate,
        "sample",
        trained=trained,
    )
    assert calls == [1] and list(frame["value"]) == [5e-4, 5e-3] and frame["rank"].isna().all()
    base = evaluate(sm.load_speech_model(ft))
    assert {s: frame.iloc[0][s] for s in base} == pytest.approx(base)  # the re-used model's point
    assert frame.iloc[1]["D_f"] <= base["D_f"]  # ten times the learning rate of gradient ascent on D_f
    with pytest.raises(ValueError, match="sweep 'epochs' or 'lr'"):
        st.baseline_sweep("ga", None, arrays, forget, retain, cfg, "alpha", [1], evaluate, "sample")


def test_sweep_sets_need_a_validation_slice():
    index = pd.DataFrame(
        {
            "speaker": ["a", "b"],
            "split": ["train", "test"],
            "class_partition": ["forget", "test"],
            "sample_partition": ["retain", "test"],
        }
    )
    with pytest.raises(ValueError, match="speech.val_fraction > 0"):
        st.sweep_sets(index, "class")


def test_select_scale_reads_only_the_held_out_slice():
    rows = []
    for setting, dv in (("sample", [0.90, 0.88, 0.86, 0.70]), ("class", [0.92, 0.91, 0.80, 0.50])):
        for method in ("qr_erase", "qr_erase_ll"):
            for lam, v in zip((0.5, 1.0, 2.0, 4.0), dv):
                shift = 0.01 if method == "qr_erase_ll" else 0.0
                rows.append(
                    {
                        "setting": setting,
                        "method": method,
                        "param": "scale",
                        "value": lam,
                        "rank": 4,
                        "D_t": 0.0,
                        "D_f": 1.0 - lam / 8,
                        "D_r": 0.0,
                        "D_v": v + shift,
                    }
                )
    sweep = pd.DataFrame(rows, columns=st.SWEEP_COLUMNS)
    base = pd.DataFrame({"setting": ["sample", "class"], "D_v": [0.90, 0.92]})
    selected, per = st.select_scale(sweep, base, rank=4, methods=["qr_erase", "qr_erase_ll"], max_drop=0.05)
    # sample allows λ ≤ 2 (0.86 ≥ 0.85), class only λ ≤ 1 (0.80 < 0.87): the rule takes the smallest
    assert selected == 1.0
    assert per.set_index(["setting", "method"]).loc[("sample", "qr_erase"), "largest_scale"] == 2.0
    assert per.set_index(["setting", "method"]).loc[("class", "qr_erase"), "D_v_drop"] == pytest.approx(0.01)
    scrambled = sweep.assign(D_t=np.random.default_rng(0).random(len(sweep)), D_f=0.0, D_r=1.0)
    assert st.select_scale(scrambled, base, 4, ["qr_erase", "qr_erase_ll"], 0.05)[0] == selected  # D_t/D_f/D_r unread
    assert st.select_scale(sweep, base, 4, ["qr_erase"], 0.0)[0] == 0.5  # no drop at all: only λ = 0.5
    assert st.select_scale(sweep, base.assign(D_v=0.99), 4, ["qr_erase"], 0.05)[0] is None  # nothing qualifies
    with pytest.raises(ValueError, match="no sweep rows for unlearn"):
        st.select_scale(sweep, base, 4, ["unlearn"], 0.05)
    # a degenerate point (a non-finite D_v at λ = 8 everywhere) is never chosen
    bad = sweep[sweep["value"] == 4.0].assign(value=8.0, D_v=np.inf)
    with_bad = pd.concat([sweep, bad], ignore_index=True)
    assert st.select_scale(with_bad, base, 4, ["qr_erase", "qr_erase_ll"], 0.05)[0] == 1.0


def test_tradeoff_plot_writes_a_png(tmp_path):
    rows = [
        {
            "setting": "class",
            "method": "qr_erase",
            "param": "scale",
            "value": lam,
            "rank": k,
            "D_t": 0.8,
            "D_f": 1 - lam / 10,
            "D_r": 0.9 - lam / 50,
            "D_v": 0.9,
        }
        for k in (2, 4)
        for lam in (1, 2, 4)
    ]
    rows += [
        {
            "setting": "class",
            "method": "ga",
            "param": "lr",
            "value": lr,
            "rank": None,
            "D_t": 0.5,
            "D_f": 0.3,
            "D_r": 0.5,
            "D_v": 0.5,
        }
        for lr in (1e-4, 1e-3)
    ]
    base = pd.DataFrame([{"setting": "class", "method": "base", "D_t": 0.8, "D_f": 1.0, "D_r": 0.9, "D_v": 0.9}])
    st.tradeoff_plot(pd.DataFrame(rows, columns=st.SWEEP_COLUMNS), base, tmp_path / "t.png", rank=4)
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
