"""Speech track model: a speaker classifier of any declared speech architecture (paper §4.3).

:func:`build_tiny_hubert` (a small ``HubertForSequenceClassification`` trained here from scratch, the
embedded default's "fine-tuned model") or :func:`load_speech_model` (a local / cached checkpoint such
as ``facebook/hubert-xlarge-ll60k``, a wav2vec 2.0 one, or Qwen3-Omni's audio encoder; a new
classification head when it has none; the families: :mod:`qrerase.tracks.speech.architectures`);
:func:`graft_encoder` copies a pretrained encoder into it. Training and evaluation are
:mod:`qrerase.tracks.speech.train`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...bench.phases import cpu_phase
from ...config import model_options

__all__ = [
    "TinyHubertConfig",
    "build_tiny_hubert",
    "load_speech_model",
    "save_speech_model",
    "load_pretrained",
    "graft_encoder",
    "HEAD_KEYS",
    "SPEC_AUGMENT_KEY",
]

#: The speaker head of ``HubertForSequenceClassification`` (new, seeded, when loading with ``speakers``).
HEAD_KEYS = (r"^projector\.", r"^classifier\.")
#: SpecAugment's learned mask vector (unused: SpecAugment is switched off on loading).
SPEC_AUGMENT_KEY = r"(^|\.)masked_spec_embed$"


@dataclass
class TinyHubertConfig:
    """Dimensions of the small HuBERT-architecture speaker classifier trained from scratch.

    A 4-layer convolutional feature encoder (strides 5·4·4·4 = 320 samples = 20 ms per frame at
    16 kHz, as in HuBERT) with group norm on the first layer (HuBERT-base's ``feat_extract_norm``),
    a post-norm transformer encoder and mean pooling over frames.
    """

    hidden_size: int = 64
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    intermediate_size: int = 128
    conv_dim: tuple[int, ...] = (32, 64, 64, 64)
    conv_stride: tuple[int, ...] = (5, 4, 4, 4)
    conv_kernel: tuple[int, ...] = (10, 8, 4, 4)
    num_conv_pos_embeddings: int = 16
    num_conv_pos_embedding_groups: int = 4
    classifier_proj_size: int = 64
    hidden_dropout: float = 0.1
    feat_extract_norm: str = "group"
    do_stable_layer_norm: bool = False

    def __post_init__(self):
        self.conv_dim, self.conv_stride, self.conv_kernel = (
            tuple(self.conv_dim),
            tuple(self.conv_stride),
            tuple(self.conv_kernel),
        )
        if not len(self.conv_dim) == len(self.conv_stride) == len(self.conv_kernel):
            raise ValueError("speech.model.tiny: conv_dim, conv_stride and conv_kernel must have the same length")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("speech.model.tiny.hidden_size: must be divisible by num_attention_heads")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> TinyHubertConfig:
        from ...config import from_mapping

        return from_mapping(cls, d, "speech.model.tiny")


def _label_maps(speakers: Sequence[str]) -> dict:
    return {"id2label": {i: s for i, s in enumerate(speakers)}, "label2id": {s: i for i, s in enumerate(speakers)}}


def build_tiny_hubert(cfg: TinyHubertConfig, speakers: Sequence[str], seed: int):
    """A freshly initialised ``HubertForSequenceClassification`` (one label per speaker), eval mode.

    Initialised under ``torch.manual_seed(seed)`` in a forked RNG (reproducible, caller's RNG untouched).
    SpecAugment and layer drop are off (deterministic, tiny data).
    """
    import torch
    from transformers import HubertConfig, HubertForSequenceClassification

    config = HubertConfig(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        conv_dim=list(cfg.conv_dim),
        conv_stride=list(cfg.conv_stride),
        conv_kernel=list(cfg.conv_kernel),
        num_conv_pos_embeddings=cfg.num_conv_pos_embeddings,
        num_conv_pos_embedding_groups=cfg.num_conv_pos_embedding_groups,
        classifier_proj_size=cfg.classifier_proj_size,
        feat_extract_norm=cfg.feat_extract_norm,
        do_stable_layer_norm=cfg.do_stable_layer_norm,
        hidden_dropout=cfg.hidden_dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        feat_proj_dropout=0.0,
        final_dropout=0.0,
        layerdrop=0.0,
        apply_spec_augment=False,
        num_labels=len(speakers),
        **_label_maps(speakers),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = HubertForSequenceClassification(config)
    return model.eval()


@cpu_phase("load")
def load_speech_model(
    name_or_path: str | os.PathLike,
    speakers: Sequence[str] | None = None,
    dtype: str = "float32",
    local_files_only: bool = True,
    device: str = "cpu",
    seed: int = 0,
):
    """The speaker classifier of a checkpoint, by its architecture family
    (:func:`qrerase.tracks.speech.architectures.architecture_of_dir`), in eval mode.

    ``audio-classification`` families (HuBERT, e.g. ``facebook/hubert-xlarge-ll60k`` from the local
    cache; wav2vec 2.0, WavLM, Data2Vec-audio): ``AutoModelForAudioClassification.from_pretrained``.
    With ``speakers`` the classification head is sized to them (a new, seeded head where the checkpoint
    has none or another label set); without, the checkpoint's own head is used (a fine-tuned model).
    SpecAugment and layer drop are switched off. Qwen3-Omni: a released checkpoint's audio encoder
    (:func:`qrerase.tracks.speech.qwen3_omni.load_audio_tower`, a new seeded head) or a classifier saved here.
    A path that holds no model, or whose weights do not match its ``config.json``
    (:func:`qrerase.models.checkpoints.check_loading_info`): one-line ValueError. Allowed: the new head's
    ``projector`` / ``classifier`` weights with ``speakers`` (missing, or of another shape), and a
    missing ``masked_spec_embed`` (SpecAugment's mask vector; SpecAugment is off).
    """
    import torch
    from transformers import AutoModelForAudioClassification

    from ...engine.placement import resolve_device
    from ...models.checkpoints import DTYPES, check_loading_info, first_line, resolve_checkpoint
    from .architectures import architecture_of_dir

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    where = resolve_checkpoint(name_or_path, local_files_only, ("config.json",), "speech model")
    arch = architecture_of_dir(where)
    released = json.loads((Path(where) / "config.json").read_text()).get("model_type") == "qwen3_omni_moe"
    if released:  # a released Qwen3-Omni checkpoint: its audio encoder only
        from .qwen3_omni import load_audio_tower

        model = load_audio_tower(where, speakers, seed=seed, dtype=DTYPES[dtype], source_name=str(name_or_path))
        return model.to(resolve_device(device)).eval()
    if arch.loader == "qwen3-omni":
        from .qwen3_omni import Qwen3OmniSpeakerClassifier as cls

        kwargs: dict[str, Any] = {}
    else:
        cls, kwargs = AutoModelForAudioClassification, {"apply_spec_augment": False, "layerdrop": 0.0}
    if speakers is not None:
        kwargs.update(num_labels=len(speakers), **_label_maps(speakers))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model, info = cls.from_pretrained(
                where,
                dtype=DTYPES[dtype],
                local_files_only=local_files_only,
                ignore_mismatched_sizes=speakers is not None,
                output_loading_info=True,
                use_safetensors=True,  # never unpickle
                **kwargs,
            )
    except Exception as exc:
        raise ValueError(f"{name_or_path}: cannot load a {arch.name} speech model ({first_line(exc)})") from exc
    head = HEAD_KEYS if speakers is not None else ()
    check_loading_info(
        name_or_path, info, allow_missing=(*head, SPEC_AUGMENT_KEY), allow_unexpected=(), allow_mismatched=head
    )
    return model.to(resolve_device(device)).eval()


def load_pretrained(
    model_cfg: Mapping[str, Any],
    checkpoint: str | os.PathLike | None = None,
    speakers: Sequence[str] | None = None,
    seed: int = 0,
):
    """The pretrained speech model: ``checkpoint`` (the digit-pretrained encoder built here) when given,
    else the configured ``model_cfg['name_or_path']`` (a hub / local speech checkpoint, honouring its
    ``local_files_only``, ``dtype`` and ``device``). With ``speakers``: a new seeded speaker head."""
    if checkpoint is None and not model_cfg.get("name_or_path"):
        raise ValueError(
            "speech.model.name_or_path: no pretrained checkpoint (the embedded model needs speech_pretrain)"
        )
    source = checkpoint if checkpoint is not None else model_cfg["name_or_path"]
    dtype, device = model_options(model_cfg)
    return load_speech_model(
        source,
        speakers,
        dtype=dtype,
        local_files_only=checkpoint is not None or model_cfg.get("local_files_only", True),
        device=device,
        seed=seed,
    )


def save_speech_model(model, out_dir: str | os.PathLike) -> None:
    """``save_pretrained`` (safetensors) atomically; a PEFT-wrapped model is merged first."""
    from ...models.checkpoints import save_model

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    save_model(model, None, out_dir)


def graft_encoder(model, encoder_source, prefix: str | None = None):
    """Replace ``model``'s encoder (every parameter and buffer under ``prefix``; None: its architecture's
    ``classifier_encoder``, e.g. ``hubert.`` or ``audio_tower.``) by ``encoder_source``'s, in place,
    keeping ``model``'s own head (projector, classifier). Returns ``model``.

    The forget / retain task adapters of ``speech.lora.base: pretrained`` train on the pretrained
    encoder carrying the fine-tuned speaker head. ValueError when the two encoders differ in a
    tensor's name or shape (not the same architecture).
    """
    import torch

    if prefix is None:
        from .architectures import architecture_for

        prefix = architecture_for(model.config.to_dict(), "graft_encoder").classifier_encoder
    own = {k: v for k, v in model.state_dict().items() if k.startswith(prefix)}
    new = {k: v for k, v in encoder_source.state_dict().items() if k.startswith(prefix)}
    if not own:
        raise ValueError(f"graft_encoder: the model has no tensors under {prefix!r}")
    if set(own) != set(new):
        diff = sorted(set(own) ^ set(new))
        raise ValueError(f"graft_encoder: encoders differ in tensors {diff[:3]}")
    bad = [k for k in own if tuple(own[k].shape) != tuple(new[k].shape)]
    if bad:
        raise ValueError(
            f"graft_encoder: {bad[0]} is {tuple(new[bad[0]].shape)} in the source, "
            f"{tuple(own[bad[0]].shape)} in the model"
        )
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(new[k].to(device=v.device, dtype=v.dtype))
    return model
