"""Micro-batch splits of the answer-token losses that the training loops use (:func:`qrerase.engine.chunk`):
the pieces of one batch sum to the full-batch loss, so gradient accumulation and data parallelism give
the full-batch gradient."""

from __future__ import annotations

from .lm import answer_token_nll, collate

__all__ = ["answer_tokens", "token_mean_split"]


def answer_tokens(example) -> int:
    """Number of scored (answer) tokens of an encoded ``(input_ids, labels)`` example."""
    return sum(1 for t in example[1][1:] if t != -100)


def token_mean_split(model, examples, pad_id: int, sign: float = 1.0):
    """Micro-batch split of the token-mean answer NLL ``Σ_{i∈B} Σ_t nll_it / Σ_{i∈B} n_i``: a piece
    ``P`` of batch ``B`` contributes ``Σ_{i∈P} Σ_t nll_it / Σ_{i∈B} n_i`` (0 for a padding piece),
    so the pieces sum to the full-batch loss (see :func:`qrerase.engine.chunk`); ``sign=-1``: of
    ``−Σ nll / Σ n`` (gradient ascent)."""
    from .. import engine

    counts = [answer_tokens(e) for e in examples]

    def split(idx, parts: int):
        denom = max(1, sum(counts[i] for i in idx))

        def piece(sub, live):
            nll, _ = answer_token_nll(model, collate([examples[i] for i in sub], pad_id))
            return nll.sum() * ((sign if live else 0.0) / denom), {}

        return [(lambda sub=sub, live=live: piece(sub, live)) for sub, live in engine.chunk(idx, parts)]

    return split
