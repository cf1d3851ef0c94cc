"""Speech track data: FSDD recordings, splits and the unlearning settings (paper §4.3).

Data (the Free Spoken Digit Dataset layout: ``{digit}_{speaker}_{index}.wav``, mono 8 kHz int16):

* :func:`read_wav` reads one file (scipy), :func:`resample` converts it to ``sample_rate`` with a
  polyphase filter (``scipy.signal.resample_poly``; 8 → 16 kHz is up-sampling by 2), :func:`fix_length`
  crops / zero-pads to ``max_seconds`` and returns the attention mask of the real samples.
* :func:`split_train_test` is a seeded split stratified per speaker (and per digit within a speaker):
  in every (speaker, digit) cell ``round(test_fraction · n)`` recordings go to the test split.
* Two unlearning settings with the paper's three evaluation sets:

  - ``sample``: D_f = a seeded random ``forget_fraction`` of the training utterances, D_r = the
    other training utterances, D_t = the whole test split.
  - ``class``: D_f = every utterance (train and test) of the forgotten speaker(s), D_r = the training
    utterances of the retained speakers, D_t = the test utterances of the retained speakers.

  :func:`split_validation` holds a seeded ``val_fraction`` of every speaker's non-test utterances out
  of all training and evaluation (``split == 'val'``): the slice the λ rule reads (:func:`val_mask`).

  :func:`partition` labels every utterance ``forget`` / ``retain`` / ``test`` for a setting;
  :func:`train_mask` says which utterances a LoRA adapter or a baseline trains on (D_f ∩ train for
  the forget set: the forget adapter learns what the model was trained on; D_r for the retain set).

Arrays: ``input_values`` float32 (N, L) (per-utterance zero-mean unit-variance waveform, zero after
the end), ``attention_mask`` int64 (N, L) (1 on real samples), ``labels`` int64 (N,) (speaker index in
the sorted speaker list). L = round(max_seconds · sample_rate). The model is
:mod:`qrerase.tracks.speech.model`, its training and evaluation :mod:`qrerase.tracks.speech.train`.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ...config import from_mapping

__all__ = [
    "SETTINGS",
    "SPEECH_SETS",
    "SpeechDataConfig",
    "Recording",
    "parse_name",
    "list_recordings",
    "read_wav",
    "resample",
    "fix_length",
    "load_audio",
    "split_train_test",
    "split_validation",
    "check_held_out",
    "choose_forget_speakers",
    "partition",
    "train_mask",
    "eval_masks",
    "val_mask",
    "make_speech_data",
    "load_speech_data",
    "digit_task",
]

SETTINGS = ("sample", "class")
#: The speech track's evaluation sets: test (D_t), forget (D_f) and retain (D_r) utterances.
SPEECH_SETS = ("D_t", "D_f", "D_r")
_NAME_RE = re.compile(r"^(?P<digit>\d+)_(?P<speaker>[A-Za-z0-9-]+)_(?P<index>\d+)\.wav$")


@dataclass(frozen=True)
class SpeechDataConfig:
    """Config section ``speech.data`` (plus the partition keys of ``speech``).

    root: a folder of FSDD recordings (``recordings/`` below it is used when present).
    max_per_digit: use only indices < this per (speaker, digit) (None: all).
    forget_speakers: speakers forgotten in the class setting; None: ``max(1, round(forget_fraction ·
    #speakers))`` speakers drawn with ``seed``.
    """

    root: str = "data/fsdd"
    sample_rate: int = 16000
    max_seconds: float = 0.8
    max_per_digit: int | None = None
    test_fraction: float = 0.2
    val_fraction: float = 0.0
    forget_fraction: float = 0.1
    forget_speakers: tuple[str, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        for key in ("test_fraction", "forget_fraction"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and 0.0 < float(value) < 1.0):
                raise ValueError(f"speech.{key}: must lie in (0, 1), got {value!r}")
        if not (isinstance(self.val_fraction, (int, float)) and 0.0 <= float(self.val_fraction) < 1.0):
            raise ValueError(f"speech.val_fraction: must lie in [0, 1), got {self.val_fraction!r}")
        if self.sample_rate <= 0 or self.max_seconds <= 0:
            raise ValueError(
                f"speech.data: sample_rate and max_seconds must be positive, got {self.sample_rate}, {self.max_seconds}"
            )
        if self.forget_speakers is not None:
            object.__setattr__(self, "forget_speakers", tuple(self.forget_speakers))

    @property
    def length(self) -> int:
        return int(round(self.max_seconds * self.sample_rate))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeechDataConfig:
        return from_mapping(cls, d, "speech data config")


@dataclass(frozen=True)
class Recording:
    path: str
    digit: int
    speaker: str
    index: int


def parse_name(path: str | os.PathLike) -> Recording:
    """``7_theo_12.wav`` → Recording(digit=7, speaker='theo', index=12); ValueError naming the file otherwise."""
    name = Path(path).name
    m = _NAME_RE.match(name)
    if m is None:
        raise ValueError(f"{path}: not an FSDD recording name (expected '<digit>_<speaker>_<index>.wav')")
    return Recording(str(path), int(m.group("digit")), m.group("speaker"), int(m.group("index")))


def recordings_dir(root: str | os.PathLike) -> Path:
    root = Path(root)
    return root / "recordings" if (root / "recordings").is_dir() else root


def list_recordings(root: str | os.PathLike, max_per_digit: int | None = None) -> list[Recording]:
    """Every FSDD recording under ``root`` (or ``root/recordings``), sorted by (speaker, digit, index).

    ``max_per_digit`` keeps indices < N. FileNotFoundError when the folder holds no ``.wav`` file.
    """
    folder = recordings_dir(root)
    if not folder.is_dir():
        raise FileNotFoundError(f"{root}: speech data folder not found")
    recs = [parse_name(p) for p in folder.glob("*.wav")]
    if max_per_digit is not None:
        recs = [r for r in recs if r.index < max_per_digit]
    if not recs:
        raise FileNotFoundError(f"{folder}: no FSDD .wav recordings found")
    return sorted(recs, key=lambda r: (r.speaker, r.digit, r.index))


def read_wav(path: str | os.PathLike) -> tuple[int, np.ndarray]:
    """(sample rate, mono float64 waveform in [-1, 1]) of a PCM / float WAV file.

    A missing, unreadable or corrupt file, a multi-channel or empty recording, or a file cut short
    (fewer data bytes than its header says): ValueError naming the file. scipy reads a cut file's
    remaining samples and only warns ("Reached EOF prematurely"); that warning is an error here.
    Its other warnings (an unknown chunk skipped, a broken chunk after the data) are harmless.
    """
    import warnings

    from scipy.io import wavfile

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", wavfile.WavFileWarning)
            rate, data = wavfile.read(str(path))
    except FileNotFoundError:
        raise
    except Exception as exc:  # scipy raises ValueError / struct.error / EOFError on bad files
        raise ValueError(f"{path}: not a readable WAV file ({type(exc).__name__}: {exc})") from exc
    for w in caught:
        if issubclass(w.category, wavfile.WavFileWarning) and "EOF prematurely" in str(w.message):
            raise ValueError(f"{path}: truncated WAV file, its data is shorter than its header says ({w.message})")
    data = np.asarray(data)
    if data.ndim != 1:
        raise ValueError(f"{path}: expected a mono recording, got shape {data.shape}")
    if data.size == 0:
        raise ValueError(f"{path}: empty recording")
    if data.dtype.kind == "i":
        x = data.astype(np.float64) / float(-np.iinfo(data.dtype).min)
    elif data.dtype == np.uint8:
        x = (data.astype(np.float64) - 128.0) / 128.0
    elif data.dtype.kind == "f":
        x = data.astype(np.float64)
    else:
        raise ValueError(f"{path}: unsupported WAV sample type {data.dtype}")
    if not np.isfinite(x).all():
        raise ValueError(f"{path}: recording contains NaN or Inf")
    return int(rate), x


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Polyphase resampling ``rate_in`` → ``rate_out`` (``resample_poly(x, up, down)``, up/down reduced).

    The output has ``ceil(len(x) · up / down)`` samples (8 → 16 kHz: exactly twice as many); float64.
    """
    from scipy.signal import resample_poly

    if rate_in <= 0 or rate_out <= 0:
        raise ValueError(f"sample rates must be positive, got {rate_in} → {rate_out}")
    x = np.asarray(x, dtype=np.float64)
    if rate_in == rate_out:
        return x.copy()
    g = gcd(int(rate_in), int(rate_out))
    return resample_poly(x, int(rate_out) // g, int(rate_in) // g)


def fix_length(x: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalise to zero mean / unit variance (HuBERT's feature-extractor convention), then crop or
    zero-pad to ``length``. Returns (float32 waveform, int64 mask: 1 on real samples)."""
    x = np.asarray(x, dtype=np.float64)
    x = (x - x.mean()) / math.sqrt(x.var() + 1e-7)
    n = min(len(x), length)
    out = np.zeros(length, dtype=np.float32)
    out[:n] = x[:n]
    mask = np.zeros(length, dtype=np.int64)
    mask[:n] = 1
    return out, mask


def load_audio(recs: Sequence[Recording], sample_rate: int, length: int, progress: bool = True):
    """(input_values float32 (N, L), attention_mask int64 (N, L)) of the recordings, in order."""
    from tqdm.auto import tqdm

    xs = np.zeros((len(recs), length), dtype=np.float32)
    ms = np.zeros((len(recs), length), dtype=np.int64)
    for i, rec in enumerate(tqdm(recs, desc="audio", file=sys.stderr, disable=not progress, mininterval=1.0)):
        rate, x = read_wav(rec.path)
        xs[i], ms[i] = fix_length(resample(x, rate, sample_rate), length)
    return xs, ms


def split_train_test(recs: Sequence[Recording], test_fraction: float, seed: int) -> np.ndarray:
    """Boolean test mask, stratified per speaker (and digit): ``round(test_fraction · n)`` of every
    (speaker, digit) cell, chosen by a generator seeded with ``seed`` (cells visited in sorted order)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"speech.test_fraction: must lie in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(seed)
    cells: dict[tuple[str, int], list[int]] = {}
    for i, r in enumerate(recs):
        cells.setdefault((r.speaker, r.digit), []).append(i)
    test = np.zeros(len(recs), dtype=bool)
    for key in sorted(cells):
        idx = sorted(cells[key], key=lambda i: recs[i].index)
        n_test = int(round(test_fraction * len(idx)))
        test[np.asarray(idx)[rng.permutation(len(idx))[:n_test]]] = True
    return test


def split_validation(speakers: Sequence[str], test: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean validation mask: per speaker, ``round(val_fraction · n)`` of its n non-test utterances,
    drawn by a generator seeded with ``seed + 1`` (speakers visited in sorted order; 0: none).

    The held-out slice is held out of every training run (pretraining, fine-tuning, LoRA, baselines)
    and of every evaluation set; it only serves choices made before the evaluation (the λ rule).
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"speech.val_fraction: must lie in [0, 1), got {val_fraction!r}")
    speakers = np.asarray(speakers)
    test = np.asarray(test, dtype=bool)
    if speakers.shape != test.shape:
        raise ValueError(f"split_validation: {speakers.shape[0]} speakers vs {test.shape[0]} test flags")
    rng = np.random.default_rng(seed + 1)
    val = np.zeros(len(test), dtype=bool)
    for name in sorted(set(speakers.tolist())):
        idx = np.flatnonzero((speakers == name) & ~test)
        n_val = int(round(val_fraction * len(idx)))
        val[idx[rng.permutation(len(idx))[:n_val]]] = True
    return val


def choose_forget_speakers(
    speakers: Sequence[str], forget_speakers: Sequence[str] | None, fraction: float, seed: int
) -> list[str]:
    """The class setting's forgotten speakers: the configured ones (checked), or a seeded draw of
    ``max(1, round(fraction · #speakers))``. ValueError naming an unknown speaker."""
    speakers = sorted(speakers)
    if forget_speakers is not None:
        unknown = [s for s in forget_speakers if s not in speakers]
        if unknown:
            raise ValueError(f"speech.forget_speakers: speaker {unknown[0]!r} not in the data (speakers: {speakers})")
        if not forget_speakers or len(set(forget_speakers)) >= len(speakers):
            raise ValueError(
                f"speech.forget_speakers: need between 1 and {len(speakers) - 1} speakers, got {list(forget_speakers)}"
            )
        return sorted(set(forget_speakers))
    n = max(1, int(round(fraction * len(speakers))))
    if n >= len(speakers):
        raise ValueError(f"speech.forget_fraction: {fraction} of {len(speakers)} speakers leaves no retained speaker")
    rng = np.random.default_rng(seed)
    return sorted(np.asarray(speakers)[rng.permutation(len(speakers))[:n]].tolist())


def partition(
    index: pd.DataFrame, setting: str, forget_fraction: float = 0.1, forget_speakers: Sequence[str] = (), seed: int = 0
) -> np.ndarray:
    """Per utterance ``'forget'`` (D_f), ``'retain'`` (D_r), ``'test'`` (D_t) or ``'val'`` for a setting.

    ``index`` needs columns ``speaker`` and ``split`` (``train``/``val``/``test``). Sample setting: D_f =
    ``round(forget_fraction · n_train)`` training utterances drawn with ``seed``. Class setting: D_f =
    all utterances of ``forget_speakers``; test utterances of retained speakers are D_t. Validation
    utterances (of retained speakers, in the class setting) are ``'val'``: in no evaluation set.
    """
    if setting not in SETTINGS:
        raise ValueError(f"speech setting must be one of {SETTINGS}, got {setting!r}")
    split = index["split"].to_numpy()
    out = np.select([split == "train", split == "val"], ["retain", "val"], "test").astype(object)
    if setting == "sample":
        if not 0.0 < forget_fraction < 1.0:
            raise ValueError(f"speech.forget_fraction: must lie in (0, 1), got {forget_fraction!r}")
        train_idx = np.flatnonzero(split == "train")
        n = int(round(forget_fraction * len(train_idx)))
        if n < 1 or n >= len(train_idx):
            raise ValueError(
                f"speech.forget_fraction: {forget_fraction} of {len(train_idx)} training utterances is {n}"
            )
        rng = np.random.default_rng(seed)
        out[train_idx[rng.permutation(len(train_idx))[:n]]] = "forget"
    else:
        if not forget_speakers:
            raise ValueError("class setting: no forget speaker given")
        out[index["speaker"].isin(list(forget_speakers)).to_numpy()] = "forget"
    return out.astype(str)


def train_mask(index: pd.DataFrame, setting: str, which: str) -> np.ndarray:
    """Utterances a forget / retain adapter (or baseline) trains on: D_f ∩ train, or D_r."""
    part = index[f"{setting}_partition"].to_numpy()
    train = index["split"].to_numpy() == "train"
    if which == "forget":
        return (part == "forget") & train
    if which == "retain":
        return part == "retain"
    raise ValueError(f"set must be 'forget' or 'retain', got {which!r}")


def eval_masks(index: pd.DataFrame, setting: str) -> dict[str, np.ndarray]:
    """D_t / D_f / D_r boolean masks of a setting (from the ``<setting>_partition`` column)."""
    part = index[f"{setting}_partition"].to_numpy()
    return {"D_t": part == "test", "D_f": part == "forget", "D_r": part == "retain"}


def val_mask(index: pd.DataFrame, setting: str) -> np.ndarray:
    """The held-out slice of a setting: the retained speakers' utterances held out of training (``'val'``)."""
    return index[f"{setting}_partition"].to_numpy() == "val"


def make_speech_data(cfg: SpeechDataConfig, progress: bool = True) -> tuple[dict[str, np.ndarray], pd.DataFrame, dict]:
    """Read, resample, split and partition the corpus.

    Returns (arrays: ``input_values``, ``attention_mask``, ``labels``; index frame with columns
    ``file, speaker, digit, index, label, split, sample_partition, class_partition``; meta dict with
    ``speakers`` (label order), ``forget_speakers``, ``sample_rate``, ``length``).
    """
    recs = list_recordings(cfg.root, cfg.max_per_digit)
    speakers = sorted({r.speaker for r in recs})
    if len(speakers) < 2:
        raise ValueError(f"{cfg.root}: need at least 2 speakers, found {speakers}")
    forget_speakers = choose_forget_speakers(speakers, cfg.forget_speakers, cfg.forget_fraction, cfg.seed)
    xs, ms = load_audio(recs, cfg.sample_rate, cfg.length, progress=progress)  # a bad file fails here, naming it
    test = split_train_test(recs, cfg.test_fraction, cfg.seed)
    val = split_validation([r.speaker for r in recs], test, cfg.val_fraction, cfg.seed)
    index = pd.DataFrame(
        {
            "file": [Path(r.path).name for r in recs],
            "speaker": [r.speaker for r in recs],
            "digit": [r.digit for r in recs],
            "index": [r.index for r in recs],
            "label": [speakers.index(r.speaker) for r in recs],
            "split": np.select([test, val], ["test", "val"], "train"),
        }
    )
    check_held_out(xs, index["split"].to_numpy(), [r.path for r in recs])
    index["sample_partition"] = partition(index, "sample", cfg.forget_fraction, seed=cfg.seed)
    index["class_partition"] = partition(index, "class", forget_speakers=forget_speakers, seed=cfg.seed)
    arrays = {"input_values": xs, "attention_mask": ms, "labels": index["label"].to_numpy(dtype=np.int64)}
    meta = {
        "speakers": speakers,
        "forget_speakers": forget_speakers,
        "sample_rate": cfg.sample_rate,
        "length": cfg.length,
    }
    return arrays, index, meta


def check_held_out(xs: np.ndarray, split: np.ndarray, files: Sequence[str]) -> None:
    """Refuse a held-out clip (``split`` val or test: the non-members of the membership attacks, the
    evaluation of the test split) whose audio, as the models see it (``xs``: (N, length) float32 after
    resampling and padding), equals a training clip's: a copy of a training recording under another
    file name. A ValueError names both files."""
    import hashlib

    if not (len(xs) == len(split) == len(files)):
        raise ValueError(f"check_held_out: {len(xs)} clips, {len(split)} splits and {len(files)} files")
    trained: dict[str, str] = {}
    for x, s, f in zip(xs, split, files):
        if s == "train":
            trained.setdefault(hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest(), f)
    for x, s, f in zip(xs, split, files):
        if s != "train":
            seen = trained.get(hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest())
            if seen is not None:
                raise ValueError(
                    f"{f}: a {s} clip (held out of training) holds the same audio as the training clip {seen}"
                )


def load_speech_data(
    audio: str | os.PathLike, index_csv: str | os.PathLike
) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """Read the arrays (safetensors) and the index (CSV) written by the speech_data rule, checked for agreement."""
    from ...io import load_arrays

    arrays = load_arrays(audio)
    missing = {"input_values", "attention_mask", "labels"} - set(arrays)
    if missing:
        raise ValueError(f"{audio}: missing arrays {sorted(missing)}")
    index = pd.read_csv(index_csv)
    if len(index) != len(arrays["labels"]) or not np.array_equal(index["label"].to_numpy(), arrays["labels"]):
        raise ValueError(
            f"{index_csv}: does not match {audio} ({len(index)} rows vs {len(arrays['labels'])} utterances)"
        )
    return arrays, index


def digit_task(arrays: Mapping[str, np.ndarray], index: pd.DataFrame) -> tuple[dict[str, np.ndarray], list[str]]:
    """The pretraining task of the same corpus: digit recognition. Returns (arrays with ``labels`` = the
    position of each utterance's digit among the sorted digits present, label names ``['0', …]``)."""
    digits = index["digit"].to_numpy()
    if len(digits) != len(arrays["labels"]):
        raise ValueError(f"digit_task: {len(digits)} index rows vs {len(arrays['labels'])} utterances")
    values = sorted(set(int(d) for d in digits))
    if len(values) < 2:
        raise ValueError(f"digit_task: need at least 2 digits, found {values}")
    labels = np.searchsorted(values, digits).astype(np.int64)
    return {**arrays, "labels": labels}, [str(v) for v in values]
