"""The model-size study: the recipe of every width, and the measures read from each width's sweep.

Recipe (stated before any result; ``size_study`` in the config): the embedded tiny Llama at hidden
width W, intermediate ``intermediate_ratio`` · W, depth, heads, vocabulary and LoRA rank as the TOFU
track's; every training stage (pretrain, fine-tune, LoRA, the optimisation baselines) keeps its
configured epochs and batch size, and its learning rate is scaled as lr(W) = lr · (W_ref / W)^α
(:func:`scaled_lr`; α = ``lr_exponent``, W_ref = ``reference_width``).

Measures, per width, seed and method (:func:`selectivity_at_rise`, :func:`rule_pick`): the sweep
variable x is λ for a subspace method and epochs for an optimisation baseline; x = 0 is the unedited
fine-tuned model. The held-out slice (``tune_retain``) alone places the points on x.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["size_model", "scaled_lr", "selectivity_at_rise", "rule_pick", "loglog_fit", "extrapolate"]


def size_model(model_cfg: Mapping[str, Any], width: int, intermediate_ratio: int) -> dict[str, Any]:
    """A copy of the config's ``model`` section whose embedded model has hidden width ``width`` and
    intermediate size ``intermediate_ratio · width`` (everything else unchanged). ValueError when
    the width is not a positive multiple of the attention heads or the model is not the embedded one.
    """
    if model_cfg.get("name_or_path") is not None:
        raise ValueError("size_study: needs the embedded model (model.name_or_path: null)")
    heads = int(model_cfg["tiny"]["num_attention_heads"])
    if not isinstance(width, int) or width < 1 or width % heads:
        raise ValueError(f"size_study.widths: {width!r} is not a positive multiple of num_attention_heads ({heads})")
    if not isinstance(intermediate_ratio, int) or intermediate_ratio < 1:
        raise ValueError(f"size_study.intermediate_ratio: expected an integer >= 1, got {intermediate_ratio!r}")
    out = copy.deepcopy(dict(model_cfg))
    out["tiny"] = {**out["tiny"], "hidden_size": width, "intermediate_size": intermediate_ratio * width}
    return out


def scaled_lr(lr: float, width: int, reference_width: int, exponent: float) -> float:
    """lr(W) = lr · (W_ref / W)^α: α = 1 is the μP-style 1/width law for Adam on hidden matrices,
    α = 0 a constant learning rate. Exactly ``lr`` at W = W_ref."""
    if width < 1 or reference_width < 1 or not math.isfinite(exponent) or lr < 0:
        raise ValueError(
            "scaled_lr: expected widths >= 1, finite exponent, lr >= 0; "
            f"got {width}, {reference_width}, {exponent}, {lr}"
        )
    if width == reference_width or exponent == 0:
        return float(lr)
    return float(lr) * (reference_width / width) ** exponent


def _sweep(x: Sequence[float], *ys: Sequence[float]) -> tuple[np.ndarray, ...]:
    arrays = [np.asarray(v, dtype=np.float64) for v in (x, *ys)]
    if any(a.ndim != 1 or a.size != arrays[0].size for a in arrays) or arrays[0].size < 1:
        raise ValueError("size study: x and the NLL columns must be 1-D of one length >= 1")
    order = np.argsort(arrays[0], kind="stable")
    arrays = [a[order] for a in arrays]
    if arrays[0][0] != 0:
        raise ValueError("size study: the sweep needs its x = 0 point (the unedited model)")
    if np.any(np.diff(arrays[0]) == 0):
        raise ValueError("size study: repeated x in one sweep")
    return tuple(arrays)


def selectivity_at_rise(
    x: Sequence[float], forget_nll: Sequence[float], retain_nll: Sequence[float], target: float = 0.1
) -> dict[str, float]:
    """Selectivity of an edit: forget-set NLL rise ÷ held-out retain NLL rise where the latter is ``target``.

    With Δ_r(x) = retain_nll(x) − retain_nll(0) and Δ_f(x) likewise (nats, mean per-token answer NLL),
    x* is the first crossing of Δ_r = target on the grid, linearly interpolated between the grid points
    around it; Δ_f(x*) is interpolated the same way and selectivity = Δ_f(x*) / target. Inputs: 1-D, one
    length, any order, x ≥ 0 with an x = 0 point. Returns ``x_star``, ``forget_rise``, ``selectivity``
    (all NaN when Δ_r never reaches ``target`` on the grid: the sweep is too short to say).
    """
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"selectivity_at_rise: target must be > 0, got {target}")
    xs, f, r = _sweep(x, forget_nll, retain_nll)
    dr, df = r - r[0], f - f[0]
    hit = np.nonzero(dr >= target)[0]
    if hit.size == 0:
        return {"x_star": math.nan, "forget_rise": math.nan, "selectivity": math.nan}
    i = int(hit[0])
    if i == 0:  # unreachable: dr[0] = 0 < target
        raise AssertionError("selectivity_at_rise: Δ_r(0) must be 0")
    t = (target - dr[i - 1]) / (dr[i] - dr[i - 1])
    x_star = xs[i - 1] + t * (xs[i] - xs[i - 1])
    rise = df[i - 1] + t * (df[i] - df[i - 1])
    return {"x_star": float(x_star), "forget_rise": float(rise), "selectivity": float(rise / target)}


def rule_pick(x: Sequence[float], retain_nll: Sequence[float], max_rise: float) -> float:
    """The λ rule (:func:`qrerase.text.tradeoff.select_scale`) on any sweep: the largest x whose held-out
    retain NLL exceeds the x = 0 value by at most ``max_rise`` nats (x = 0 itself always qualifies; a
    non-finite NLL, a degenerate point, never does)."""
    if max_rise < 0:
        raise ValueError(f"rule_pick: max_rise must be >= 0, got {max_rise}")
    xs, r = _sweep(x, retain_nll)
    ok = np.isfinite(r) & ((r - r[0]) <= max_rise)
    ok[0] = True
    return float(xs[ok].max())


def loglog_fit(n_params: Sequence[float], values: Sequence[float], min_widths: int = 3) -> dict[str, float] | None:
    """Least squares of log10(value) = a + b · log10(N) over every (N, value) point (seeds as points).

    Points with a non-positive or non-finite value are dropped (their count is ``dropped``). Returns
    None when fewer than ``min_widths`` distinct N remain; else ``slope`` b, ``intercept`` a, their
    standard errors ``slope_se`` / ``intercept_se`` (OLS, residual variance with n − 2 degrees of
    freedom), ``n``, ``dropped``, and ``x_mean`` / ``sxx`` / ``s2`` (for :func:`extrapolate`).
    """
    N, v = np.asarray(n_params, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if N.shape != v.shape or N.ndim != 1 or (N <= 0).any():
        raise ValueError("loglog_fit: expected 1-D parameter counts > 0 and values of one length")
    keep = np.isfinite(v) & (v > 0)
    x, y = np.log10(N[keep]), np.log10(v[keep])
    if len(np.unique(x)) < min_widths:
        return None
    n = x.size
    x_mean = float(x.mean())
    sxx = float(np.sum((x - x_mean) ** 2))
    slope = float(np.sum((x - x_mean) * (y - y.mean())) / sxx)
    intercept = float(y.mean() - slope * x_mean)
    s2 = float(np.sum((y - intercept - slope * x) ** 2) / (n - 2)) if n > 2 else math.nan
    return {
        "slope": slope,
        "intercept": intercept,
        "slope_se": math.sqrt(s2 / sxx),
        "intercept_se": math.sqrt(s2 * (1 / n + x_mean**2 / sxx)),
        "n": n,
        "dropped": int((~keep).sum()),
        "x_mean": x_mean,
        "sxx": sxx,
        "s2": s2,
    }


def extrapolate(fit: Mapping[str, float], n_params: float, level: float = 0.95) -> tuple[float, float, float]:
    """The fitted trend at N parameters and its ``level`` confidence interval for the mean:
    10^(a + b x₀ ± t · s · sqrt(1/n + (x₀ − x̄)² / Sxx)), x₀ = log10 N, t of n − 2 degrees of freedom.
    An extrapolation beyond the fitted widths: it assumes the power law continues."""
    from scipy.stats import t as student_t

    x0 = math.log10(n_params)
    centre = fit["intercept"] + fit["slope"] * x0
    half = student_t.ppf(0.5 + level / 2, fit["n"] - 2) * math.sqrt(
        fit["s2"] * (1 / fit["n"] + (x0 - fit["x_mean"]) ** 2 / fit["sxx"])
    )
    return 10**centre, 10 ** (centre - half), 10 ** (centre + half)
