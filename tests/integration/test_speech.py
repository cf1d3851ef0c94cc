"""Speech track library: FSDD reading/resampling/splitting, partitions, HuBERT training, top-k, baselines, reports."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from support import REPO
from support.tiny_hubert import TINY_HUBERT

from qrerase.tracks.speech import data as sd
from qrerase.tracks.speech import model as sm
from qrerase.tracks.speech import train as strain

FSDD = REPO / "data" / "fsdd"


@pytest.fixture(scope="module")
def small_data():
    """Real FSDD audio: indices 0-2 of every speaker x digit (180 utterances), 0.3 s."""
    cfg = sd.SpeechDataConfig(
        root=str(FSDD), max_seconds=0.3, max_per_digit=3, test_fraction=0.34, forget_fraction=0.1, seed=0
    )
    return sd.make_speech_data(cfg, progress=False)


# ------------------------------------------------------------------------------------------------ data


def test_real_recording_resampled_to_twice_the_length():
    path = FSDD / "recordings" / "7_theo_3.wav"
    rate, x = sd.read_wav(path)
    assert rate == 8000 and x.dtype == np.float64 and np.abs(x).max() <= 1.0 and x.std() > 1e-3
    y = sd.resample(x, rate, 16000)
    assert len(y) == 2 * len(x)
    # the resampled signal keeps the original's spectrum below 4 kHz: same energy, up to the filter's edge loss
    assert np.sum(y**2) / 2 == pytest.approx(np.sum(x**2), rel=0.05)


def test_pure_tone_frequency_is_preserved():
    t = np.arange(8000) / 8000.0
    tone = np.sin(2 * np.pi * 440.0 * t)
    y = sd.resample(tone, 8000, 16000)
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    freqs = np.fft.rfftfreq(len(y), 1 / 16000)
    assert len(y) == 16000 and freqs[np.argmax(spectrum)] == pytest.approx(440.0, abs=1.0)
    # and the samples themselves follow the 16 kHz sine away from the edges
    t16 = np.arange(16000) / 16000.0
    assert np.max(np.abs(y[200:-200] - np.sin(2 * np.pi * 440.0 * t16[200:-200]))) < 0.01


def test_fix_length_normalises_crops_and_pads():
    x = np.linspace(-1, 1, 10) + 3.0
    out, mask = sd.fix_length(x, 16)
    assert out.dtype == np.float32 and mask.tolist() == [1] * 10 + [0] * 6
    assert out[:10].mean() == pytest.approx(0.0, abs=1e-6) and out[:10].std() == pytest.approx(1.0, abs=1e-3)
    assert (out[10:] == 0).all()
    out, mask = sd.fix_length(x, 4)
    assert len(out) == 4 and mask.all()


def test_corrupt_or_unreadable_wav_is_a_clear_error(tmp_path):
    bad = tmp_path / "1_theo_0.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really a wave file")
    with pytest.raises(ValueError, match=r"1_theo_0\.wav: not a readable WAV file"):
        sd.read_wav(bad)
    good = (FSDD / "recordings" / "1_theo_0.wav").read_bytes()
    truncated = tmp_path / "2_theo_0.wav"
    truncated.write_bytes(good[:30])
    with pytest.raises(ValueError, match=r"2_theo_0\.wav"):
        sd.read_wav(truncated)
    with pytest.raises(ValueError, match=r"not an FSDD recording name"):
        sd.parse_name(tmp_path / "theo.wav")


@pytest.mark.parametrize("keep", [44, 44 + 1000, -1])  # cut after the header, mid-data, one byte short
def test_wav_shorter_than_its_header_is_an_error_naming_the_file(tmp_path, keep):
    good = (FSDD / "recordings" / "1_theo_0.wav").read_bytes()
    rate, full = sd.read_wav(FSDD / "recordings" / "1_theo_0.wav")
    assert len(full) * 2 + 44 <= len(good)  # 16-bit mono: the cut below removes samples
    cut = tmp_path / "1_theo_0.wav"
    cut.write_bytes(good[:keep])
    with pytest.raises(
        ValueError, match=r"1_theo_0\.wav: truncated WAV file, its data is shorter than its header says"
    ):
        sd.read_wav(cut)


def test_wav_with_an_unknown_chunk_after_the_data_is_read_whole(tmp_path):
    """scipy's other warnings are harmless: an extra chunk is skipped, the samples are all there."""
    import struct

    src = FSDD / "recordings" / "1_theo_0.wav"
    good = src.read_bytes()
    extra = b"junk" + struct.pack("<I", 4) + b"abcd"
    riff = struct.pack("<I", struct.unpack("<I", good[4:8])[0] + len(extra))
    path = tmp_path / "1_theo_0.wav"
    path.write_bytes(good[:4] + riff + good[8:] + extra)
    np.testing.assert_array_equal(sd.read_wav(path)[1], sd.read_wav(src)[1])


def test_corrupt_file_in_a_corpus_names_the_file(tmp_path):
    for name in ("0_theo_0.wav", "0_george_0.wav"):
        (tmp_path / name).write_bytes((FSDD / "recordings" / name).read_bytes())
    (tmp_path / "1_theo_0.wav").write_bytes(b"\x00" * 100)
    cfg = sd.SpeechDataConfig(root=str(tmp_path), max_seconds=0.1, test_fraction=0.5)
    with pytest.raises(ValueError, match=r"1_theo_0\.wav: not a readable WAV file"):
        sd.make_speech_data(cfg, progress=False)


def test_a_held_out_clip_copied_from_a_training_clip_names_both_files(tmp_path):
    """A non-member of the membership attacks that is a training recording under another name: refused."""
    for digit in range(2):
        for speaker in ("theo", "george"):
            for i in range(4):
                name = f"{digit}_{speaker}_{i}.wav"
                (tmp_path / name).write_bytes((FSDD / "recordings" / name).read_bytes())
    cfg = sd.SpeechDataConfig(root=str(tmp_path), max_seconds=0.1, test_fraction=0.5, forget_fraction=0.2)
    _, index, _ = sd.make_speech_data(cfg, progress=False)
    held, train = index.loc[index["split"] == "test", "file"].iloc[0], index.loc[index["split"] == "train", "file"]
    copied = train[train.str.split("_").str[1] == held.split("_")[1]].iloc[0]  # the same speaker's
    (tmp_path / held).write_bytes((tmp_path / copied).read_bytes())
    with pytest.raises(
        ValueError,
        match=rf"^\S*{held}: a test clip \(held out of training\) holds the same audio as the training clip "
        rf"\S*{copied}$",
    ):
        sd.make_speech_data(cfg, progress=False)


def test_stratified_split_per_speaker_and_digit():
    recs = sd.list_recordings(FSDD, max_per_digit=10)
    assert len(recs) == 600
    test = sd.split_train_test(recs, 0.2, seed=3)
    frame = pd.DataFrame({"speaker": [r.speaker for r in recs], "digit": [r.digit for r in recs], "test": test})
    per_cell = frame.groupby(["speaker", "digit"])["test"].sum()
    assert (per_cell == 2).all() and len(per_cell) == 60  # round(0.2 * 10) in every cell
    assert (sd.split_train_test(recs, 0.2, seed=3) == test).all()
    assert not (sd.split_train_test(recs, 0.2, seed=4) == test).all()


def test_sample_partition_definition(small_data):
    _, index, _ = small_data
    part = index["sample_partition"].to_numpy()
    train = index["split"].to_numpy() == "train"
    assert (part[~train] == "test").all()  # D_t = the whole held-out split
    assert (part == "forget").sum() == round(0.1 * train.sum())  # D_f = 10 % of the training utterances
    assert set(part[train]) == {"forget", "retain"}  # D_r = the other training utterances
    masks = sd.eval_masks(index, "sample")
    assert (masks["D_t"] == ~train).all() and (masks["D_f"] | masks["D_r"] == train).all()
    assert (sd.train_mask(index, "sample", "forget") == masks["D_f"]).all()


def test_class_partition_definition(small_data):
    _, index, meta = small_data
    forget_speakers = meta["forget_speakers"]
    assert len(forget_speakers) == 1  # max(1, round(0.1 * 6))
    is_f = index["speaker"].isin(forget_speakers).to_numpy()
    train = index["split"].to_numpy() == "train"
    masks = sd.eval_masks(index, "class")
    assert (masks["D_f"] == is_f).all()  # every utterance (train and test) of the forgotten speaker
    assert (masks["D_r"] == (~is_f & train)).all()  # training utterances of retained speakers
    assert (masks["D_t"] == (~is_f & ~train)).all()  # test utterances of retained speakers
    assert (sd.train_mask(index, "class", "forget") == (is_f & train)).all()


def test_bad_speaker_and_bad_fraction_are_clear_errors():
    with pytest.raises(ValueError, match=r"speaker 'alice' not in the data"):
        sd.choose_forget_speakers(["george", "theo"], ["alice"], 0.1, 0)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"speech.forget_fraction: must lie in \(0, 1\)"):
            sd.SpeechDataConfig(forget_fraction=bad)
    index = pd.DataFrame({"speaker": ["a"] * 4, "split": ["train"] * 4})
    with pytest.raises(ValueError, match="forget_fraction"):
        sd.partition(index, "sample", forget_fraction=1.2)


def test_arrays_match_index(small_data):
    arrays, index, meta = small_data
    assert arrays["input_values"].shape == (180, 4800) and arrays["input_values"].dtype == np.float32
    assert arrays["attention_mask"].dtype == np.int64 and arrays["labels"].tolist() == index["label"].tolist()
    assert meta["speakers"] == sorted(set(index["speaker"]))


# ------------------------------------------------------------------------------------------------ metrics


def test_topk_accuracy_on_hand_made_logits():
    logits = np.array([[3.0, 2.0, 1.0], [1.0, 3.0, 2.0], [1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    labels = np.array([0, 2, 0, 1])
    assert strain.topk_accuracy(logits, labels, 1) == pytest.approx(1 / 4)  # only row 0
    assert strain.topk_accuracy(logits, labels, 2) == pytest.approx(3 / 4)  # rows 0, 1, 3
    assert strain.topk_accuracy(logits, labels, 3) == 1.0
    with pytest.raises(ValueError, match="k=4"):
        strain.topk_accuracy(logits, labels, 4)


# ------------------------------------------------------------------------------------------------ model


def _model(seed=0):
    return sm.build_tiny_hubert(sm.TinyHubertConfig(**TINY_HUBERT), ["a", "b", "c", "d", "e", "f"], seed)


def test_short_training_is_deterministic(small_data):
    import torch

    from qrerase.text.training import TrainConfig

    arrays, index, _ = small_data
    mask = np.zeros(len(index), dtype=bool)
    mask[:40] = True
    cfg = TrainConfig(epochs=1, lr=1e-3, batch_size=16, seed=5, threads=1)
    states, curves = [], []
    for _ in range(2):
        model = _model()
        curves.append(strain.train_classifier(model, arrays, mask, cfg))
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    assert len(curves[0]) == 3 and curves[0].equals(curves[1])
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    assert not torch.equal(states[0]["classifier.weight"], _model().state_dict()["classifier.weight"])


def test_lora_task_matrices_are_hubert_attention_modules(small_data, tmp_path):
    from qrerase.method.adapters import task_matrices
    from qrerase.method.module_names import block_of
    from qrerase.text.training import LoraTrainConfig, TrainConfig, save_adapter

    arrays, index, _ = small_data
    cfg = LoraTrainConfig(
        r=2,
        alpha=4,
        target_modules=("q_proj", "k_proj", "v_proj", "out_proj"),
        train=TrainConfig(epochs=1, lr=1e-2, batch_size=32, seed=0, threads=1),
    )
    peft_model, curve = strain.train_speech_lora(_model(), arrays, sd.train_mask(index, "class", "forget"), cfg)
    save_adapter(peft_model, tmp_path / "forget")
    T = task_matrices(tmp_path / "forget")
    assert sorted(T)[:2] == ["hubert.encoder.layers.0.attention.k_proj", "hubert.encoder.layers.0.attention.out_proj"]
    assert len(T) == 8 and {block_of(m) for m in T} == {0, 1}
    assert all(np.linalg.norm(t.dense()) > 0 for t in T.values())


def test_save_and_load_round_trip(tmp_path, small_data):
    arrays, _, _ = small_data
    model = _model()
    sm.save_speech_model(model, tmp_path / "m")
    loaded = sm.load_speech_model(tmp_path / "m")
    assert not loaded.training  # loaded for evaluation
    np.testing.assert_array_equal(strain.predict_logits(model, arrays), strain.predict_logits(loaded, arrays))


def test_pretrained_checkpoint_gets_a_new_speaker_head(tmp_path):
    """The real-model path (e.g. hubert-xlarge): a checkpoint whose head does not fit gets a new, seeded one."""
    sm.save_speech_model(_model(), tmp_path / "pretrained")
    a = sm.load_speech_model(tmp_path / "pretrained", speakers=["x", "y", "z"], seed=3)
    b = sm.load_speech_model(tmp_path / "pretrained", speakers=["x", "y", "z"], seed=3)
    assert a.classifier.out_features == 3 and a.config.id2label == {0: "x", 1: "y", 2: "z"}
    assert (a.classifier.weight == b.classifier.weight).all()
    base = _model().state_dict()
    assert (
        a.state_dict()["hubert.encoder.layers.1.attention.q_proj.weight"]
        == base["hubert.encoder.layers.1.attention.q_proj.weight"]
    ).all()
    with pytest.raises(ValueError, match="no such speech model directory"):
        sm.load_speech_model(tmp_path / "missing")


# ------------------------------------------------------------------------------------------------ baselines


def test_baseline_losses_match_hand_computation():
    import torch

    from qrerase.tracks.speech import baselines as sb

    s = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    t = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
    y = torch.tensor([0, 1])

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    sn, tn = s.numpy().astype(np.float64), t.numpy().astype(np.float64)
    ce = -np.mean([np.log(softmax(sn)[i, y[i]]) for i in range(2)])
    assert float(sb.ga_classifier_loss(s, y)) == pytest.approx(-ce, rel=1e-6)
    T = 2.0
    ps, pt = softmax(sn / T), softmax(tn / T)
    kl = np.mean(np.sum(pt * (np.log(pt) - np.log(ps)), axis=1)) * T * T
    assert float(sb.kl_teacher_student(s, t, T)) == pytest.approx(kl, rel=1e-6)
    assert float(sb.scrub_max_loss(s, t, T)) == pytest.approx(-kl, rel=1e-6)
    assert float(sb.scrub_min_loss(s, t, y, alpha=0.3, gamma=0.7, temperature=T)) == pytest.approx(
        0.7 * ce + 0.3 * kl, rel=1e-6
    )
    bad = torch.tensor([[0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    is_f = torch.tensor([True, False])
    target = np.stack([softmax(bad.numpy().astype(np.float64))[0], softmax(tn)[1]])
    ps1 = softmax(sn)
    want = np.mean(np.sum(target * (np.log(target) - np.log(ps1)), axis=1))
    assert float(sb.bad_teaching_loss(s, t, bad, is_f, 1.0)) == pytest.approx(want, rel=1e-6)
    assert float(sb.kl_teacher_student(t, t, 1.0)) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("method, mode", [("ga", "full"), ("scrub", "full"), ("bad_teaching", "lora")])
def test_baselines_produce_a_changed_plain_model_deterministically(small_data, method, mode):
    import torch

    from qrerase.tracks.speech.baselines import SpeechBaselineConfig, run_baseline

    arrays, index, _ = small_data
    forget, retain = sd.train_mask(index, "sample", "forget"), sd.train_mask(index, "sample", "retain")
    retain[np.flatnonzero(retain)[40:]] = False  # a short run
    own = {"temperature": 2.0} if method in ("scrub", "bad_teaching") else {}  # the method's own hyperparameter
    cfg = SpeechBaselineConfig.of(
        method=method, mode=mode, epochs=1, lr=1e-3, batch_size=16, lora_r=2, lora_alpha=4, seed=1, threads=1, **own
    )
    base = _model().state_dict()
    outs = []
    for _ in range(2):
        model, curve = run_baseline(method, _model(), arrays, forget, retain, cfg)
        outs.append((model.state_dict(), curve))
    state, curve = outs[0]
    assert set(state) == set(base)  # merged back into a plain HubertForSequenceClassification
    assert any(not torch.equal(state[k], base[k]) for k in base)
    assert all(torch.equal(state[k], outs[1][0][k]) for k in state) and curve.equals(outs[1][1])
    assert np.isfinite(curve["loss"]).all() and len(curve) >= 1
    if method == "scrub":
        assert list(dict.fromkeys(curve["phase"])) == ["max", "min"]


def test_unknown_baseline_and_bad_mode():
    from qrerase.tracks.speech.baselines import SpeechBaselineConfig, run_baseline

    with pytest.raises(ValueError, match=r"'mode' must be one of \['full', 'lora'\]"):
        SpeechBaselineConfig.of(method="ga", mode="half")
    with pytest.raises(ValueError, match="must be one of"):
        run_baseline("npo", None, {}, np.zeros(1, bool), np.zeros(1, bool), SpeechBaselineConfig.of(method="ga"))


# ------------------------------------------------------------------------------------------------ reports


def test_speech_table_layout():
    from qrerase.reports.tables import render_markdown
    from qrerase.tracks.speech.tables import speech_table

    rows = []
    for setting in ("sample", "class"):
        for model, acc in (("base", (0.9, 0.95, 0.97)), ("ga", (0.2, 0.1, 0.3)), ("qr_erase_k4", (0.8, 0.4, 0.9))):
            for name, a in zip(("D_t", "D_f", "D_r"), acc):
                rows.append({"setting": setting, "model": model, "set": name, "accuracy": a})
    df, spec = speech_table(
        pd.DataFrame(rows), ["sample", "class"], ["base", "ga", "qr_erase_k4"], row_key=lambda m: m.replace("_k4", "")
    )
    assert list(df["method"]) == ["base", "ga", "qr_erase"]
    assert list(df.columns)[1:] == [f"{s}_{n}" for s in ("sample", "class") for n in ("D_t", "D_f", "D_r")]
    assert df.loc[2, "class_D_f"] == pytest.approx(40.0)
    md = render_markdown(df, spec)
    assert "**Sample**" in md and "**Class**" in md and "Fine-Tuned Model" in md
    assert "**10.0**" in md  # lowest D_f (GA) is best
    with pytest.raises(ValueError, match="no D_t accuracy of model 'npo'"):
        speech_table(pd.DataFrame(rows), ["sample"], ["npo"])


def test_localisation_statistics():
    from qrerase.tracks.speech.tables import localisation

    uniform = localisation({"0": 0.25, "1": 0.25, "2": 0.25, "3": 0.25})
    assert uniform["effective_layers"] == pytest.approx(4.0) and uniform["n_selected"] == 4
    peaked = localisation({"0": 0.7, "1": 0.1, "2": 0.1, "3": 0.1})
    assert peaked["n_selected"] == 1 and peaked["selected_share"] == pytest.approx(0.7)
    h = -(0.7 * math.log(0.7) + 3 * 0.1 * math.log(0.1))
    assert peaked["effective_layers"] == pytest.approx(math.exp(h)) and peaked["effective_layers"] < 4
    with pytest.raises(ValueError, match="sum to 1"):
        localisation({"0": 0.5})


def test_rank_curve_aggregates_reconstruction_error():
    from qrerase.tracks.speech.tables import rank_curve

    report = pd.DataFrame(
        {
            "set": ["forget", "forget", "retain"],
            "fro_norm": [3.0, 4.0, 1.0],
            "recon_err_cpqr": [0.5, 0.0, 0.9],
            "recon_err_svd": [0.1, 0.2, 0.9],
        }
    )
    evals = pd.DataFrame(
        [
            {"model": f"{m}_k1", "set": s, "accuracy": a}
            for m in ("qr_erase", "unlearn")
            for s, a in (("D_f", 0.3), ("D_r", 0.8))
        ]
    )
    curve = rank_curve({1: report}, evals)
    cpqr = curve.set_index("decomp").loc["cpqr"]
    assert cpqr["recon_error"] == pytest.approx(math.sqrt((0.25 * 9) / 25))  # sqrt(sum e^2 |T|^2 / sum |T|^2)
    assert cpqr["D_f"] == 0.3 and cpqr["D_r"] == 0.8
