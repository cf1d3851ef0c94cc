"""The metric registry (qrerase/metrics/registry.py): built-in entries, registration errors, the
distance-to-ideal / best-row helpers for the three directions, and its torch-free import."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from qrerase.metrics import registry as reg
from qrerase.metrics.mia import loss_score


@pytest.fixture
def scratch(monkeypatch):
    """The registry with the built-ins, restored after the test (registrations here are temporary)."""
    monkeypatch.setattr(reg, "_METRICS", dict(reg._METRICS))
    return reg


def test_builtins():
    """Properties of the registry, not its full list or order: a metric registered later changes neither."""
    builtins = {"mia_loss", "mia_zlib", "mia_min_k", "mia_min_k_plus_plus", "privleak"}
    builtins |= {"extraction_strength", "exact_memorisation"}
    names = reg.metric_names()
    assert builtins <= set(names) and len(set(names)) == len(names)
    assert all(reg.metric(n).of in (None, *names) for n in names)  # a derived metric names a registered one
    auc = reg.metrics_for("tofu", "auc")
    assert {"mia_loss", "mia_zlib", "mia_min_k", "mia_min_k_plus_plus"} <= set(auc)
    assert all(reg.metric(n).aggregate == "auc" for n in auc)
    assert "mia_loss" in reg.metrics_for("speech") and not {"mia_zlib", "privleak"} & set(reg.metrics_for("speech"))
    assert not {m for m in builtins if m in reg.metrics_for("crosslingual")}
    m = reg.metric("mia_min_k")
    assert (m.direction, m.target, m.needs, m.aggregate) == ("target", 0.5, ("forget", "holdout"), "auc")
    p = reg.metric("privleak")
    assert (p.direction, p.target, p.of, p.aggregate) == ("target", 0.0, "mia_min_k", "relative")
    assert "retain_reference" in p.needs
    assert reg.metric("extraction_strength").direction == "lower"
    assert reg.metric_function("mia_loss") is loss_score


def test_import_is_torch_free():
    code = "import sys, qrerase.metrics.registry as r; r.metric('privleak'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _kw(**over):
    kw = dict(label="X", direction="higher", tracks=("tofu",), needs=("forget",), aggregate="mean", fn="math:fsum")
    kw.update(over)
    return kw


@pytest.mark.parametrize(
    "name, over, match",
    [
        ("mia_loss", {}, "metric 'mia_loss' is already registered"),
        ("bad name", {}, "expected an identifier"),
        ("x", {"direction": "up"}, "direction must be one of"),
        ("x", {"direction": "target"}, "needs a finite target value"),
        ("x", {"direction": "target", "target": math.nan}, "needs a finite target value"),
        ("x", {"target": 0.5}, "needs direction 'target'"),
        ("x", {"tracks": ("mnist",)}, "tracks must be among"),
        ("x", {"tracks": ()}, "tracks must be among"),
        ("x", {"needs": ("oracle",)}, r"unknown need\(s\) \['oracle'\]"),
        ("x", {"aggregate": "median"}, "aggregate must be one of"),
        ("x", {"aggregate": "relative"}, "`of` is given exactly"),
        ("x", {"of": "mia_loss"}, "`of` is given exactly"),
        ("x", {"aggregate": "relative", "of": "nope"}, "unregistered metric 'nope'"),
        ("x", {"fn": "no_colon"}, "fn must be a callable"),
    ],
)
def test_registration_errors(scratch, name, over, match):
    with pytest.raises(reg.MetricError, match=match) as exc:
        scratch.register_metric(name, **_kw(**over))
    assert "\n" not in str(exc.value)
    assert name not in scratch.metric_names() or name == "mia_loss"


def test_register_and_lookup(scratch):
    m = scratch.register_metric("my_metric", **_kw(direction="target", target=1, fn=math.fsum))
    assert m.target == 1.0 and scratch.metric_names()[-1] == "my_metric"
    assert scratch.metric_function("my_metric") is math.fsum
    scratch.register_metric("broken", **_kw(fn="math:no_such_function"))
    with pytest.raises(reg.MetricError, match="'math:no_such_function' cannot be loaded"):
        scratch.metric_function("broken")
    with pytest.raises(reg.MetricError, match="unknown metric 'nope'"):
        scratch.metric("nope")
    with pytest.raises(reg.MetricError, match="unknown track"):
        scratch.metrics_for("mnist")


def test_distance_and_best(scratch):
    scratch.register_metric("hi", **_kw(direction="higher"))
    scratch.register_metric("lo", **_kw(direction="lower"))
    rows = {"a": 0.2, "b": 0.7, "c": 0.45, "d": math.nan}
    assert [reg.distance_to_ideal("hi", v) for v in (0.2, 0.7)] == [-0.2, -0.7]
    assert [reg.distance_to_ideal("lo", v) for v in (0.2, 0.7)] == [0.2, 0.7]
    assert reg.distance_to_ideal("mia_loss", 0.45) == pytest.approx(0.05)
    assert reg.distance_to_ideal("privleak", -12.5) == 12.5
    assert reg.distance_to_ideal("hi", math.nan) == math.inf
    assert reg.best_of("hi", rows) == ["b"]
    assert reg.best_of("lo", rows) == ["a"]
    assert reg.best_of("mia_loss", rows) == ["c"]  # closest to 0.5
    assert reg.best_of("privleak", {"qr": -3.0, "ga": 2.0, "npo": -2.0}) == ["ga", "npo"]  # tie in |value|
    assert reg.best_of("mia_loss", {"x": 0.51, "y": 0.4901}, rel_tol=0.05) == ["x", "y"]
    assert reg.best_of("hi", {"a": math.nan}) == []
    with pytest.raises(reg.MetricError, match="value 'abc' is not a number"):
        reg.distance_to_ideal("hi", "abc")
