"""Config sections → dataclasses, and the model options every job reads (torch-free).

:func:`from_mapping` is the one strict constructor of the library's config dataclasses (unknown keys
are a one-line ``ValueError`` naming them and the allowed keys); :func:`model_options` gives the
``dtype`` / ``device`` of a ``model`` section with their defaults (``float32``, ``cpu``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["from_mapping", "model_options", "DEFAULT_DTYPE", "DEFAULT_DEVICE"]

DEFAULT_DTYPE = "float32"
DEFAULT_DEVICE = "cpu"


def from_mapping(cls, d: Mapping[str, Any] | None, what: str):
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys with a clear message.

    ``what`` names the config section in the message: ``"{what}: unknown key(s) [...]; allowed: [...]"``.
    """
    d = dict(d or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    return cls(**d)


def model_options(cfg: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(dtype, device)`` of a ``model`` config section: ``cfg["dtype"]`` (default ``float32``) and
    ``cfg["device"]`` (default ``cpu``)."""
    cfg = {} if cfg is None else cfg
    return cfg.get("dtype", DEFAULT_DTYPE), cfg.get("device", DEFAULT_DEVICE)
