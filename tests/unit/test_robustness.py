"""The robustness stage's measures (qrerase.robustness) against their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from qrerase.robustness import (
    block_steps,
    edit_step_ratio,
    edit_step_ratios,
    quantization_recovery,
    quantize_roundtrip,
    random_subspace,
    recovery,
    relearning_gain,
    split_halves,
    subspace_share,
    zero_steps,
)

FORMATS = ["q8_0", "q4_0", "q4_1"]


@pytest.fixture(scope="module")
def weight():
    return np.random.default_rng(0).standard_normal((8, 96)).astype(np.float32) * 0.05


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_round_trip_is_the_gguf_packages_own(weight, fmt):
    from gguf import GGMLQuantizationType, quants

    qtype = getattr(GGMLQuantizationType, fmt.upper())
    want = quants.dequantize(quants.quantize(weight, qtype), qtype)
    got = quantize_roundtrip(weight, fmt)
    assert got.dtype == np.float32 and got.shape == weight.shape
    np.testing.assert_array_equal(got, want)
    assert 0 < np.abs(got - weight).max() <= block_steps(weight, fmt).max()  # rounded, by at most a step


def test_the_steps_are_the_formats_scales(weight):
    """Q8_0: d = max|x| / 127 per block of 32; Q4_1: d = (max − min) / 15 (in fp16)."""
    blocks = weight.reshape(8, 3, 32)
    q8 = (np.abs(blocks).max(axis=2) / 127).astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(block_steps(weight, "q8_0"), np.repeat(q8, 32, axis=1), rtol=1e-3)
    q41 = ((blocks.max(axis=2) - blocks.min(axis=2)) / 15).astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(block_steps(weight, "q4_1"), np.repeat(q41, 32, axis=1), rtol=1e-3)
    # every dequantized Q4_1 value of a block lies on its grid m + q·d
    got, steps = quantize_roundtrip(weight, "q4_1"), block_steps(weight, "q4_1")
    offsets = (got - got.reshape(8, 3, 32).min(axis=2).repeat(32, axis=1)) / steps
    np.testing.assert_allclose(offsets, np.round(offsets), atol=1e-2)


def test_the_edit_step_ratio_is_the_median_edit_over_its_blocks_step(weight):
    steps = block_steps(weight, "q4_0")
    edited = weight + (0.25 * steps).astype(np.float32)  # a quarter step everywhere
    assert edit_step_ratio(edited, weight, "q4_0") == pytest.approx(
        0.25 * np.median(steps / block_steps(edited, "q4_0")), rel=1e-3
    )
    assert np.isnan(edit_step_ratio(weight, weight, "q4_0"))


def test_a_changed_weight_whose_block_quantizes_exactly_counts_with_an_infinite_ratio(weight):
    finetuned = weight.copy()
    finetuned[0, :32] = 0.01  # the edit zeroes block 0 of row 0: that block's step is 0 in the unlearned weights
    unlearned = weight.copy()
    unlearned[0, :32] = 0.0
    ratios = edit_step_ratios(unlearned, finetuned, "q4_0")
    changed = int((unlearned != finetuned).sum())
    assert ratios.size == changed and zero_steps(ratios) == 32  # counted, not dropped
    assert edit_step_ratio(unlearned, finetuned, "q4_0") == np.inf  # every changed weight is in that block


@pytest.fixture(scope="module")
def wide():
    """A weight whose rows are a whole number of bitsandbytes' 64-weight blocks."""
    return np.random.default_rng(1).standard_normal((6, 128)).astype(np.float32) * 0.05


@pytest.fixture(scope="module")
def bnb():
    return pytest.importorskip(
        "bitsandbytes.functional", reason='bitsandbytes (the quant extra: pip install -e ".[quant]")'
    )


@pytest.mark.parametrize("fmt", ["nf4", "fp4"])
def test_the_4bit_round_trip_is_bitsandbytes_code_times_the_block_absmax(wide, bnb, fmt):
    """NF4 / FP4: each weight becomes absmax(block of 64) x the format's code value nearest w / absmax."""
    weight = wide
    import torch

    got = quantize_roundtrip(weight, fmt)
    packed, state = bnb.quantize_4bit(torch.from_numpy(weight), blocksize=64, quant_type=fmt)
    np.testing.assert_array_equal(got, bnb.dequantize_4bit(packed, state).numpy())  # the library's own values
    flat = weight.reshape(-1, 64).astype(np.float64)
    absmax = np.abs(flat).max(axis=1, keepdims=True)
    code = np.sort(bnb.get_4bit_type(fmt, device="cpu").numpy().astype(np.float64))
    x, q = flat / absmax, got.reshape(-1, 64) / absmax
    index = np.abs(q[:, :, None] - code).argmin(axis=2)
    np.testing.assert_allclose(q, code[index], atol=1e-3)  # on the grid
    nearest = np.abs(x[:, :, None] - code).argmin(axis=2)
    np.testing.assert_array_equal(index, nearest)
    with pytest.raises(ValueError, match="row length divisible by the block size 64"):
        quantize_roundtrip(weight[:, :96], fmt)  # the CPU kernel blocks such rows inconsistently
    # the step at a weight is the gap of its code interval: the round trip moves it by at most that
    assert (np.abs(got - weight) <= block_steps(weight, fmt) * (1 + 1e-3)).all()


def test_the_int8_round_trip_is_rowwise_absmax_over_127(weight, bnb):
    got = quantize_roundtrip(weight, "int8")
    absmax = np.abs(weight).max(axis=1, keepdims=True).astype(np.float64)
    want = np.round(weight * 127.0 / absmax) * absmax / 127.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(
        block_steps(weight, "int8"), np.repeat(absmax / 127.0, weight.shape[1], axis=1), rtol=1e-6
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda w: quantize_roundtrip(w, "q3_k"), "quantization format 'q3_k': expected one of"),
        (lambda w: quantize_roundtrip(w[:, :40], "q8_0"), "row length divisible by the block size 32"),
        (lambda w: block_steps(np.where(w > 0, np.inf, w), "q4_0"), "non-finite entry"),
    ],
)
def test_bad_quantization_input_is_one_line(weight, call, message):
    with pytest.raises(ValueError, match=message) as info:
        call(weight)
    assert "\n" not in str(info.value)


def test_recovery_on_hand_values():
    # answer NLL: floor 3.0 (never learned B), ceiling 1.0 (never unlearned)
    assert recovery(3.0, 3.0, 1.0) == 0.0 and recovery(1.0, 3.0, 1.0) == 1.0
    assert recovery(2.5, 3.0, 1.0) == pytest.approx(0.25)
    assert recovery(3.5, 3.0, 1.0) == pytest.approx(-0.25)  # further from the ceiling than the floor
    assert relearning_gain(0.75, 0.25) == pytest.approx(0.5)
    # quantization: unlearned 2.0, fine-tuned 1.0, quantized 1.2 -> 80 % of the forgetting undone
    assert quantization_recovery(1.2, 2.0, 1.0) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: recovery(2.0, 1.5, 1.5, what="tofu forget NLL, budget 4"), r"^tofu forget NLL, budget 4: the gap"),
        (lambda: quantization_recovery(1.0, 2.0, 2.0), r"^quantization: the gap it is scaled by is 0"),
        (lambda: recovery(float("nan"), 1.0, 2.0), "non-finite value"),
    ],
)
def test_a_zero_gap_or_nan_is_a_one_line_error_not_nan(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_subspace_share_of_a_constructed_update():
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((20, 20)))
    inside, outside = q[:, :3], q[:, 3:]
    # ΔW with energy 4 in span(inside) and 1 outside it: share 0.8
    delta = inside @ (2 * np.eye(3)[:, :1] @ np.ones((1, 7)) / np.sqrt(7)) + outside[:, :1] @ np.ones((1, 7)) / np.sqrt(
        7
    )
    assert subspace_share(delta, inside) == pytest.approx(0.8)
    assert subspace_share(np.zeros((20, 7)), inside) == 0.0
    with pytest.raises(ValueError, match="orthonormal"):
        subspace_share(delta, 2 * inside)
    with pytest.raises(ValueError, match="are not d_out"):
        subspace_share(delta, inside[:10])


def test_a_random_subspace_gets_k_over_d_out_in_expectation():
    rng = np.random.default_rng(2)
    delta = rng.standard_normal((40, 30))
    shares = [subspace_share(delta, random_subspace(40, 4, seed)) for seed in range(400)]
    assert np.mean(shares) == pytest.approx(4 / 40, abs=0.01)
    np.testing.assert_array_equal(random_subspace(40, 4, 7), random_subspace(40, 4, 7))


def test_the_halves_put_every_entity_in_both_and_are_seeded():
    entities = ["a"] * 5 + ["b"] * 4 + ["c"] * 2
    in_a = split_halves(entities, seed=0)
    for e in "abc":
        mask = np.asarray(entities) == e
        assert in_a[mask].any() and (~in_a[mask]).any()
    assert in_a.sum() == 3 + 2 + 1
    np.testing.assert_array_equal(in_a, split_halves(entities, seed=0))
    assert any((split_halves(entities, seed=s) != in_a).any() for s in range(1, 5))
    with pytest.raises(ValueError, match="entity 'd' has 1 item"):
        split_halves([*entities, "d"], seed=0)
