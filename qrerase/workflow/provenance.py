"""Artifact provenance: content hashes and per-output records.

Every workflow job (through :func:`qrerase.workflow.job.job`) writes, after its body succeeded, one JSON
record per declared output under ``results/provenance/records/<output path>.json``. A record holds the
rule, wildcards, params, the config subset the job used, the sha256 of every input and every output,
the code version (git commit and dirty flag of the workflow checkout, the library version), the
versions of the scientific stack, the machine (CPU model, logical cores), the seed, the thread count
and the start/end times.

Hashes (:func:`hash_path`):

- a file: ``sha256(bytes)``;
- a directory: ``sha256`` of the UTF-8 text ``"<relative posix path>\\t<sha256 of file>\\n"`` over
  its files sorted by path (recursively; Snakemake's ``.snakemake_timestamp`` marker is ignored), so
  the hash depends on names and contents only, never on mtimes or the filesystem's listing order.

The artifact-graph manifest and the audit built on the records are :mod:`qrerase.workflow.manifest`.
Nothing here imports torch or Snakemake; the module only needs the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from ..io import hash_file

__all__ = [
    "RECORD_DIR",
    "MANIFEST",
    "PACKAGES",
    "hash_file",
    "hash_path",
    "artifact",
    "code_version",
    "package_versions",
    "machine_info",
    "config_subset",
    "RecordingDict",
    "build_record",
    "record_path",
    "write_records",
    "remove_records",
    "load_records",
    "Problem",
]

RECORD_DIR = "results/provenance/records"
MANIFEST = "results/provenance/manifest.json"
SCHEMA = 1
#: Distributions whose versions every record holds (besides Python itself).
PACKAGES = (
    "qrerase",
    "torch",
    "transformers",
    "peft",
    "scipy",
    "numpy",
    "snakemake",
    "safetensors",
    "pandas",
    "tokenizers",
)
#: File names never hashed inside directory artifacts (Snakemake's marker for directory outputs).
IGNORED_NAMES = frozenset({".snakemake_timestamp"})


# ---------------------------------------------------------------------------------------------
# Hashing.
# ---------------------------------------------------------------------------------------------
def _dir_files(root: Path) -> list[Path]:
    files = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        files += [Path(dirpath) / f for f in filenames if f not in IGNORED_NAMES]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def hash_path(path: str | os.PathLike) -> str:
    """sha256 (hex) of a file, or of a directory's sorted (relative path, file sha256) listing.

    Raises FileNotFoundError naming the path when it does not exist.
    """
    path = Path(path)
    if path.is_file():
        return hash_file(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory")
    digest = hashlib.sha256()
    for f in _dir_files(path):
        digest.update(f"{f.relative_to(path).as_posix()}\t{hash_file(f)}\n".encode())
    return digest.hexdigest()


def artifact(path: str | os.PathLike) -> dict[str, Any]:
    """``{"path", "kind": "file"|"directory", "sha256", "bytes"}`` of an existing file or directory."""
    p = Path(path)
    if p.is_dir():
        size = sum(f.stat().st_size for f in _dir_files(p))
        kind = "directory"
    elif p.is_file():
        size, kind = p.stat().st_size, "file"
    else:
        raise FileNotFoundError(f"{p}: no such file or directory")
    return {"path": str(path), "kind": kind, "sha256": hash_path(p), "bytes": size}


# ---------------------------------------------------------------------------------------------
# Code and environment versions.
# ---------------------------------------------------------------------------------------------
def code_version(workflow_dir: str | os.PathLike) -> dict[str, Any]:
    """Git commit and dirty flag of the workflow checkout, and the library version.

    ``git_commit`` / ``git_dirty`` are ``"unknown"`` when ``workflow_dir`` is not inside a git
    checkout (or git is missing). The dirty flag ignores ``results/`` and ``.snakemake/`` (a run inside
    the checkout writes there) and untracked files ignored by ``.gitignore``.
    """
    from .. import __version__

    out: dict[str, Any] = {"git_commit": "unknown", "git_dirty": "unknown", "qrerase": __version__}
    try:
        commit = subprocess.run(
            ["git", "-C", str(workflow_dir), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
        if commit.returncode != 0:
            return out
        status = subprocess.run(
            [
                "git",
                "-C",
                str(workflow_dir),
                "status",
                "--porcelain",
                "--",
                ".",
                ":(exclude)results",
                ":(exclude).snakemake",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return out
    out["git_commit"] = commit.stdout.strip()
    if status.returncode == 0:
        out["git_dirty"] = bool(status.stdout.strip())
    return out


def package_versions(packages: Iterable[str] = PACKAGES) -> dict[str, str]:
    """Python's version and each distribution's installed version (``"not installed"`` if absent)."""
    versions = {"python": platform.python_version()}
    for name in packages:
        if name == "qrerase":
            from .. import __version__

            versions[name] = __version__
            continue
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def machine_info() -> dict[str, Any]:
    """The machine a job runs on: ``{"cpu": model name, "logical_cpus": count, "system": OS and arch}``.

    The CPU model is the first ``model name`` of ``/proc/cpuinfo`` (Linux), else ``platform.processor()``,
    else ``"unknown"``; ``logical_cpus`` is ``os.cpu_count()`` (the machine's, not the job's share).
    """
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    cpu = value.strip()
                    break
    except OSError:
        pass
    cpu = cpu or platform.processor() or "unknown"
    return {"cpu": cpu, "logical_cpus": os.cpu_count() or 0, "system": f"{platform.system()} {platform.machine()}"}


# ---------------------------------------------------------------------------------------------
# The config subset a job used.
# ---------------------------------------------------------------------------------------------
class RecordingDict(dict):
    """A dict that records the dotted key paths read from it (nested dicts are wrapped in turn).

    :func:`qrerase.workflow.job.job` swaps ``snakemake.config`` for one so that config keys a script
    reads directly (not through ``params``) still enter the job's record.
    """

    def __init__(self, data: Mapping, prefix: str = "", accessed: set | None = None):
        super().__init__(data)
        self._prefix = prefix
        self.accessed: set[str] = set() if accessed is None else accessed

    def __getitem__(self, key):
        value = super().__getitem__(key)
        dotted = f"{self._prefix}{key}"
        self.accessed.add(dotted)
        if isinstance(value, Mapping):
            return RecordingDict(value, f"{dotted}.", self.accessed)
        return value

    def get(self, key, default=None):
        return self[key] if key in self else default


def _config_paths(node: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            yield dotted, value
            yield from _config_paths(value, f"{dotted}.")


def _lookup(config: Mapping, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node[part]
    return node


def config_subset(config: Mapping, params: Mapping[str, Any], accessed: Iterable[str] = ()) -> dict[str, Any]:
    """The config entries a job used, as ``{dotted key: value}``.

    By the workflow's convention a rule passes the config it uses as ``params``; a param counts as
    the config key(s) it equals — any key for a mapping or a non-empty list, only keys whose last
    component ends with the param's name for a scalar (``rank`` ↔ ``unlearn.rank``, ``granularity`` ↔
    ``unlearn.energy_granularity``), so that unrelated equal numbers do not match. Keys read directly
    (``accessed``, from :class:`RecordingDict`) are added; a key inside another kept key is dropped.
    """
    keys: set[str] = set()
    paths = list(_config_paths(config))
    for name, value in params.items():
        structured = isinstance(value, Mapping) or (isinstance(value, (list, tuple)) and len(value) > 0)
        for dotted, cfg_value in paths:
            if isinstance(value, (list, tuple)) and isinstance(cfg_value, (list, tuple)):
                equal = list(value) == list(cfg_value)
            else:
                equal = type(value) is type(cfg_value) and value == cfg_value
            if not equal:
                continue
            if structured or dotted.rsplit(".", 1)[-1].endswith(str(name)):
                keys.add(dotted)
    # Of the direct reads keep the deepest (reading config["a"]["b"] records "a" and "a.b").
    accessed = set(accessed)
    keys |= {k for k in accessed if not any(o.startswith(k + ".") for o in accessed)}
    kept = sorted(k for k in keys if not any(k.startswith(o + ".") for o in keys))
    return {k: _lookup(config, k) for k in kept}


# ---------------------------------------------------------------------------------------------
# Records.
# ---------------------------------------------------------------------------------------------
def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


def build_record(
    *,
    rule: str,
    wildcards: Mapping[str, str],
    params: Mapping[str, Any],
    config: Mapping,
    inputs: Iterable[str],
    outputs: Iterable[str],
    seed: int | None,
    threads: int,
    start: float,
    end: float,
    workflow_dir: str | os.PathLike,
    accessed: Iterable[str] = (),
    world_size: int = 1,
) -> dict[str, Any]:
    """The provenance record of one finished job (hashes every input and output now).

    ``start`` / ``end`` are POSIX times; ``threads`` the job's threads, ``world_size`` its number of
    processes (``accelerate launch --num_processes``; 1 for a plain job). Raises FileNotFoundError when an
    input or output is missing.
    """
    outputs = list(dict.fromkeys(str(o) for o in outputs))
    inputs = list(dict.fromkeys(str(i) for i in inputs))
    if not outputs:
        raise ValueError(f"rule {rule}: a provenance record needs at least one output")
    return {
        "schema": SCHEMA,
        "rule": rule,
        "wildcards": dict(wildcards),
        "params": json.loads(json.dumps(dict(params), default=str)),
        "config": json.loads(json.dumps(config_subset(config, params, accessed), default=str)),
        "inputs": [artifact(i) for i in inputs],
        "outputs": [artifact(o) for o in outputs],
        "code": code_version(workflow_dir),
        "versions": package_versions(),
        "machine": machine_info(),
        "seed": seed,
        "threads": int(threads),
        "world_size": int(world_size),
        "start": _iso(start),
        "end": _iso(end),
        "duration_s": round(end - start, 3),
    }


def record_path(output: str | os.PathLike, root: str | os.PathLike = ".") -> Path:
    """Where the record of ``output`` (a path relative to the working directory) lives.

    ``results/a/b.csv`` → ``results/provenance/records/a/b.csv.json``; an output outside ``results/``
    goes under ``records/_outside/``.
    """
    rel = Path(output).as_posix()
    if rel.startswith("results/"):
        rel = rel[len("results/") :]
    else:
        rel = "_outside/" + rel.lstrip("/")
    return Path(root) / RECORD_DIR / f"{rel}.json"


def write_records(record: Mapping[str, Any], root: str | os.PathLike = ".") -> list[Path]:
    """Write the record once per output (atomically: temporary sibling, then rename)."""
    from ..io import write_json

    written = []
    for out in record["outputs"]:
        target = record_path(out["path"], root)
        write_json(target, record)
        written.append(target)
    return written


def remove_records(outputs: Iterable[str], root: str | os.PathLike = ".") -> None:
    """Delete existing records of these outputs (a job about to re-create them, or a failed job)."""
    for out in outputs:
        record_path(out, root).unlink(missing_ok=True)


_REQUIRED = ("rule", "inputs", "outputs", "code", "versions", "start", "end")


def load_records(root: str | os.PathLike = ".") -> tuple[dict[str, dict], list[Problem]]:
    """All records under ``root``: ``({output path: record}, problems with unreadable records)``."""
    base = Path(root) / RECORD_DIR
    records: dict[str, dict] = {}
    problems: list[Problem] = []
    if not base.is_dir():
        return records, problems
    for f in sorted(base.rglob("*.json")):
        name = f.relative_to(Path(root)).as_posix()
        try:
            rec = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(Problem(name, f"unreadable provenance record ({exc})"))
            continue
        missing = [k for k in _REQUIRED if not isinstance(rec, dict) or k not in rec]
        if missing:
            problems.append(Problem(name, f"malformed provenance record (missing {', '.join(missing)})"))
            continue
        owner = next((o["path"] for o in rec["outputs"] if record_path(o["path"], root) == f), None)
        if owner is None:
            problems.append(Problem(name, "provenance record lists no output stored under this name"))
            continue
        records[owner] = rec
    return records, problems


@dataclass(frozen=True)
class Problem:
    """One broken artifact (or record) and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"
