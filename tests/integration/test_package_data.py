"""A non-editable install finds its data: the schema and the embedded default config.yaml are package
data of ``qrerase.workflow`` (links into the checkout's schemas/ and config.yaml). The test builds an
sdist from a copy of the checkout, a wheel from that sdist (offline: setuptools from this environment,
no build isolation), unpacks the wheel and, outside the checkout, validates the default config and
plans it with ``qrerase plan`` from the wheel's own files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from support import REPO as ROOT

DATA = {"config.schema.yaml": ROOT / "schemas" / "config.schema.yaml", "config.yaml": ROOT / "config.yaml"}


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("package")
    src = tmp / "src"
    src.mkdir()
    # what the build reads, links kept as links (as in a git checkout)
    shutil.copytree(ROOT / "qrerase", src / "qrerase", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "schemas", src / "schemas", symlinks=True)
    for name in ("pyproject.toml", "README.md", "config.yaml", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    code = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    sdist = tmp / "sdist" / _run([sys.executable, "-c", code, str(tmp / "sdist")], src).stdout.split()[-1]
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    _run([*pip, "-w", str(tmp / "dist"), str(sdist)], tmp)
    (whl,) = (tmp / "dist").glob("qrerase-*.whl")
    return whl


def test_wheel_holds_the_files_not_links(wheel):
    with zipfile.ZipFile(wheel) as z:
        for name, source in DATA.items():
            info = z.getinfo(f"qrerase/workflow/{name}")
            assert (info.external_attr >> 16) & 0o170000 != 0o120000, f"{name} is a link in the wheel"
            assert z.read(info) == source.read_bytes(), f"{name} in the wheel differs from {source}"


def test_installed_wheel_validates_and_plans_the_default_config(wheel, tmp_path, monkeypatch, capsys):
    from qrerase.cli import main

    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    code = """
import sys, yaml
from pathlib import Path
import qrerase
from qrerase.cli import main
from qrerase.workflow import plan_config, validation
site = Path(sys.argv[1]).resolve()
assert Path(qrerase.__file__).resolve().is_relative_to(site), qrerase.__file__
for path in (validation.SCHEMA_PATH, plan_config.DEFAULT_CONFIG):
    assert path.is_relative_to(site) and path.is_file() and not path.is_symlink(), path
schema = validation.load_schema()
assert schema["properties"]["tracks"]["items"]["enum"], "registry enums injected"
validation.validate(yaml.safe_load(plan_config.DEFAULT_CONFIG.read_text()))
sys.exit(main(["plan", "--configfile", sys.argv[2]]))
"""
    # run outside the checkout (its qrerase is not importable there); the config's data paths are
    # relative to the working directory, as in a run
    work = tmp_path / "work"
    work.mkdir()
    (work / "data").symlink_to(ROOT / "data")
    over = work / "over.yaml"  # the smallest override: every other key from the wheel's config.yaml
    over.write_text(yaml.safe_dump({"seed": 0}))
    proc = _run([sys.executable, "-c", code, str(site), str(over)], work, env)
    monkeypatch.chdir(work)
    assert main(["plan", "--configfile", str(over)]) == 0  # the checkout's plan of the same config
    assert proc.stdout == capsys.readouterr().out and ":pretrain |" in proc.stdout
