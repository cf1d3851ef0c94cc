"""Module names: which transformer block (layer) a module belongs to, and the module order.

A "layer" is either a transformer block (``granularity="block"``) or a single adapted module
(``granularity="module"``). The block of a module name is the integer after the
first ``layers.`` / ``layer.`` / ``h.`` / ``blocks.`` path component (``model.layers.3.mlp.up_proj`` →
``"3"``, ``hubert.encoder.layers.2.attention.q_proj`` → ``"2"``, ``transformer.h.5.attn.c_attn`` → ``"5"``).
Note that an encoder–decoder with ``encoder.layers.i`` and ``decoder.layers.i`` would share block i.
The first such component wins, so a mixture-of-experts name maps to its block, not its expert
(``model.layers.3.block_sparse_moe.experts.7.w1`` → ``"3"``). :func:`module_kind` gives the module's
role within its block with numeric indices replaced by ``*`` (``block_sparse_moe.experts.*.w1``,
``attn.c_attn``, ``self_attn.q_proj``).
"""

from __future__ import annotations

import re

__all__ = [
    "GRANULARITIES",
    "block_of",
    "block_index",
    "module_sort_key",
    "module_kind",
    "layer_of",
    "check_granularity",
]

GRANULARITIES = ("block", "module")

_BLOCK_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks)\.(\d+)(?=\.|$)")


def block_of(name: str) -> int | None:
    """Transformer-block index of a module name, or None when it has no ``layers.N``-style component."""
    m = _BLOCK_RE.search(name)
    return int(m.group(1)) if m else None


def block_index(name: str) -> int:
    """Transformer-block index of a module name; ValueError naming it when there is none."""
    b = block_of(name)
    if b is None:
        raise ValueError(
            f"module {name!r}: cannot map to a transformer block "
            "(no 'layers.N', 'layer.N', 'h.N' or 'blocks.N' component)"
        )
    return b


def module_kind(name: str) -> str:
    """The module's role within its block: the path after the block index, other indices as ``*``.

    ``transformer.h.5.attn.c_attn`` → ``attn.c_attn``; ``model.layers.0.block_sparse_moe.experts.3.w1``
    → ``block_sparse_moe.experts.*.w1``; a name without a block is returned with indices as ``*``.
    """
    m = _BLOCK_RE.search(name)
    rest = name[m.end() + 1 :] if m else name
    return ".".join("*" if part.isdigit() else part for part in rest.split("."))


def module_sort_key(name: str) -> tuple[int, int, str]:
    """Deterministic module order: by block index, then name; modules without a block last."""
    b = block_of(name)
    return (0, b, name) if b is not None else (1, 0, name)


def check_granularity(granularity: str) -> str:
    """``granularity`` when it is one of :data:`GRANULARITIES`, else ValueError."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    return granularity


def layer_of(name: str, granularity: str = "block") -> str:
    """The layer label of a module: its block index as a string, or the module name itself."""
    check_granularity(granularity)
    return str(block_index(name)) if granularity == "block" else name
