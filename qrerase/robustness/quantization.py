"""Weight-only round-to-nearest quantization in the formats small models ship in (GGUF Q8_0, Q4_0, Q4_1),
by the ``gguf`` package's own quantizers (no rounding written here), and the edit-to-step ratio.

Each format quantizes blocks of 32 consecutive weights of a row with one scale ``d`` (fp16) per block,
stored first in the block's bytes: Q8_0 ``x ≈ d·q`` (q ∈ −127…127), Q4_0 ``x ≈ d·(q − 8)`` (q ∈ 0…15), Q4_1
``x ≈ d·q + m`` (q ∈ 0…15, with a per-block minimum m). The step between two neighbouring values of a
block is |d|. Zhang et al. (2024, arXiv 2410.16454) explain why 4-bit quantization restores forgotten
knowledge: an unlearning edit smaller than the step is rounded away. :func:`edit_step_ratio` is their
quantity: the median over weights of |W_unlearned − W_fine-tuned| ÷ the step of the weight's block in the
quantized unlearned weights.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FORMATS", "quantize_roundtrip", "block_steps", "edit_step_ratio"]

#: Config name -> GGUF quantization type name.
FORMATS = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1"}


def _qtype(fmt: str):
    from gguf import GGMLQuantizationType

    if fmt not in FORMATS:
        raise ValueError(f"quantization format {fmt!r}: expected one of {sorted(FORMATS)}")
    return getattr(GGMLQuantizationType, FORMATS[fmt])


def _packed(w: np.ndarray, fmt: str) -> tuple[np.ndarray, int, int]:
    from gguf import GGML_QUANT_SIZES, quants

    qtype = _qtype(fmt)
    block, type_size = GGML_QUANT_SIZES[qtype]
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % block:
        raise ValueError(f"{fmt}: weight {w.shape} must be 2-D with a row length divisible by the block size {block}")
    if not np.isfinite(w).all():
        raise ValueError(f"{fmt}: weight {w.shape} has a non-finite entry")
    return quants.quantize(w, qtype), block, type_size


def quantize_roundtrip(w: np.ndarray, fmt: str) -> np.ndarray:
    """``w`` (d_out, d_in; d_in a multiple of 32) quantized to ``fmt`` and dequantized by the ``gguf``
    package, float32 of ``w``'s shape: the weights a model shipped in that format computes with."""
    from gguf import quants

    packed, _, _ = _packed(w, fmt)
    return np.asarray(quants.dequantize(packed, _qtype(fmt)), dtype=np.float32).reshape(np.shape(w))


def block_steps(w: np.ndarray, fmt: str) -> np.ndarray:
    """The quantization step |d| of every weight's block, (d_out, d_in) float32: each block's fp16 scale
    read from the ``gguf`` package's packed bytes (the first two bytes of every block)."""
    packed, block, type_size = _packed(w, fmt)
    d_out, d_in = np.shape(w)
    scales = packed.reshape(d_out, d_in // block, type_size)[:, :, :2].copy().view(np.float16)[:, :, 0]
    return np.repeat(np.abs(scales.astype(np.float32)), block, axis=1)


def edit_step_ratios(unlearned: np.ndarray, finetuned: np.ndarray, fmt: str) -> np.ndarray:
    """|W_unlearned − W_fine-tuned| / step of every weight the edit changed (1-D float64), where step is
    the quantization step of the weight's block in the unlearned weights (:func:`block_steps`)."""
    unlearned, finetuned = np.asarray(unlearned, dtype=np.float32), np.asarray(finetuned, dtype=np.float32)
    if unlearned.shape != finetuned.shape:
        raise ValueError(f"edit_step_ratio: shapes {unlearned.shape} and {finetuned.shape} differ")
    edit = np.abs(unlearned.astype(np.float64) - finetuned.astype(np.float64))
    steps = block_steps(unlearned, fmt).astype(np.float64)
    changed = (edit > 0) & (steps > 0)
    return edit[changed] / steps[changed]


def edit_step_ratio(unlearned: np.ndarray, finetuned: np.ndarray, fmt: str) -> float:
    """Median of :func:`edit_step_ratios`: below 1, most of the edit is smaller than what quantizing the
    unlearned model rounds to. NaN when nothing changed."""
    ratios = edit_step_ratios(unlearned, finetuned, fmt)
    return float(np.median(ratios)) if ratios.size else float("nan")
