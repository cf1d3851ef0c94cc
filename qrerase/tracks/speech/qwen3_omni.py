"""Qwen3-Omni's audio encoder as a speaker classifier (paper §4.3, the speech table's second model).

:class:`Qwen3OmniSpeakerClassifier`: transformers' ``Qwen3OmniMoeAudioEncoder`` (Whisper-style: log-mel
input, three stride-2 convolutions, pre-norm transformer layers with ``q_proj`` / ``k_proj`` / ``v_proj``
/ ``out_proj``, ``proj1`` / ``proj2`` to the thinker's width) under ``audio_tower``, mean pooling over
each clip's encoder positions and a linear speaker head ``classifier``. Its forward takes the waveforms
of :mod:`qrerase.tracks.speech.data` and makes the log-mel input with the checkpoint's ``WhisperFeatureExtractor``
(its settings are kept in the classifier's config).

:func:`load_audio_tower` builds it from a released Qwen3-Omni checkpoint: it reads the safetensors
index and loads only the ``thinker.audio_tower.*`` tensors, shard by shard (shards without them are
never opened; the thinker's language model is never read). The classifier's ``config.source`` names the
checkpoint, the shards opened and the tensors taken; it is saved with the model's ``config.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import Qwen3OmniMoeAudioEncoderConfig
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeAudioEncoder,
    Qwen3OmniMoePreTrainedModel,
    _get_feat_extract_output_lengths,
)

__all__ = ["Qwen3OmniSpeakerConfig", "Qwen3OmniSpeakerClassifier", "audio_tower_plan", "load_audio_tower"]

PREFIX = "thinker.audio_tower."


@strict
class Qwen3OmniSpeakerConfig(Qwen3OmniMoeAudioEncoderConfig):
    """The audio encoder's config plus ``feature_extractor`` (the ``WhisperFeatureExtractor`` settings of
    the source checkpoint's ``preprocessor_config.json``) and ``source`` (where the encoder came from)."""

    model_type = "qrerase_qwen3_omni_speaker"
    feature_extractor: dict | None = None
    source: dict | None = None


class Qwen3OmniSpeakerClassifier(Qwen3OmniMoePreTrainedModel):
    """``audio_tower`` (Qwen3-Omni's audio encoder) + mean pooling + ``classifier`` (Linear
    ``output_dim`` → ``num_labels``)."""

    config_class = Qwen3OmniSpeakerConfig
    config: Qwen3OmniSpeakerConfig
    base_model_prefix = "qwen3_omni_speaker"
    main_input_name = "input_values"
    _no_split_modules = ["Qwen3OmniMoeAudioEncoderLayer"]

    def __init__(self, config: Qwen3OmniSpeakerConfig):
        super().__init__(config)
        self.audio_tower = Qwen3OmniMoeAudioEncoder(config)
        self.classifier = nn.Linear(config.output_dim, config.num_labels)
        self._extractor = None
        self.post_init()

    def freeze_feature_encoder(self) -> None:
        """Freeze the convolutional front end (``conv2d1-3``, ``conv_out``), as for HuBERT's feature encoder."""
        for name in ("conv2d1", "conv2d2", "conv2d3", "conv_out"):
            for p in getattr(self.audio_tower, name).parameters():
                p.requires_grad = False

    def feature_extractor(self):
        """The ``WhisperFeatureExtractor`` of ``config.feature_extractor`` (built once)."""
        if self._extractor is None:
            from transformers import WhisperFeatureExtractor

            self._extractor = WhisperFeatureExtractor(**(self.config.feature_extractor or {}))
        return self._extractor

    def log_mel(self, input_values: torch.Tensor, attention_mask: torch.Tensor | None):
        """Log-mel features of waveforms ``input_values`` float (N, L) whose real samples ``attention_mask``
        (N, L) marks: ``(features float32 (n_mels, T_total), frames int64 (N,))``, the clips' frames
        concatenated along time as the encoder takes them (no gradient flows into the waveforms)."""
        fe = self.feature_extractor()
        n = [input_values.shape[1]] * len(input_values) if attention_mask is None else attention_mask.sum(1).tolist()
        clips = [x[: int(k)].detach().float().cpu().numpy() for x, k in zip(input_values, n)]
        out = fe(
            clips,
            sampling_rate=fe.sampling_rate,
            padding="longest",
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        feats, mask = out["input_features"], out["attention_mask"].bool()
        frames = mask.sum(1).long()
        return feats.permute(0, 2, 1)[mask].T.contiguous(), frames

    def forward(self, input_values=None, attention_mask=None, labels=None, **kwargs):
        """Speaker logits (N, num_labels) of waveforms (N, L) (``attention_mask`` int (N, L): 1 on real
        samples); with ``labels`` int64 (N,) also the cross-entropy loss."""
        device = self.classifier.weight.device
        feats, frames = self.log_mel(input_values, attention_mask)
        hidden = self.audio_tower(
            feats.to(device=device, dtype=self.classifier.weight.dtype), feature_lens=frames.to(device)
        ).last_hidden_state  # (sum of the clips' positions, output_dim)
        lengths = _get_feat_extract_output_lengths(frames, self.config.n_window).tolist()
        pooled = torch.stack([h.mean(0) for h in hidden.split(lengths, dim=0)])
        logits = self.classifier(pooled)
        loss = nn.functional.cross_entropy(logits, labels.to(device)) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits)


def audio_tower_plan(path: str | os.PathLike, prefix: str = PREFIX) -> dict[str, list[str]]:
    """Shard file → the ``prefix`` tensors it holds, from the checkpoint's ``model.safetensors.index.json``
    (or its single ``model.safetensors`` header); shards without such tensors are left out. A one-line
    ValueError naming the file when there is no index, or it lists no ``prefix`` tensor."""
    from ...models.checkpoint_files import weight_map

    tensors, where = weight_map(path)
    plan: dict[str, list[str]] = {}
    for key, shard in sorted(tensors.items()):
        if key.startswith(prefix):
            plan.setdefault(shard, []).append(key)
    if not plan:
        raise ValueError(f"{where}: holds no {prefix}* tensors (no audio encoder)")
    return plan


def load_audio_tower(
    path: str | os.PathLike,
    speakers: Sequence[str] | None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    source_name: str | None = None,
) -> Qwen3OmniSpeakerClassifier:
    """The speaker classifier of a released Qwen3-Omni checkpoint directory (``config.json`` with
    ``thinker_config.audio_config``, sharded safetensors, ``preprocessor_config.json``), eval mode.

    The classifier is built under ``torch.manual_seed(seed)`` in a forked RNG (its speaker head of
    ``len(speakers)`` labels, 2 without speakers, is new and seeded); then only the tensors of
    :func:`audio_tower_plan` are read, shard by shard, into ``audio_tower``. A missing or unexpected
    encoder tensor, or one of another shape: a one-line ValueError naming the checkpoint.
    """
    from safetensors import safe_open
    from transformers import AutoFeatureExtractor

    from .architectures import qwen3_omni_audio_config

    p = Path(path)
    full = json.loads((p / "config.json").read_text())
    audio = dict(qwen3_omni_audio_config(full) or {})
    if not audio:
        raise ValueError(f"{p / 'config.json'}: no thinker_config.audio_config (no audio encoder)")
    plan = audio_tower_plan(p)
    fe = AutoFeatureExtractor.from_pretrained(str(p), local_files_only=True).to_dict()
    fe = {k: fe[k] for k in ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft") if k in fe}
    if fe.get("feature_size", audio.get("num_mel_bins", 128)) != audio.get("num_mel_bins", 128):
        raise ValueError(
            f"{p / 'preprocessor_config.json'}: feature_size {fe['feature_size']} but the audio encoder "
            f"takes {audio.get('num_mel_bins', 128)} mel bins"
        )
    labels = list(speakers) if speakers is not None else ["0", "1"]
    audio = {k: v for k, v in audio.items() if k in Qwen3OmniMoeAudioEncoderConfig.__annotations__}  # its own keys
    source = {
        "checkpoint": str(source_name or path),
        "prefix": PREFIX,
        "shards": sorted(plan),
        "tensors": sorted(k for keys in plan.values() for k in keys),
    }
    config = Qwen3OmniSpeakerConfig(
        **audio,
        feature_extractor=fe,
        source=source,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={s: i for i, s in enumerate(labels)},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3OmniSpeakerClassifier(config)
    own = model.audio_tower.state_dict()
    taken = set()
    with torch.no_grad():
        for shard in sorted(plan):
            with safe_open(str(p / shard), "pt", device="cpu") as f:
                for key in plan[shard]:
                    name = key[len(PREFIX) :]
                    if name not in own:
                        raise ValueError(
                            f"{p}: tensor {key} has no place in the audio encoder its config.json describes"
                        )
                    t = f.get_tensor(key)
                    if tuple(t.shape) != tuple(own[name].shape):
                        raise ValueError(
                            f"{p}: {key} is {tuple(t.shape)}, the config.json's encoder has {tuple(own[name].shape)}"
                        )
                    own[name].copy_(t)
                    taken.add(name)
    missing = sorted(set(own) - taken)  # state_dict(): the persistent tensors (not the sinusoid table)
    if missing:
        raise ValueError(
            f"{p}: the checkpoint lacks audio-encoder tensors {PREFIX}{missing[0]} ({len(missing)} in all)"
        )
    return model.to(dtype).eval()
