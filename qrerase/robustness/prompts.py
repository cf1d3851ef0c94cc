"""The prompt attacks of a text track (:data:`qrerase.robustness.settings.PROMPT_ATTACKS`): the model's
weights as given, half B's prompts changed (docs/robustness.md#protocol).

Each attack keeps the answer tokens of the plain scoring exactly: an example's labelled tokens (the answer,
cut by the scored-sequence cap from the *plain* prompt's length, and EOS) are those of
:func:`qrerase.text.lm.encode_qa_many` on the plain question; only the tokens before them change. So an
attacked statistic and the plain one average the same tokens, and a longer prompt cuts no answer:

* ``paraphrase``: ``BOS + tok(prompt(paraphrased_question))``;
* ``prefix``: ``BOS + tok(prompt(question)) + tok(separator + prefix)``: the assistant turn opens with the
  prefix, then the answer;
* ``in_context``: ``BOS + Σ_i [tok(prompt(q_i)) + tok(answer_text(a_i)) + EOS] + tok(prompt(question))``
  over m question-answer pairs of the same entity's half A, in file order, each closed by EOS as in
  training (earlier turns of the same template).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..text.lm import IGNORE_INDEX, PromptTemplate, bos_ids, encode_prompts, encode_qa_many, token_ids

__all__ = ["prompt_examples", "answer_ids"]

Example = tuple[list[int], list[int]]


def answer_ids(example: Example) -> list[int]:
    """The labelled tokens (answer and EOS) of an encoded ``(input_ids, labels)`` example."""
    return [t for t in example[1] if t != IGNORE_INDEX]


def _with_prompt(prompt: list[int], answer: list[int]) -> Example:
    return prompt + answer, [IGNORE_INDEX] * len(prompt) + answer


def prompt_examples(
    tokenizer,
    template: PromptTemplate,
    pairs: Sequence[tuple[str, str]],
    max_length: int | None,
    attack: str,
    *,
    paraphrases: Sequence[str] | None = None,
    prefix: str | None = None,
    facts: Sequence[Sequence[tuple[str, str]]] | None = None,
) -> list[Example]:
    """The encoded examples of a prompt attack (module docstring) on ``pairs`` (question, answer):

    attack ``paraphrase`` needs ``paraphrases`` (one per pair), ``prefix`` the prefix text, ``in_context``
    ``facts`` (per pair, the (question, answer) pairs put before it; m = their number). ``max_length``: the
    scored-sequence cap of the plain scoring (None: no cap). A ValueError names a missing or misaligned input.
    """
    plain = [answer_ids(e) for e in encode_qa_many(tokenizer, template, pairs, max_length)]
    bos = bos_ids(tokenizer)
    questions = [q for q, _ in pairs]
    if attack == "paraphrase":
        if paraphrases is None or len(paraphrases) != len(pairs):
            raise ValueError(f"paraphrase attack: {len(paraphrases or [])} paraphrases for {len(pairs)} questions")
        prompts = encode_prompts(tokenizer, template, list(paraphrases))
    elif attack == "prefix":
        if not prefix:
            raise ValueError("prefix attack: no prefix")
        opening = token_ids(tokenizer, [template.answer_separator + prefix])[0]
        prompts = [p + opening for p in encode_prompts(tokenizer, template, questions)]
    elif attack == "in_context":
        if facts is None or len(facts) != len(pairs):
            raise ValueError(f"in_context attack: facts for {len(facts or [])} of {len(pairs)} questions")
        # each distinct fact once, as scored: BOS + prompt + answer + EOS, the BOS dropped inside the turns
        distinct = list(dict.fromkeys(f for shown in facts for f in shown))
        turn = {
            f: e[0][len(bos) :] for f, e in zip(distinct, encode_qa_many(tokenizer, template, distinct, max_length))
        }
        prompts = [
            bos + [t for f in shown for t in turn[f]] + p[len(bos) :]
            for shown, p in zip(facts, encode_prompts(tokenizer, template, questions))
        ]
    else:
        raise ValueError(f"unknown prompt attack {attack!r}")
    return [_with_prompt(p, a) for p, a in zip(prompts, plain)]
