"""Tiny random-weight checkpoints of real transformers classes, saved offline with a tokenizer built here.

Used by tests/unit/test_architectures.py (library) and tests/workflow/test_architectures_workflow.py (snakemake CLI).
"""

from __future__ import annotations

import json
from pathlib import Path

from support import REPO

# Llama-3-instruct's chat template (as published in Meta-Llama-3-8B-Instruct's tokenizer_config.json,
# with this tokenizer's <s> as bos_token) and Llama-2-chat's single-turn form ([INST] ... [/INST]).
LLAMA3_CHAT = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA2_CHAT = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + message['content'].strip() + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)

# Causal LMs: (class name, config class name, config kwargs); dims cut down to a few thousand weights.
_SMALL = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256
)
CAUSAL = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(_SMALL, num_key_value_heads=2)),
    "mixtral": (
        "MixtralForCausalLM",
        "MixtralConfig",
        dict(_SMALL, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1),
    ),
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(_SMALL, num_key_value_heads=2)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(_SMALL, num_key_value_heads=2)),
    "phi": ("PhiForCausalLM", "PhiConfig", dict(_SMALL, partial_rotary_factor=0.5)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=256)),
}


def build_tokenizer(out_dir: Path, vocab_size: int = 400):
    """A byte-level BPE tokenizer (``tokenizer.json``) trained here on TOFU questions and answers."""
    from qrerase.io import read_jsonl
    from qrerase.text.lm import qa_pair
    from qrerase.text.models import train_bpe_tokenizer

    texts = [t for r in read_jsonl(REPO / "data/tofu/forget10.jsonl") for t in qa_pair(r)]
    return train_bpe_tokenizer(texts, vocab_size, out_dir)


def build_causal(arch: str, tokenizer, seed: int = 0, dtype=None):
    """A randomly initialised model of architecture ``arch`` (a key of :data:`CAUSAL`), eval mode."""
    import torch
    import transformers

    cls_name, cfg_name, kwargs = CAUSAL[arch]
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    config = getattr(transformers, cfg_name)(vocab_size=len(tokenizer), **kwargs, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, cls_name)(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def save_causal(arch: str, tokenizer, out_dir: Path, chat_template: str | None = None) -> Path:
    """Save a tiny ``arch`` checkpoint (safetensors) with the tokenizer (and a chat template) to ``out_dir``."""
    model = build_causal(arch, tokenizer)
    model.save_pretrained(str(out_dir))
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(out_dir))
    tokenizer.chat_template = None
    return out_dir


#: The tiny HuBERT / wav2vec 2.0 encoder of the tests (their configs take the same keys): 2 layers of
#: width 32 behind a 4-layer convolutional front end of stride 320 (50 positions per second at 16 kHz).
TINY_AUDIO_ENCODER = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=[16, 32, 32, 32],
    conv_stride=[5, 4, 4, 4],
    conv_kernel=[10, 8, 4, 4],
    num_conv_pos_embeddings=8,
    num_conv_pos_embedding_groups=2,
    classifier_proj_size=16,
    num_labels=2,
)


#: Speech-track overrides for a run on a tiny speech checkpoint: one setting, one subspace method, one epoch
#: each (the run checks plumbing, not numbers); the erase is results/speech_class/erase/k2/qr_erase_ll.
SMALL_SPEECH = dict(
    speech__lora__target_modules="auto",
    speech__settings=["class"],
    speech__rank_settings=[],
    methods__speech=["qr_erase_ll"],
    speech__finetune={"epochs": 1, "lr": 1.0e-3, "batch_size": 32},
    speech__lora__epochs=1,
)


def save_hubert(out_dir: Path, seed: int = 0) -> Path:
    """A tiny random ``HubertForSequenceClassification`` checkpoint (2 labels; the workflow re-heads it)."""
    import torch
    from transformers import HubertConfig, HubertForSequenceClassification

    config = HubertConfig(**TINY_AUDIO_ENCODER)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        HubertForSequenceClassification(config).save_pretrained(str(out_dir))
    return out_dir


def save_lora(model, out_dir: Path, seed: int, **lora_kwargs) -> Path:
    """Save a PEFT LoRA adapter on ``model`` with random non-zero A and B (``model`` is left unwrapped)."""
    import torch
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(**lora_kwargs))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1)
    peft_model.save_pretrained(str(out_dir))
    peft_model.unload()
    return out_dir


def as_old_peft(adapter_dir: Path) -> Path:
    """Rewrite an adapter's config as PEFT 0.6 saved it (no rsLoRA/DoRA/... keys), plus a key from a
    later version this reader does not know, the way adapters from other PEFT versions arrive."""
    path = adapter_dir / "adapter_config.json"
    cfg = json.loads(path.read_text())
    old_keys = (
        "alpha_pattern",
        "auto_mapping",
        "base_model_name_or_path",
        "bias",
        "fan_in_fan_out",
        "inference_mode",
        "init_lora_weights",
        "layers_pattern",
        "layers_to_transform",
        "lora_alpha",
        "lora_dropout",
        "modules_to_save",
        "peft_type",
        "r",
        "rank_pattern",
        "revision",
        "target_modules",
        "task_type",
    )
    old = {k: cfg.get(k) for k in old_keys}
    if cfg.get("use_rslora"):
        old["use_rslora"] = True  # rsLoRA adapters come from PEFT >= 0.7, which writes the flag
    old["some_future_option"] = None
    path.write_text(json.dumps(old, indent=2))
    return adapter_dir


# Qwen3-Omni at tiny dimensions: every sub-config of the released multimodal config.json (the thinker with
# its audio encoder, vision encoder and MoE language model; the talker with its code predictor; code2wav),
# saved sharded as the released checkpoints are.
QWEN3_OMNI_AUDIO = dict(
    num_mel_bins=32,
    encoder_layers=2,
    encoder_attention_heads=2,
    encoder_ffn_dim=32,
    d_model=16,
    output_dim=24,
    downsample_hidden_size=8,
    max_source_positions=200,
    n_window=50,
    n_window_infer=100,
)
QWEN3_OMNI_TEXT = dict(
    vocab_size=64,
    hidden_size=24,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=12,
    moe_intermediate_size=16,
    num_experts=2,
    num_experts_per_tok=1,
    shared_expert_intermediate_size=16,
)
QWEN3_OMNI_VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=24,
    patch_size=4,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0],
)
QWEN3_OMNI_TALKER = dict(
    text_config=dict(QWEN3_OMNI_TEXT, vocab_size=32),
    code_predictor_config=dict(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_code_groups=2,
    ),
    num_code_groups=2,
    thinker_hidden_size=24,
    accept_hidden_layer=0,
    spatial_merge_size=2,
)
QWEN3_OMNI_CODE2WAV = dict(
    codebook_size=32,
    hidden_size=16,
    num_attention_heads=2,
    num_key_value_heads=2,
    intermediate_size=32,
    num_hidden_layers=1,
    num_quantizers=2,
    decoder_dim=16,
    upsample_rates=[2, 2],
    upsampling_ratios=[2],
    sliding_window=8,
)


def save_qwen3_omni(out_dir: Path, seed: int = 0, sampling_rate: int = 16000, audio: dict | None = None):
    """A tiny random ``Qwen3OmniMoeForConditionalGeneration`` in the released layout: ``config.json``,
    ``model-000ii-of-000nn.safetensors`` shards with ``model.safetensors.index.json`` (the audio tower
    ``thinker.audio_tower.*`` in some shards; the thinker's language model and vision encoder, the talker
    and code2wav in others) and a ``WhisperFeatureExtractor`` ``preprocessor_config.json``. Returns the
    model (eval)."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    audio = {**QWEN3_OMNI_AUDIO, **(audio or {})}
    thinker = dict(audio_config=audio, vision_config=QWEN3_OMNI_VISION, text_config=QWEN3_OMNI_TEXT)
    config = Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=QWEN3_OMNI_TALKER,
        code2wav_config=QWEN3_OMNI_CODE2WAV,
        enable_audio_output=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    model.save_pretrained(str(out_dir), max_shard_size="20KB")
    WhisperFeatureExtractor(feature_size=audio["num_mel_bins"], sampling_rate=sampling_rate).save_pretrained(
        str(out_dir)
    )
    return model


def save_wav2vec2(out_dir: Path, seed: int = 0) -> Path:
    """A tiny random ``Wav2Vec2ForSequenceClassification`` checkpoint with its feature extractor (16 kHz)."""
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

    config = Wav2Vec2Config(**TINY_AUDIO_ENCODER)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        Wav2Vec2ForSequenceClassification(config).save_pretrained(str(out_dir))
    Wav2Vec2FeatureExtractor(sampling_rate=16000).save_pretrained(str(out_dir))
    return out_dir
