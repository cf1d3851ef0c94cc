"""Values of the registered metrics per model: read from a ``sequence_metrics.json`` (rule evaluate,
:func:`qrerase.metrics.scoring.track_sequence_metrics`) and laid out as table rows, with each ``relative``
metric (PrivLeak) computed against a reference row. Torch-free (table jobs import it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .registry import metric, metric_function

__all__ = ["load_sequence_metrics", "metric_rows"]


def load_sequence_metrics(path: str | os.PathLike) -> dict[str, float]:
    """The ``metrics`` mapping (metric name -> value) of one ``sequence_metrics.json`` (rule evaluate).
    ValueError (one line naming the file) when it is not such a file."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))["metrics"]
        return {str(k): float(v) for k, v in values.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a sequence_metrics.json with a 'metrics' mapping ({exc})") from None


def metric_rows(
    values: Mapping[str, Mapping[str, float]], names: Sequence[str], reference: str = "retain"
) -> list[dict[str, float | str]]:
    """One row per model of ``values`` (model -> metric name -> value, in row order): ``method`` and
    each metric of ``names`` (registered; NaN when the model lacks it). A ``relative`` metric
    (PrivLeak) is its registered function of the model's and the ``reference`` row's values of the
    metric it is relative to (NaN without a reference row or either value, or when the function
    rejects them with a ValueError: PrivLeak with a reference AUC of 1); the reference row's own
    PrivLeak is therefore 0."""
    rows = []
    for model, vals in values.items():
        row: dict[str, float | str] = {"method": model}
        for n in names:
            m = metric(n)
            if m.aggregate != "relative":
                row[n] = float(vals.get(n, np.nan))
                continue
            assert m.of is not None  # a relative metric names the metric it is computed from
            ref, own = values.get(reference, {}).get(m.of), vals.get(m.of)
            try:
                row[n] = float(metric_function(n)(own, ref)) if ref is not None and own is not None else np.nan
            except ValueError:  # outside the function's domain (PrivLeak: an AUC outside [0, 1], a reference AUC of 1)
                row[n] = np.nan
        rows.append(row)
    return rows
