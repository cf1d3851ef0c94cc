"""Causal-LM plumbing: prompt template, QA encoding, length-bucketed batching, tokenizer/model I/O.

Everything the trainer (:mod:`qrerase.text.training`) and the TOFU evaluator (:mod:`qrerase.text.evaluation`)
share lives here, so that both see exactly the same token sequences:

* :class:`PromptTemplate` and :func:`encode_qa` fix how a (question, answer) pair becomes tokens.
  The prompt and the answer are tokenised *separately* and concatenated, so the prompt/answer
  boundary is exact; labels are ``-100`` on the prompt, so only answer tokens (plus the EOS that
  closes the answer) count, as in TOFU.
* :func:`bucketed_batches` and :func:`collate` batch examples of similar length (little padding).
* :func:`answer_token_nll` computes per-token NLL on answer positions only (the LM head is applied
  to answer positions only where the architecture allows it); :func:`answer_token_logits` gives the
  logits there, :func:`sequence_nll` / :func:`per_sequence` the per-sequence sums.
* :func:`train_bpe_tokenizer` and :func:`build_tiny_llama` build the small, fully local model of
  the default run; :func:`load_model`, :func:`load_tokenizer` and :func:`save_model` read and write
  Hugging Face checkpoints (atomically, safetensors only).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..io import atomic_dir

__all__ = [
    "PromptTemplate",
    "qa_pair",
    "encode_qa",
    "encode_qa_many",
    "encode_prompts",
    "bucketed_batches",
    "collate",
    "model_device",
    "resolve_device",
    "answer_token_logits",
    "answer_token_nll",
    "per_sequence",
    "sequence_nll",
    "train_bpe_tokenizer",
    "TinyLlamaConfig",
    "build_tiny_llama",
    "load_model",
    "load_tokenizer",
    "save_model",
    "IGNORE_INDEX",
]

IGNORE_INDEX = -100

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def _from_dict(cls, d: Mapping[str, Any] | None, what: str):
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with a clear message."""
    d = dict(d or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    return cls(**d)


# --------------------------------------------------------------------------------------------------
# Prompt template and encoding
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptTemplate:
    """How a question becomes a prompt.

    ``prompt(q) = question_start + q + question_end + answer_start``; the answer text follows the
    prompt after a single space (``" " + answer``) and is closed by the EOS token. The default is a
    plain ``Question: ... / Answer: ...`` format; TOFU's Llama-2 format is
    ``PromptTemplate(question_start="[INST] ", question_end=" [/INST]", answer_start="")``.
    :meth:`from_chat_template` derives the template from a tokenizer's own chat template
    (config ``model.template: chat``).
    """

    question_start: str = "Question: "
    question_end: str = "\n"
    answer_start: str = "Answer:"
    answer_end: str = ""
    answer_separator: str = " "

    def prompt(self, question: str) -> str:
        """The prompt string for ``question`` (everything before the answer)."""
        return f"{self.question_start}{question}{self.question_end}{self.answer_start}"

    def answer_text(self, answer: str) -> str:
        """The answer string as appended after the prompt (``answer_separator``, by default a space,
        then the answer and the ``answer_end`` suffix)."""
        return f"{self.answer_separator}{answer}{self.answer_end}"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "PromptTemplate":
        return _from_dict(cls, d, "prompt template")

    @classmethod
    def from_chat_template(cls, tokenizer) -> "PromptTemplate":
        """The single-turn template of a tokenizer's chat template, as TOFU / open-unlearning use it.

        The prompt is ``apply_chat_template([{"role": "user", "content": question}],
        add_generation_prompt=True)`` (for Llama-2-chat ``<s>[INST] q [/INST]``, for Llama-3-instruct
        ``<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n``),
        split around the question; a leading BOS token text is dropped because :func:`encode_qa`
        prepends the BOS id itself. The answer follows after a space unless the prompt ends in
        whitespace, and is closed by EOS. ValueError naming the tokenizer when it has no chat template.
        """
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ValueError(f"model.template: chat, but tokenizer {name!r} has no chat_template")
        marker = "QRERASEQUESTIONMARKER"
        text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True)
        if text.count(marker) != 1:
            raise ValueError(f"model.template: chat template does not render the question once: {text!r}")
        before, after = text.split(marker)
        bos = getattr(tokenizer, "bos_token", None)
        if bos and before.startswith(bos):
            before = before[len(bos) :]
        return cls(question_start=before, question_end="", answer_start=after, answer_end="",
                   answer_separator="" if after[-1:].isspace() else " ")


def qa_pair(record: Mapping[str, Any]) -> tuple[str, str]:
    """``(question, answer)`` of a record with ``question``/``answer`` (or TOFU's ``prompt``/``response``) keys."""
    for qk, ak in (("question", "answer"), ("prompt", "response")):
        if qk in record and ak in record:
            return str(record[qk]), str(record[ak])
    raise KeyError(f"record has neither question/answer nor prompt/response keys: {sorted(record)}")


def _prefix_ids(tokenizer) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None else []


def _eos_id(tokenizer) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("tokenizer has no EOS token; cannot close answers")
    return int(eos)


def _tok(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
        return []
    return [list(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _assemble(prefix, prompt_ids, answer_ids, eos, max_length):
    prompt_ids = prefix + prompt_ids
    budget = max(max_length - len(prompt_ids) - 1, 0)  # room for answer content, EOS kept always
    answer_ids = answer_ids[:budget] + [eos]
    input_ids = prompt_ids + answer_ids
    labels = [IGNORE_INDEX] * len(prompt_ids) + answer_ids
    return input_ids, labels


def encode_qa(tokenizer, template: PromptTemplate, question: str, answer: str, max_length: int):
    """Tokenise one QA pair: ``(input_ids, labels)`` as lists of ints.

    ``input_ids = [BOS] + tok(prompt) + tok(" " + answer)[:budget] + [EOS]`` (BOS only if the
    tokenizer has one); ``labels`` is ``-100`` on BOS and prompt and equals ``input_ids`` on the
    answer and EOS. The answer is truncated so that the whole sequence has at most ``max_length``
    tokens (the EOS is always kept; a prompt longer than ``max_length`` is not cut).
    """
    return encode_qa_many(tokenizer, template, [(question, answer)], max_length)[0]


def encode_qa_many(tokenizer, template: PromptTemplate, pairs: Sequence[tuple[str, str]], max_length: int):
    """:func:`encode_qa` for many pairs at once (one batched tokenizer call per side)."""
    prompts = _tok(tokenizer, [template.prompt(q) for q, _ in pairs])
    answers = _tok(tokenizer, [template.answer_text(a) for _, a in pairs])
    prefix, eos = _prefix_ids(tokenizer), _eos_id(tokenizer)
    return [_assemble(prefix, p, a, eos, max_length) for p, a in zip(prompts, answers)]


def encode_prompts(tokenizer, template: PromptTemplate, questions: Sequence[str]) -> list[list[int]]:
    """Prompt token ids exactly as :func:`encode_qa` builds them (BOS + prompt), for generation."""
    prefix = _prefix_ids(tokenizer)
    return [prefix + ids for ids in _tok(tokenizer, [template.prompt(q) for q in questions])]


# --------------------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------------------


def bucketed_batches(lengths: Sequence[int], batch_size: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """Group example indices into batches of similar length.

    Indices are sorted by length and cut into consecutive batches of ``batch_size``, so padding is
    minimal. With ``shuffle`` the ties between equal lengths are broken randomly and the batch order
    is shuffled, both with a ``numpy`` RNG seeded by ``seed`` (deterministic; pass e.g. a per-epoch
    seed to get different batches every epoch). Without ``shuffle`` the batches come in increasing
    length with ties in index order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if shuffle:
        rng = np.random.default_rng(seed)
        perm = rng.permutation(n)
        order = perm[np.argsort(lengths[perm], kind="stable")]
    else:
        order = np.argsort(lengths, kind="stable")
    batches = [order[i : i + batch_size].tolist() for i in range(0, n, batch_size)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def collate(examples: Sequence, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad examples into ``input_ids``, ``attention_mask`` and ``labels`` (``-100`` on pads).

    Each example is an ``(input_ids, labels)`` pair or a mapping with those keys.
    """
    ids = [e["input_ids"] if isinstance(e, Mapping) else e[0] for e in examples]
    labs = [e["labels"] if isinstance(e, Mapping) else e[1] for e in examples]
    width = max(len(x) for x in ids)
    n = len(ids)
    input_ids = torch.full((n, width), int(pad_id), dtype=torch.long)
    labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for i, (x, y) in enumerate(zip(ids, labs)):
        input_ids[i, : len(x)] = torch.as_tensor(x, dtype=torch.long)
        labels[i, : len(y)] = torch.as_tensor(y, dtype=torch.long)
        attention_mask[i, : len(x)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


# --------------------------------------------------------------------------------------------------
# Answer-token NLL
# --------------------------------------------------------------------------------------------------

# Architectures whose logits are exactly ``lm_head(decoder(x).last_hidden_state)`` (no logit scaling
# or soft-capping), so that the head can be applied to the answer positions only.
_PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo", "olmo2"})


def _unwrap(model):
    get_base = getattr(model, "get_base_model", None)  # PEFT wrapper
    return get_base() if callable(get_base) else model


def model_device(model) -> torch.device:
    """The device of a model's first parameter (CPU for a parameter-less module)."""
    for param in model.parameters():
        return param.device
    return torch.device("cpu")


def resolve_device(device: str = "auto") -> torch.device:
    """``auto``: the first CUDA GPU when one is visible, else the CPU; or an explicit torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def answer_token_logits(model, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-token logits at the labelled (answer) positions of a right-padded batch.

    Returns ``(logits, targets, mask)``: ``logits`` of shape ``(n_selected, vocab)`` (model dtype),
    one row per target token with ``labels != -100`` (after the causal shift), in row-major order;
    ``targets`` the ``(n_selected,)`` token ids they predict; ``mask`` the boolean
    ``(batch, seq_len - 1)`` selection. Padding is ignored exactly (the model must be causal; right
    padding is what :func:`collate` produces). The LM head is applied to the selected positions
    only where the architecture allows it.
    """
    device = model_device(model)
    input_ids, labels = batch["input_ids"].to(device), batch["labels"].to(device)
    attention_mask = batch.get("attention_mask")
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    if attention_mask is not None and bool((attention_mask == attention_mask.cumprod(dim=1)).all()):
        # Right padding only: under the causal mask no real token can attend to a pad (pads come
        # after it) and positions are unchanged, so the mask is redundant. Dropping it lets SDPA
        # use its fast causal kernel; pad positions are never scored.
        attention_mask = None
    mask = labels[:, 1:] != IGNORE_INDEX
    targets = labels[:, 1:][mask]
    base = _unwrap(model)
    cfg = getattr(base, "config", None)
    if getattr(cfg, "model_type", None) in _PLAIN_HEAD_TYPES:
        hidden = base.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        logits = base.get_output_embeddings()(hidden[:, :-1][mask])
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1][mask]
    return logits, targets, mask


def answer_token_nll(model, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token NLL of the labelled (answer) positions of a right-padded batch.

    Returns ``(nll, mask)``: ``nll`` is a float32 tensor of shape ``(n_selected,)`` holding the NLL of
    each target token with ``labels != -100`` (after the causal shift), in row-major order, and
    ``mask`` the boolean ``(batch, seq_len - 1)`` selection, so per-row sums are
    :func:`per_sequence` ``(nll, mask)``. Padding is ignored exactly (see :func:`answer_token_logits`).
    """
    logits, targets, mask = answer_token_logits(model, batch)
    nll = F.cross_entropy(logits.float(), targets, reduction="none")
    return nll, mask


def per_sequence(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sums of per-token ``values`` laid out by ``mask`` (as :func:`answer_token_nll` returns them).

    ``values`` has shape ``(mask.sum(),)``; returns ``(sums, counts)``, both of shape
    ``(mask.shape[0],)``: ``sums[i] = Σ_t values[i, t]`` over the selected positions of row ``i``
    (differentiable) and ``counts[i]`` their number (float). Raises ``ValueError`` on a size mismatch.
    """
    if values.ndim != 1 or values.shape[0] != int(mask.sum()):
        raise ValueError(f"per_sequence: expected {int(mask.sum())} values, got shape {tuple(values.shape)}")
    grid = torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)
    return grid.sum(dim=1), mask.sum(dim=1).to(values.dtype)


def sequence_nll(model, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence answer NLL of a batch: ``(sums, counts)``, each of shape ``(batch,)``.

    ``sums[i] = −log π(y_i | x_i) = −Σ_t log π(y_it | x_i, y_i,<t)`` over the answer tokens (EOS
    included) of row ``i``; ``counts[i]`` is their number. float32, differentiable.
    """
    nll, mask = answer_token_nll(model, batch)
    return per_sequence(nll, mask.to(nll.device))


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------


def train_bpe_tokenizer(texts: Sequence[str], vocab_size: int, out_dir: str | os.PathLike,
                        individual_digits: bool = False):
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


def load_tokenizer(name_or_path: str | os.PathLike, local_files_only: bool = True):
    """``AutoTokenizer.from_pretrained``; the pad token falls back to EOS when missing.

    Raises a one-line ``ValueError`` naming the path when it does not hold a tokenizer.
    """
    from transformers import AutoTokenizer

    where = _resolve(name_or_path, local_files_only, ("tokenizer_config.json", "tokenizer.json"), "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(where, local_files_only=local_files_only)
    except Exception as exc:  # transformers raises OSError/ValueError/... depending on the failure
        raise ValueError(f"{name_or_path}: cannot load a tokenizer ({_first_line(exc)})") from exc
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
    def from_dict(cls, d: Mapping[str, Any] | None) -> "TinyLlamaConfig":
        return _from_dict(cls, d, "tiny llama config")


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _resolve(name_or_path, local_files_only: bool, markers: Sequence[str], what: str) -> str:
    """A local directory for ``name_or_path``, or the hub id itself when downloads are allowed.

    With ``local_files_only`` a hub id is resolved through the local Hugging Face cache first:
    ``from_pretrained`` on a bare id may still probe the network for optional files.
    """
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        if not any((p / m).is_file() for m in markers):
            raise ValueError(f"{name_or_path}: not a {what} directory (none of {', '.join(markers)} found)")
        return str(p)
    if p.exists():
        raise ValueError(f"{name_or_path}: is a file, expected a {what} directory")
    if not local_files_only:
        return str(name_or_path)
    if not _looks_like_hub_id(str(name_or_path)):
        raise ValueError(f"{name_or_path}: no such {what} directory")
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(str(name_or_path), local_files_only=True)
    except Exception as exc:
        raise ValueError(
            f"{name_or_path}: no such {what} directory, and not in the local Hugging Face cache ({_first_line(exc)})"
        ) from exc


def _looks_like_hub_id(s: str) -> bool:
    parts = s.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not s.startswith((".", "/", "~"))


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def load_model(
    name_or_path: str | os.PathLike, dtype: str = "float32", local_files_only: bool = True, device: str = "cpu"
):
    """``AutoModelForCausalLM.from_pretrained`` in ``dtype``, in eval mode.

    ``local_files_only=False`` lets online users load hub ids. A path that does not hold a model
    gives a one-line ``ValueError`` naming it.
    """
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    where = _resolve(name_or_path, local_files_only, ("config.json", "adapter_config.json"), "model")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=_DTYPES[dtype], local_files_only=local_files_only
        )
    except Exception as exc:
        raise ValueError(f"{name_or_path}: cannot load a causal LM ({_first_line(exc)})") from exc
    if model.generation_config.pad_token_id is None and model.config.eos_token_id is not None:
        eos = model.config.eos_token_id
        model.generation_config.pad_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
    return model.to(resolve_device(device)).eval()


def save_model(model, tokenizer, out_dir: str | os.PathLike) -> None:
    """Save model (safetensors) and tokenizer into ``out_dir`` atomically (replacing it whole)."""
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers < 5; v5 always writes safetensors
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp), **kwargs)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
