"""Weight-only round-to-nearest quantization in the formats small models ship in (GGUF Q8_0, Q4_0, Q4_1),
by the ``gguf`` package's own quantizers, and in the formats the unlearning literature attacks with
(bitsandbytes NF4, FP4 and int8), by ``bitsandbytes``' own functions (the ``quant`` extra); no rounding
is written here. And the edit-to-step ratio.

Each format quantizes blocks of 32 consecutive weights of a row with one scale ``d`` (fp16) per block,
stored first in the block's bytes: Q8_0 ``x ≈ d·q`` (q ∈ −127…127), Q4_0 ``x ≈ d·(q − 8)`` (q ∈ 0…15), Q4_1
``x ≈ d·q + m`` (q ∈ 0…15, with a per-block minimum m). The step between two neighbouring values of a
block is |d|. Zhang et al. (2024, arXiv 2410.16454) explain why 4-bit quantization restores forgotten
knowledge: an unlearning edit smaller than the step is rounded away. :func:`edit_step_ratio` is their
quantity: the median over weights of |W_unlearned − W_fine-tuned| ÷ the step of the weight's block in the
quantized unlearned weights.

bitsandbytes formats (CPU functions of bitsandbytes ≥ 0.50): NF4 and FP4 quantize blocks of 64
consecutive weights (of the flattened row-major matrix) to the 16 values of a fixed code scaled by the
block's absmax (``quantize_4bit`` / ``dequantize_4bit``); int8 is the vector-wise absmax quantizer of
LLM.int8 without outlier columns (``int8_vectorwise_quant`` / ``int8_vectorwise_dequant``): row i keeps
round(127 · x / absmax_i). Which paper used which: Zhang et al. 2024 (arXiv 2410.16454) bitsandbytes 4-bit
and 8-bit; DurableUn (arXiv 2605.02196) NF4; none of them GGUF.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "FORMATS",
    "GGUF_FORMATS",
    "BNB_FORMATS",
    "BNB_BLOCK",
    "quantize_roundtrip",
    "block_steps",
    "edit_step_ratio",
    "edit_step_ratios",
    "missing_backend",
    "zero_steps",
    "block_of",
]

#: Config name -> GGUF quantization type name.
GGUF_FORMATS = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1"}
#: Config name -> bitsandbytes quantizer (``quant_type`` of the 4-bit ones).
BNB_FORMATS = {"nf4": "nf4", "fp4": "fp4", "int8": "int8"}
#: Every format a config may list.
FORMATS = {**GGUF_FORMATS, **BNB_FORMATS}
#: The block of bitsandbytes' 4-bit formats (its default for weights).
BNB_BLOCK = 64


def missing_backend(fmt: str) -> str | None:
    """None when ``fmt``'s package imports, else the install hint (a bitsandbytes format without the
    ``quant`` extra); ValueError for an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"quantization format {fmt!r}: expected one of {sorted(FORMATS)}")
    if fmt in GGUF_FORMATS:
        return None
    from importlib.util import find_spec

    return None if find_spec("bitsandbytes") else 'pip install -e ".[quant]" (bitsandbytes)'


def _bnb_roundtrip(w: np.ndarray, fmt: str) -> np.ndarray:
    """The dequantized weights, float32 of w's shape."""
    import bitsandbytes.functional as F
    import torch

    x = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    if fmt == "int8":
        q, row_absmax, _ = F.int8_vectorwise_quant(x)
        return F.int8_vectorwise_dequant(q, row_absmax).numpy().astype(np.float32).reshape(w.shape)
    packed, state = F.quantize_4bit(x, blocksize=BNB_BLOCK, quant_type=BNB_FORMATS[fmt])
    return F.dequantize_4bit(packed, state).numpy().astype(np.float32).reshape(w.shape)


def _bnb_steps(w: np.ndarray, fmt: str) -> np.ndarray:
    """The step at each weight: int8, absmax_row / 127; NF4 / FP4, the block's absmax times the gap of
    the code interval that holds w / absmax (their codes are not evenly spaced). The absmax is computed
    here as the quantizers compute it (the max |w| of the row, or of the 64-weight block); no round trip."""
    w = np.asarray(w, dtype=np.float64)
    if fmt == "int8":
        return np.repeat(np.abs(w).max(axis=1, keepdims=True) / 127.0, w.shape[1], axis=1).astype(np.float32)
    import bitsandbytes.functional as F

    blocks = w.reshape(-1, BNB_BLOCK)
    scale = np.repeat(np.abs(blocks).max(axis=1), BNB_BLOCK).reshape(w.shape)
    code = np.sort(F.get_4bit_type(BNB_FORMATS[fmt], device="cpu").numpy().astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(scale > 0, w / scale, 0.0)
    hi = np.clip(np.searchsorted(code, x, side="right"), 1, code.size - 1)
    return (scale * (code[hi] - code[hi - 1])).astype(np.float32)


def block_of(fmt: str) -> int:
    """The row length a format's weight must be a multiple of: GGUF's block (32); bitsandbytes' 4-bit
    block (64: its CPU kernel blocks rows of any other length inconsistently, measured with 0.50.2); 1 for
    int8 (per row)."""
    if fmt in GGUF_FORMATS:
        return 32
    if fmt not in FORMATS:
        raise ValueError(f"quantization format {fmt!r}: expected one of {sorted(FORMATS)}")
    return 1 if fmt == "int8" else BNB_BLOCK


def _checked(w: np.ndarray, fmt: str) -> np.ndarray:
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % block_of(fmt):
        raise ValueError(
            f"{fmt}: weight {w.shape} must be 2-D with a row length divisible by the block size {block_of(fmt)}"
        )
    if not np.isfinite(w).all():
        raise ValueError(f"{fmt}: weight {w.shape} has a non-finite entry")
    hint = missing_backend(fmt)
    if hint:
        raise ValueError(f"quantization format {fmt!r} needs bitsandbytes: {hint}")
    return w


def _qtype(fmt: str):
    from gguf import GGMLQuantizationType

    if fmt not in GGUF_FORMATS:
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
    """``w`` (d_out, d_in; for GGUF d_in a multiple of 32) quantized to ``fmt`` and dequantized by the
    ``gguf`` package or bitsandbytes, float32 of ``w``'s shape: the weights a model shipped in that format
    computes with."""
    from gguf import quants

    if fmt in BNB_FORMATS:
        return _bnb_roundtrip(_checked(w, fmt), fmt)

    packed, _, _ = _packed(w, fmt)
    return np.asarray(quants.dequantize(packed, _qtype(fmt)), dtype=np.float32).reshape(np.shape(w))


def block_steps(w: np.ndarray, fmt: str) -> np.ndarray:
    """The quantization step of every weight, (d_out, d_in) float32. GGUF: its block's |d|, the fp16 scale
    read from the ``gguf`` package's packed bytes (the first two bytes of every block). bitsandbytes:
    :func:`_bnb_steps`."""
    if fmt in BNB_FORMATS:
        return _bnb_steps(_checked(w, fmt), fmt)
    packed, block, type_size = _packed(w, fmt)
    d_out, d_in = np.shape(w)
    scales = packed.reshape(d_out, d_in // block, type_size)[:, :, :2].copy().view(np.float16)[:, :, 0]
    return np.repeat(np.abs(scales.astype(np.float32)), block, axis=1)


def edit_step_ratios(unlearned: np.ndarray, finetuned: np.ndarray, fmt: str) -> np.ndarray:
    """|W_unlearned − W_fine-tuned| / step of every weight the edit changed (1-D float64), where step is
    the quantization step of the weight in the unlearned weights (:func:`block_steps`). A changed weight
    whose step is 0 (its block quantizes exactly: all zero) keeps its edit whole: its ratio is +inf, so it
    counts (:func:`zero_steps` gives their number)."""
    unlearned, finetuned = np.asarray(unlearned, dtype=np.float32), np.asarray(finetuned, dtype=np.float32)
    if unlearned.shape != finetuned.shape:
        raise ValueError(f"edit_step_ratio: shapes {unlearned.shape} and {finetuned.shape} differ")
    edit = np.abs(unlearned.astype(np.float64) - finetuned.astype(np.float64))
    steps = block_steps(unlearned, fmt).astype(np.float64)
    changed = edit > 0
    with np.errstate(divide="ignore"):
        return np.where(steps[changed] > 0, edit[changed] / np.where(steps[changed] > 0, steps[changed], 1.0), np.inf)


def zero_steps(ratios: np.ndarray) -> int:
    """How many of :func:`edit_step_ratios`' weights had a zero step (their ratio is +inf)."""
    return int(np.isposinf(np.asarray(ratios)).sum())


def edit_step_ratio(unlearned: np.ndarray, finetuned: np.ndarray, fmt: str) -> float:
    """Median of :func:`edit_step_ratios`: below 1, most of the edit is smaller than what quantizing the
    unlearned model rounds to. NaN when nothing changed."""
    ratios = edit_step_ratios(unlearned, finetuned, fmt)
    return float(np.median(ratios)) if ratios.size else float("nan")
