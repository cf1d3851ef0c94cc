"""The text models: byte-level BPE tokenizer, the tiny Llama of the default run, checkpoint loading.

* :func:`train_bpe_tokenizer` and :func:`build_tiny_llama` build the small, fully local model of
  the default run; :func:`load_model` and :func:`load_tokenizer` read Hugging Face checkpoints
  (:func:`qrerase.models.checkpoints.save_model` writes them, atomically, safetensors only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..bench.phases import cpu_phase
from ..config import from_mapping
from ..engine.placement import inference_placement, resolve_device
from ..io import atomic_dir
from ..models.checkpoint_files import refuse_pickle_weights
from ..models.checkpoints import DTYPES, check_loading_info, first_line, resolve_checkpoint

__all__ = [
    "SPECIAL_TOKENS",
    "train_bpe_tokenizer",
    "load_tokenizer",
    "TinyLlamaConfig",
    "build_tiny_llama",
    "load_model",
    "load_start",
    "empty_like_checkpoint",
]

#: Rotary inverse frequencies: a buffer older checkpoints saved, recomputed from the config on load.
ROTARY_BUFFER = r"rotary_emb\.inv_freq$"

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------


def train_bpe_tokenizer(
    texts: Sequence[str], vocab_size: int, out_dir: str | os.PathLike, individual_digits: bool = False
):
    """Train a byte-level BPE tokenizer on ``texts`` and save it (atomically) to ``out_dir``.

    ``individual_digits``: split every digit into its own pre-token (as Llama-2's tokenizer does),
    so numbers are spelled digit by digit and arithmetic can generalise across numbers.

    Special tokens ``<s>`` (BOS, prepended by the post-processor like Llama's), ``</s>`` (EOS),
    ``<pad>`` and ``<unk>`` get ids 0..3. Training is deterministic for given texts and vocab size.
    The result reloads with ``AutoTokenizer.from_pretrained(out_dir)``; the trained tokenizer is
    returned (as a ``PreTrainedTokenizerFast``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [SPECIAL_TOKENS[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token")]
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if individual_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=2,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **SPECIAL_TOKENS)
    fast.model_max_length = 1 << 20
    with atomic_dir(out_dir) as tmp:
        fast.save_pretrained(str(tmp))
    return fast


@cpu_phase("load")
def load_tokenizer(name_or_path: str | os.PathLike, local_files_only: bool = True):
    """``AutoTokenizer.from_pretrained``; the pad token falls back to EOS when missing.

    Raises a one-line ``ValueError`` naming the path when it does not hold a tokenizer.
    """
    from transformers import AutoTokenizer

    where = resolve_checkpoint(name_or_path, local_files_only, ("tokenizer_config.json", "tokenizer.json"), "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(where, local_files_only=local_files_only)
    except Exception as exc:  # transformers raises OSError/ValueError/... depending on the failure
        raise ValueError(f"{name_or_path}: cannot load a tokenizer ({first_line(exc)})") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


@dataclass
class TinyLlamaConfig:
    """Dimensions of the small Llama-architecture model built from scratch for the default run.

    The defaults (1.56 M parameters with a 3000-token vocabulary) were tuned on 617 TOFU + knowledge
    QA on 2 CPU threads: with ``TrainConfig(epochs=20, lr=2e-3, batch_size=16, warmup_ratio=0.05)``
    they memorise the training answers (answer loss ~0.05) in about a minute. Untied embeddings and
    few layers memorise markedly faster than tied / deeper models of the same cost.
    """

    hidden_size: int = 128
    intermediate_size: int = 512
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = False
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> TinyLlamaConfig:
        return from_mapping(cls, d, "tiny llama config")


def build_tiny_llama(cfg: TinyLlamaConfig, tokenizer, seed: int):
    """A freshly initialised ``LlamaForCausalLM`` (vocabulary and special ids from ``tokenizer``).

    Initialisation uses ``torch.manual_seed(seed)`` inside a forked RNG, so it is reproducible and
    does not disturb the caller's global RNG state. The model is returned in eval mode.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        initializer_range=cfg.initializer_range,
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
        attention_dropout=0.0,
    )
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id, pad
    return model.eval()


@cpu_phase("load")
def load_model(
    name_or_path: str | os.PathLike,
    dtype: str = "float32",
    local_files_only: bool = True,
    device: str = "cpu",
    spread: bool = False,
    sharded: bool = False,
):
    """``AutoModelForCausalLM.from_pretrained`` in ``dtype``, in eval mode.

    ``spread`` (inference: evaluation, generation, LoRA forward passes): with ``device`` ``auto`` /
    ``cuda`` and several visible GPUs the model is placed across them with ``device_map="auto"`` and
    ``max_memory`` (:func:`qrerase.engine.placement.inference_placement`); otherwise it is loaded whole and
    moved to ``device`` (:func:`qrerase.engine.placement.resolve_device`: in a launched worker, its own
    GPU ``cuda:LOCAL_RANK``).

    ``sharded`` (a model the engine will train with FSDP2 over several processes,
    :func:`qrerase.engine.sharded`): the model stays on the CPU and only global rank 0 reads the
    weight files; every other rank builds the same architecture from ``config.json`` with
    uninitialised storage (:func:`empty_like_checkpoint`). The engine's FSDP2 preparation
    (Accelerate's ``cpu_ram_efficient_loading``) then shards the model onto each rank's device and
    broadcasts rank 0's weights tensor by tensor, so no GPU ever holds the whole model.

    ``local_files_only=False`` lets online users load hub ids. A path that does not hold a model, or whose
    weights do not match its ``config.json`` (missing, unexpected or reshaped weights:
    :func:`qrerase.models.checkpoints.check_loading_info`; the rotary ``inv_freq`` buffers some older
    checkpoints store are recomputed from the config and allowed), gives a one-line ``ValueError``
    naming it.
    """
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    where = resolve_checkpoint(name_or_path, local_files_only, ("config.json", "adapter_config.json"), "model")
    refuse_pickle_weights(where)
    if sharded and spread:
        raise ValueError(f"{name_or_path}: a model is loaded either sharded (training) or spread (inference)")
    if sharded and _global_rank() != 0:
        return empty_like_checkpoint(name_or_path, where, dtype, local_files_only)
    placement = inference_placement(device) if spread else {}
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            where,
            dtype=DTYPES[dtype],
            local_files_only=local_files_only,
            output_loading_info=True,
            use_safetensors=True,  # never unpickle: a folder with pickle weights only fails here
            **placement,
        )
    except Exception as exc:
        raise ValueError(f"{name_or_path}: cannot load a causal LM ({first_line(exc)})") from exc
    check_loading_info(name_or_path, info, allow_unexpected=(ROTARY_BUFFER,))
    _pad_generation(model)
    if placement or sharded:  # dispatched across the GPUs by Accelerate's hooks / sharded by the engine
        return model.eval()
    return model.to(resolve_device(device)).eval()


def load_start(
    inputs: Mapping[str, str], model_cfg: Mapping[str, Any], seed: int, dtype: str, device: str, sharded: bool
):
    """The model and tokenizer a training job starts from (rule ``finetune``'s inputs, which rule
    ``memorisation_probe`` shares; rule ``pretrain`` gives the tokenizer): a new tiny Llama on the run's
    tokenizer (``inputs["tokenizer"]``: pretraining, the task-level track), the pretrained checkpoint
    (``inputs["init"]``: the embedded model's, or an imported GGUF), else the hub / local model
    ``model_cfg["name_or_path"]``. ``sharded``: see :func:`load_model`. Returns ``(model, tokenizer)``."""
    from ..engine.placement import resolve_device

    if "tokenizer" in inputs:
        tokenizer = load_tokenizer(inputs["tokenizer"])
        model = build_tiny_llama(TinyLlamaConfig(**model_cfg["tiny"]), tokenizer, seed=seed)
        return model.to(resolve_device(device)), tokenizer
    if "init" in inputs:
        tokenizer = load_tokenizer(inputs["init"])
        return load_model(inputs["init"], dtype=dtype, device=device, sharded=sharded), tokenizer
    local = model_cfg.get("local_files_only", True)
    tokenizer = load_tokenizer(model_cfg["name_or_path"], local_files_only=local)
    model = load_model(model_cfg["name_or_path"], dtype=dtype, local_files_only=local, device=device, sharded=sharded)
    return model, tokenizer


def _global_rank() -> int:
    from ..workflow.launch import rank

    return rank()


def _pad_generation(model) -> None:
    """Generation pads with EOS when the checkpoint names no pad token."""
    if model.generation_config.pad_token_id is None and model.config.eos_token_id is not None:
        eos = model.config.eos_token_id
        model.generation_config.pad_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos


def empty_like_checkpoint(name_or_path, where: str, dtype: str, local_files_only: bool = True):
    """The causal LM of checkpoint ``where`` (a resolved directory or hub id) in ``dtype`` on the CPU,
    without reading its weight files: its parameters have uninitialised storage, its buffers are
    computed from ``config.json`` (e.g. the rotary frequencies) and tied weights are tied.

    Built under Accelerate's ``init_empty_weights(include_buffers=False)`` (parameters on the meta
    device, no initialisation), then given real, untouched CPU storage (``to_empty``): each parameter
    has its own address, which Accelerate's FSDP2 preparation needs to map the optimiser onto the
    shards, and the pages are not resident until written. The non-zero ranks of a sharded load
    (:func:`load_model`) use it; the engine overwrites every parameter with rank 0's values.
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(where, local_files_only=local_files_only)
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype])
    except Exception as exc:
        raise ValueError(f"{name_or_path}: cannot build a causal LM from its config ({first_line(exc)})") from exc
    buffers = dict(model.named_buffers())
    model.to_empty(device="cpu")
    for name, value in buffers.items():  # to_empty leaves buffers uninitialised too: put the computed ones back
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = value
    model.tie_weights()
    try:
        model.generation_config = GenerationConfig.from_pretrained(where, local_files_only=local_files_only)
    except OSError:  # no generation_config.json: the one from_pretrained derives from the config
        pass
    _pad_generation(model)
    return model.eval()
