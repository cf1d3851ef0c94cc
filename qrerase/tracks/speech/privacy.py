"""Speech track membership inference: the LOSS attack on the forgotten clips (registered metric ``mia_loss``).

Members and non-members (:func:`attack_masks`), from the ``index`` of :mod:`qrerase.tracks.speech.data`:

* members: D_f's training clips (``<setting>_partition == 'forget'`` and ``split == 'train'``), the
  clips the fine-tuned model was trained on and an unlearning method should forget;
* non-members: the held-out clips (``split`` ``'val'`` or ``'test'``: in no training run) of the same
  speakers. In the class setting that is the forgotten speaker's validation and test clips; in the
  sample setting the held-out clips of every speaker with a clip in D_f.

Attack (Yeom et al. 2018, LOSS, as :func:`qrerase.metrics.mia.loss_score` on text): the per-clip
cross-entropy of the speaker label, ``ℓ_i = logsumexp(z_i) − z_i[y_i]`` (:func:`clip_losses`), score
``−ℓ_i`` (a member has a lower loss), and the exact ROC AUC of member against non-member scores
(:func:`loss_attack_auc`, :func:`qrerase.metrics.mia.auc`). 0.5: members and held-out clips are
indistinguishable; the fine-tuned model is well above 0.5.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["HELD_OUT_SPLITS", "attack_masks", "clip_losses", "loss_score", "loss_attack_auc", "attack_metrics"]

#: The ``split`` values of clips held out of every training run (non-members).
HELD_OUT_SPLITS = ("val", "test")


def attack_masks(index: pd.DataFrame, setting: str) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (N,) masks ``(members, nonmembers)`` of a setting (module docstring).

    ``index`` needs ``speaker``, ``split`` and ``<setting>_partition``. ValueError (one line naming
    the column or the setting) when a column is missing or either set is empty.
    """
    part_col = f"{setting}_partition"
    missing = [c for c in ("speaker", "split", part_col) if c not in index.columns]
    if missing:
        raise ValueError(f"speech attack: index lacks column(s) {missing}")
    split = index["split"].to_numpy()
    members = (index[part_col].to_numpy() == "forget") & (split == "train")
    speakers = set(index.loc[members, "speaker"])
    nonmembers = index["speaker"].isin(speakers).to_numpy() & np.isin(split, HELD_OUT_SPLITS)
    if not members.any() or not nonmembers.any():
        raise ValueError(
            f"speech attack, setting {setting!r}: {int(members.sum())} member and {int(nonmembers.sum())} "
            "non-member clips (need both)"
        )
    return members, nonmembers


def clip_losses(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-clip cross-entropy ``logsumexp(z_i) − z_i[y_i]`` (nats), float64 (N,).

    ``logits`` (N, C) finite floats, ``labels`` (N,) integers in [0, C). ValueError otherwise.
    """
    z = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels)
    if z.ndim != 2 or y.shape != (z.shape[0],) or z.shape[0] == 0:
        raise ValueError(f"clip_losses: expected logits (N, C) and labels (N,), got {z.shape} and {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (y < 0).any() or (y >= z.shape[1]).any():
        raise ValueError(f"clip_losses: labels must be integers in [0, {z.shape[1]})")
    if not np.isfinite(z).all():
        raise ValueError("clip_losses: logits must be finite")
    top = z.max(axis=1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
    return lse - z[np.arange(len(y)), y]


def loss_score(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The LOSS attack's member-oriented per-clip score ``−ℓ_i`` (:func:`clip_losses`), float64 (N,):
    the speech track's function of the registered metric ``mia_loss``."""
    return -clip_losses(logits, labels)


def attack_metrics(
    members: tuple[np.ndarray, np.ndarray], nonmembers: tuple[np.ndarray, np.ndarray], track: str = "speech"
) -> dict[str, float]:
    """Every registered metric of ``track`` with aggregate ``auc`` or ``mean``, in registry order
    (:func:`qrerase.metrics.registry.metrics_for`), from ``(logits (N, C), labels (N,))`` of the member
    and non-member clips: ``auc`` is the exact ROC AUC of the per-clip scores of the metric's track
    function (members label 1, ties ½: :func:`qrerase.metrics.mia.auc`), ``mean`` the mean of its
    per-clip value over the members. A plug-in's metric registered for the track is computed here too."""
    from ...metrics.mia import auc
    from ...metrics.registry import metric, metric_function, metrics_for

    out: dict[str, float] = {}
    for name in metrics_for(track):
        kind = metric(name).aggregate
        if kind not in ("auc", "mean"):
            continue
        fn = metric_function(name, track)
        m = np.asarray(fn(*members), dtype=np.float64)
        out[name] = (
            auc(m.tolist(), np.asarray(fn(*nonmembers), dtype=np.float64).tolist())
            if kind == "auc"
            else float(m.mean())
        )
    return out


def loss_attack_auc(member_losses: Sequence[float], nonmember_losses: Sequence[float]) -> float:
    """ROC AUC of the LOSS attack: member scores ``−ℓ`` (label 1) against non-member scores ``−ℓ``
    (label 0), ties counting ½ (:func:`qrerase.metrics.mia.auc`). Both non-empty and finite."""
    from ...metrics.mia import auc

    return auc([-float(x) for x in member_losses], [-float(x) for x in nonmember_losses])
