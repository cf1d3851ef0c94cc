"""Causal-LM plumbing: prompt template, QA encoding, length-bucketed batching, answer-token losses.

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

The tokenizer and the models themselves are :mod:`qrerase.text.models`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..config import from_mapping
from ..engine.placement import model_device

__all__ = [
    "PromptTemplate",
    "qa_pair",
    "encode_qa",
    "encode_qa_many",
    "encode_prompts",
    "bos_ids",
    "token_ids",
    "bucketed_batches",
    "collate",
    "pad_token_id",
    "answer_token_logits",
    "answer_token_nll",
    "per_sequence",
    "sequence_nll",
    "IGNORE_INDEX",
]

IGNORE_INDEX = -100


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
    def from_dict(cls, d: Mapping[str, Any] | None) -> PromptTemplate:
        return from_mapping(cls, d, "prompt template")

    @classmethod
    def from_chat_template(cls, tokenizer) -> PromptTemplate:
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
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True
        )
        if text.count(marker) != 1:
            raise ValueError(f"model.template: chat template does not render the question once: {text!r}")
        before, after = text.split(marker)
        bos = getattr(tokenizer, "bos_token", None)
        if bos and before.startswith(bos):
            before = before[len(bos) :]
        return cls(
            question_start=before,
            question_end="",
            answer_start=after,
            answer_end="",
            answer_separator="" if after[-1:].isspace() else " ",
        )


def qa_pair(record: Mapping[str, Any]) -> tuple[str, str]:
    """``(question, answer)`` of a record with ``question``/``answer`` (or TOFU's ``prompt``/``response``) keys."""
    for qk, ak in (("question", "answer"), ("prompt", "response")):
        if qk in record and ak in record:
            return str(record[qk]), str(record[ak])
    raise KeyError(f"record has neither question/answer nor prompt/response keys: {sorted(record)}")


def bos_ids(tokenizer) -> list[int]:
    """``[BOS id]``, or ``[]`` for a tokenizer without one: what every encoded sequence starts with."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None else []


def _eos_id(tokenizer) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("tokenizer has no EOS token; cannot close answers")
    return int(eos)


def token_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's token ids, no special tokens added (one batched tokenizer call)."""
    if not texts:
        return []
    return [list(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def _assemble(prefix, prompt_ids, answer_ids, eos, max_length):
    prompt_ids = prefix + prompt_ids
    if max_length is None:  # no cap: the whole answer
        budget = len(answer_ids)
    else:
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


def encode_qa_many(
    tokenizer, template: PromptTemplate, pairs: Sequence[tuple[str, str]], max_length: int | None, cut=None
):
    """:func:`encode_qa` for many pairs at once (one batched tokenizer call per side).

    ``max_length`` ``None``: no cap (every answer whole). ``cut``: an optional list that receives the
    indices of the pairs whose answer the cap shortened (so callers can count truncation).
    """
    prompts = token_ids(tokenizer, [template.prompt(q) for q, _ in pairs])
    answers = token_ids(tokenizer, [template.answer_text(a) for _, a in pairs])
    prefix, eos = bos_ids(tokenizer), _eos_id(tokenizer)
    out = [_assemble(prefix, p, a, eos, max_length) for p, a in zip(prompts, answers)]
    if cut is not None:
        kept = [sum(t != IGNORE_INDEX for t in labels) - 1 for _, labels in out]  # answer tokens, EOS aside
        cut.extend(i for i, (k, a) in enumerate(zip(kept, answers)) if k < len(a))
    return out


def encode_prompts(tokenizer, template: PromptTemplate, questions: Sequence[str]) -> list[list[int]]:
    """Prompt token ids exactly as :func:`encode_qa` builds them (BOS + prompt), for generation."""
    prefix = bos_ids(tokenizer)
    return [prefix + ids for ids in token_ids(tokenizer, [template.prompt(q) for q in questions])]


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


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, else its EOS id (padding is masked out everywhere)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


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
_PLAIN_HEAD_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo", "olmo2"}
)


def _unwrap(model):
    get_base = getattr(model, "get_base_model", None)  # PEFT wrapper
    return get_base() if callable(get_base) else model


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
        hidden = base.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
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
