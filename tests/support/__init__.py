"""The tests' shared helpers, in one place: test modules import from here, never from each other.

The tests are in three layers (tests/unit/test_test_layers.py checks the layout):

- ``tests/unit/``: a library function on small in-memory data; no subprocess, no model training.
- ``tests/integration/``: several modules together: real training on tiny data, planning and
  ``snakemake`` dry runs, subprocesses (the library's CLI, torchrun, a fresh interpreter, external tools).
- ``tests/workflow/``: end-to-end ``snakemake`` runs through the CLI; each module has tests marked
  ``workflow`` (pyproject.toml's markers), and no module outside this folder has.

``tests/`` is on ``sys.path`` (pyproject.toml: ``[tool.pytest.ini_options] pythonpath``), so a test imports
``support.<module>``; a subprocess that needs these helpers gets :data:`PYTHONPATH`.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The tests folder and the checkout it belongs to.
TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
#: The small test configs (tests/configs) and the toy plug-ins (tests/plugins).
CONFIGS = TESTS / "configs"
PLUGINS = TESTS / "plugins"
#: Every rules file (rules/*.smk and each folder's: rules/<track>/*.smk) and every workflow script.
RULES_FILES = sorted((REPO / "rules").rglob("*.smk"))
SCRIPTS = sorted((REPO / "workflow_scripts").rglob("*.py"))


def track_rules_file(name: str, which: str) -> Path:
    """Track ``name``'s rules file ``which`` (``"rules"`` or ``"common"``): ``rules/<name>/<which>.smk`` for a
    track in its folder, else ``rules/<name>.smk`` / ``rules/<name>_common.smk``."""
    folder = REPO / "rules" / name
    if folder.is_dir():
        return folder / f"{which}.smk"
    return REPO / "rules" / (f"{name}.smk" if which == "rules" else f"{name}_common.smk")


#: ``PYTHONPATH`` for a subprocess that imports the library and these helpers.
PYTHONPATH = os.pathsep.join([str(REPO), str(TESTS)])
