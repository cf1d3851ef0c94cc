"""Speech model architectures: each family's declaration, and the planning-time checks of a checkpoint.

``speech.model.name_or_path`` names a checkpoint; its ``config.json`` ``model_type`` picks a
:class:`SpeechArchitecture` (:func:`architecture_for`). A declaration says, once for its family:

* ``loader``: ``audio-classification`` (the stock ``AutoModelForAudioClassification``, a new seeded
  speaker head) or ``qwen3-omni`` (:mod:`qrerase.tracks.speech.qwen3_omni`: the audio encoder taken out of
  the multimodal checkpoint, a pooled linear speaker head);
* ``input``: ``waveform`` (the normalised 16 kHz samples of :mod:`qrerase.tracks.speech.data`) or ``log-mel``
  (the checkpoint's own feature extractor, ``preprocessor_config.json``, applied in the model's forward);
* ``encoder``: where the encoder's tensors sit in the pretrained checkpoint, and ``classifier_encoder``
  where they sit in the speaker classifier the workflow saves (what ``speech.lora.base: pretrained`` grafts);
* ``lora_targets`` (``speech.lora.target_modules: auto``) and ``layers``: the module list whose index
  is a layer of the energy and LL selection (:func:`qrerase.method.module_names.block_of`);
* ``shape``: the memory plan's :class:`~qrerase.workflow.shapes.ModelShape` from the ``config.json``.

The next architecture is one more entry of :data:`ARCHITECTURES` (and a test that runs it). Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...workflow.shapes import ModelShape, shape_from_hf_config

__all__ = [
    "SpeechArchitecture",
    "ARCHITECTURES",
    "KNOWN_SPEECH_SHAPES",
    "architecture_for",
    "architecture_of_dir",
    "qwen3_omni_audio_config",
    "qwen3_omni_audio_params",
    "check_speech_checkpoint",
    "speech_lora_targets",
]

ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")


def _waveform_shape(cfg: Mapping[str, Any], name: str) -> ModelShape:
    """A wav2vec 2.0-style encoder: the transformer's dims, no vocabulary, fc1/fc2 MLP, one position per
    ``prod(conv_stride)`` samples at 16 kHz (50 per second for HuBERT / wav2vec 2.0 / WavLM)."""
    stride = 1
    for s in cfg.get("conv_stride") or (5, 2, 2, 2, 2, 2, 2):
        stride *= int(s)
    return replace(shape_from_hf_config(cfg, name), vocab=0, gated_mlp=False, frames_per_second=max(1, 16000 // stride))


def qwen3_omni_audio_config(cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The audio encoder's config of a Qwen3-Omni ``config.json`` (``thinker_config.audio_config``), or the
    flat config of the speaker classifier saved here; None when it has none."""
    if cfg.get("model_type") == "qwen3_omni_moe":
        audio = (cfg.get("thinker_config") or {}).get("audio_config")
        return audio if isinstance(audio, Mapping) and audio else None
    return cfg


def qwen3_omni_audio_params(audio: Mapping[str, Any]) -> int:
    """Parameters of ``Qwen3OmniMoeAudioEncoder`` from its config (transformers' defaults where a key is
    absent): three 3x3 stride-2 convolutions, the ``conv_out`` projection, ``encoder_layers`` pre-norm
    layers (q/k/v/out, fc1/fc2, two layer norms), ``ln_post``, ``proj1`` and ``proj2``."""
    mel, ds = int(audio.get("num_mel_bins", 128)), int(audio.get("downsample_hidden_size", 480))
    d, ffn = int(audio.get("d_model", 1280)), int(audio.get("encoder_ffn_dim", 5120))
    out, layers = int(audio.get("output_dim", 3584)), int(audio.get("encoder_layers", 32))
    freq = (((mel + 1) // 2 + 1) // 2 + 1) // 2
    convs = (9 * ds + ds) + 2 * (9 * ds * ds + ds) + ds * freq * d
    layer = 4 * (d * d + d) + 2 * d + (d * ffn + ffn) + (ffn * d + d) + 2 * d
    return convs + layers * layer + 2 * d + (d * d + d) + (d * out + out)


def _qwen3_omni_shape(cfg: Mapping[str, Any], name: str) -> ModelShape:
    """The audio encoder alone (the thinker's language model is never loaded): 13 positions per
    second (100 mel frames per second, 8x down-sampled in windows of ``2 n_window`` frames)."""
    audio = qwen3_omni_audio_config(cfg) or {}
    d, heads = int(audio.get("d_model", 1280)), int(audio.get("encoder_attention_heads", 20))
    return ModelShape(
        f"{name} (audio encoder)",
        int(audio.get("encoder_layers", 32)),
        d,
        int(audio.get("encoder_ffn_dim", 5120)),
        0,
        heads,
        heads,
        gated_mlp=False,
        frames_per_second=13,
        params=qwen3_omni_audio_params(audio),
    )


@dataclass(frozen=True)
class SpeechArchitecture:
    """One speech architecture family (see the module docstring)."""

    name: str
    model_types: tuple[str, ...]  # config.json model_type of its pretrained checkpoints and saved classifiers
    loader: str  # "audio-classification" | "qwen3-omni"
    input: str  # "waveform" | "log-mel"
    encoder: str  # prefix of the encoder's tensors in the pretrained checkpoint
    classifier_encoder: str  # prefix of the encoder's tensors in the speaker classifier
    lora_targets: tuple[str, ...]
    layers: str  # module list whose index is a layer: "<layers>.<i>."
    shape: Callable[[Mapping[str, Any], str], ModelShape]


def _stock(name: str, model_type: str, base: str, layers: str) -> SpeechArchitecture:
    return SpeechArchitecture(
        name, (model_type,), "audio-classification", "waveform", base, base, ATTENTION, layers, _waveform_shape
    )


#: The declared families, by name.
ARCHITECTURES: dict[str, SpeechArchitecture] = {
    a.name: a
    for a in (
        _stock("hubert", "hubert", "hubert.", "hubert.encoder.layers"),
        _stock("wav2vec2", "wav2vec2", "wav2vec2.", "wav2vec2.encoder.layers"),
        _stock("wavlm", "wavlm", "wavlm.", "wavlm.encoder.layers"),
        _stock("data2vec-audio", "data2vec-audio", "data2vec_audio.", "data2vec_audio.encoder.layers"),
        SpeechArchitecture(
            "qwen3-omni",
            ("qwen3_omni_moe", "qrerase_qwen3_omni_speaker"),
            "qwen3-omni",
            "log-mel",
            "thinker.audio_tower.",
            "audio_tower.",
            ATTENTION,
            "audio_tower.layers",
            _qwen3_omni_shape,
        ),
    )
}

#: Hub checkpoints planned without a local config.json: (family, shape of what the track loads).
KNOWN_SPEECH_SHAPES: dict[str, tuple[str, ModelShape]] = {
    name: ("qwen3-omni", _qwen3_omni_shape({"model_type": "x", "output_dim": 2048}, name))
    for name in ("Qwen/Qwen3-Omni-30B-A3B-Instruct", "Qwen/Qwen3-Omni-30B-A3B-Thinking")
}


def architecture_for(cfg: Mapping[str, Any], where: str) -> SpeechArchitecture:
    """The family of a ``config.json`` dict; a one-line ValueError naming ``where`` for a checkpoint
    with no audio encoder (an unknown ``model_type``, or a Qwen3-Omni config without ``audio_config``)."""
    model_type = cfg.get("model_type")
    for arch in ARCHITECTURES.values():
        if model_type in arch.model_types:
            if arch.loader == "qwen3-omni" and qwen3_omni_audio_config(cfg) is None:
                raise ValueError(
                    f"{where}: model_type {model_type!r} without thinker_config.audio_config: no audio encoder"
                )
            return arch
    known = ", ".join(t for a in ARCHITECTURES.values() for t in a.model_types[:1])
    raise ValueError(
        f"{where}: model_type {model_type!r} has no audio encoder the speech track knows (model types: {known})"
    )


def architecture_of_dir(path: str | Path) -> SpeechArchitecture:
    """:func:`architecture_for` of a checkpoint directory's ``config.json``."""
    cfg_file = Path(path) / "config.json"
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{cfg_file}: not readable JSON ({exc})") from None
    return architecture_for(cfg, str(cfg_file))


def _linear_kinds(shapes: Mapping[str, Sequence[int]], prefix: str) -> list[str]:
    """Module names (under ``prefix``) of the 2-D ``.weight`` tensors: the linear layers."""
    return [
        k[: -len(".weight")]
        for k, s in shapes.items()
        if k.startswith(prefix) and k.endswith(".weight") and len(s) == 2
    ]


def _encoder_shapes(p: Path, prefix: str) -> tuple[dict[str, list[int]], Path] | None:
    """(name -> shape, weights file) of the ``prefix`` tensors, from the safetensors headers of only the
    shards the index names for them (the others may be absent: the loader never opens them); all of a
    single ``model.safetensors``; None for other weights."""
    from ...models.checkpoint_files import header_shapes, safetensors_shapes, weight_map

    index = p / "model.safetensors.index.json"
    if not index.is_file():
        return safetensors_shapes(p)
    try:
        tensors, _ = weight_map(p)
    except ValueError as exc:
        raise ValueError(f"config key 'speech.model.name_or_path': {exc}") from None
    shapes: dict[str, list[int]] = {}
    for shard in sorted({v for k, v in tensors.items() if k.startswith(prefix)}):
        if not (p / shard).is_file():
            raise ValueError(f"config key 'speech.model.name_or_path': {index}: shard {shard} not found")
        shapes.update({k: v for k, v in header_shapes(p / shard).items() if tensors.get(k) == shard})
    return shapes, index


def check_speech_checkpoint(path: str | Path, sample_rate: int, targets: str | Sequence[str]) -> SpeechArchitecture:
    """Planning-time checks of a local speech checkpoint (headers and JSON only, no tensor read), each a
    one-line ValueError naming its config key and file:

    * ``speech.model.name_or_path``: a family is declared for its ``model_type``, and the weights hold
      encoder tensors (for Qwen3-Omni: ``thinker.audio_tower.*`` in the safetensors index);
    * ``speech.data.sample_rate``: equals the ``sampling_rate`` of its ``preprocessor_config.json``;
    * ``speech.lora.target_modules``: every target (the family's preset for ``auto``) names a linear
      layer of the encoder.
    """
    p = Path(path).expanduser()
    try:
        arch = architecture_of_dir(p)
    except ValueError as exc:
        raise ValueError(f"config key 'speech.model.name_or_path': {exc}") from None
    found = _encoder_shapes(p, arch.encoder)
    if found is not None:
        shapes, weights = found
        if not any(k.startswith(arch.encoder) for k in shapes):
            raise ValueError(
                f"config key 'speech.model.name_or_path': {weights} holds no {arch.encoder}* tensors (no audio encoder)"
            )
        chosen = list(arch.lora_targets) if targets == "auto" else list(targets)
        linear = _linear_kinds(shapes, arch.encoder)
        for t in chosen:
            if not any(n == t or n.endswith("." + t) for n in linear):
                kinds = ", ".join(sorted({n.rsplit(".", 1)[-1] for n in linear}))
                raise ValueError(
                    f"config key 'speech.lora.target_modules': {t!r} matches no linear layer of the "
                    f"{arch.name} encoder in {weights} (its linear layers: {kinds})"
                )
    pre = p / "preprocessor_config.json"
    if pre.is_file():
        try:
            rate = json.loads(pre.read_text()).get("sampling_rate")
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"config key 'speech.model.name_or_path': {pre}: not readable JSON ({exc})") from None
        if rate is not None and int(rate) != int(sample_rate):
            raise ValueError(
                f"config key 'speech.data.sample_rate': {sample_rate} Hz, but the feature extractor {pre} "
                f"expects {rate} Hz"
            )
    elif arch.input == "log-mel":
        raise ValueError(
            f"config key 'speech.model.name_or_path': {p} has no preprocessor_config.json "
            "(its log-mel feature extractor)"
        )
    return arch


def speech_lora_targets(model_config: Mapping[str, Any], targets: str | Sequence[str]) -> list[str]:
    """``speech.lora.target_modules`` for a speaker classifier of config ``model_config``: its family's
    ``lora_targets`` for ``auto``, else the list given (checked against the model by
    :func:`qrerase.method.architectures.resolve_target_modules`)."""
    if targets == "auto":
        return list(architecture_for(model_config, "speech.lora.target_modules").lora_targets)
    return list(targets)
