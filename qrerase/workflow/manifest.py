"""The artifact-graph manifest and the audit, built on the provenance records.

:func:`build_manifest` walks back from the workflow's targets through the records
(:mod:`qrerase.workflow.provenance`) to the source files (the artifact graph: nodes with their sha256
and producing rule, input → output edges). :func:`audit` re-hashes every recorded artifact and checks
every record and every input → output link. Standard library only.

Wall times differ between runs: Snakemake's benchmark files (``results/benchmarks/``) and every
artifact made from them (the cost tables) are listed apart, under ``wall_time``, without hashes, so
two clean runs give the same manifest. Their records still hold their hashes, which the audit checks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .provenance import MANIFEST, RECORD_DIR, SCHEMA, Problem, hash_path, load_records, record_path

__all__ = ["BENCHMARK_DIR", "WALL_TIME_NOTE", "build_manifest", "missing_artifacts", "audit", "workdir_of"]

#: Snakemake's benchmark files (wall time, memory of each job): ``results/benchmarks/<rule>/<job>.tsv``.
BENCHMARK_DIR = "results/benchmarks"
WALL_TIME_NOTE = (
    "wall times differ between runs: Snakemake's benchmark files and the artifacts made from them, "
    "listed without hashes (their provenance records hold the hashes the audit checks)"
)


def _wall_time(artifacts: Iterable[str], edges: Iterable[tuple[str, str, str]]) -> set[str]:
    """The benchmark files among ``artifacts`` and everything made from them (transitively)."""
    timed = {p for p in artifacts if p.startswith(BENCHMARK_DIR + "/")}
    edges = list(edges)
    grew = True
    while grew:
        more = {b for a, b, _ in edges if a in timed and b not in timed}
        timed |= more
        grew = bool(more)
    return timed


def build_manifest(targets: Iterable[str], root: str | os.PathLike = ".") -> dict[str, Any]:
    """The artifact graph behind ``targets``, from their records back to the source files.

    Returns ``{"schema", "targets", "artifacts": {path: {kind, sha256, bytes, rule, record}}, "edges":
    [{"from", "to", "sha256"}], "wall_time": {"note", "artifacts": {path: {kind, rule, record}},
    "edges": [{"from", "to"}]}}`` with sorted keys and edges; artifacts without a record are sources
    (``rule: null``); benchmark files and what is made from them are under ``wall_time``, unhashed.
    Raises ValueError naming a target without a provenance record.
    """
    records, problems = load_records(root)
    if problems:
        raise ValueError("; ".join(f"{p.path}: {p.reason}" for p in problems))
    targets = [str(t) for t in targets]
    artifacts: dict[str, dict] = {}
    edges: set[tuple[str, str, str]] = set()
    todo = list(targets)
    for t in targets:
        if t not in records:
            raise ValueError(f"{t}: no provenance record (was it produced by a job using qrerase.workflow.job.job?)")
    while todo:
        path = todo.pop()
        if path in artifacts:
            continue
        rec = records.get(path)
        if rec is None:
            continue
        out = next(o for o in rec["outputs"] if o["path"] == path)
        artifacts[path] = {
            "kind": out["kind"],
            "sha256": out["sha256"],
            "bytes": out["bytes"],
            "rule": rec["rule"],
            "wildcards": rec.get("wildcards", {}),
            "record": record_path(path).as_posix(),
        }
        for inp in rec["inputs"]:
            edges.add((inp["path"], path, inp["sha256"]))
            if inp["path"] in records:
                todo.append(inp["path"])
            elif inp["path"] not in artifacts:
                artifacts[inp["path"]] = {
                    "kind": inp["kind"],
                    "sha256": inp["sha256"],
                    "bytes": inp["bytes"],
                    "rule": None,
                    "wildcards": {},
                    "record": None,
                }
    timed = _wall_time(artifacts, edges)
    unhashed = {k: {f: v for f, v in artifacts[k].items() if f not in ("sha256", "bytes")} for k in sorted(timed)}
    return {
        "schema": SCHEMA,
        "targets": sorted(targets),
        "artifacts": {k: artifacts[k] for k in sorted(artifacts) if k not in timed},
        "edges": [{"from": a, "to": b, "sha256": h} for a, b, h in sorted(edges) if b not in timed],
        "wall_time": {
            "note": WALL_TIME_NOTE,
            "artifacts": unhashed,
            "edges": [{"from": a, "to": b} for a, b, _ in sorted(edges) if b in timed],
        },
    }


def missing_artifacts(targets: Iterable[str], root: str | os.PathLike = ".") -> list[str]:
    """The holes of a working directory: artifacts of its last manifest (:data:`MANIFEST`) that a rule
    made, that lead to one of ``targets`` in the manifest's graph, and that are missing now.

    Snakemake remakes a missing file that a target names, but not a missing intermediate whose
    consumers look up to date: an evaluation folder deleted by hand, or removed by a ``--forcerun``
    that was killed before the job wrote it again, would stay missing (and the audit fail). The
    default target names these holes (the Snakefile's rule ``all``), so a plain rerun remakes them and
    then whatever was made from them. Sorted; empty where there is no readable manifest.
    """
    root = Path(root)
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        made = {p for p, a in manifest["artifacts"].items() if a.get("rule")}
        made |= {p for p, a in manifest["wall_time"]["artifacts"].items() if a.get("rule")}
        edges = [(e["from"], e["to"]) for e in (*manifest["edges"], *manifest["wall_time"]["edges"])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    feeds: dict[str, set[str]] = {}
    for a, b in edges:
        feeds.setdefault(b, set()).add(a)
    needed, todo = set(), [str(t) for t in targets]
    while todo:
        path = todo.pop()
        if path not in needed:
            needed.add(path)
            todo.extend(feeds.get(path, ()))
    return sorted(p for p in made & needed if not os.path.lexists(root / p))


def _short(h: str | None) -> str:
    return "missing" if h is None else h[:12]


def _since(producer: dict, consumer: dict | None, event: str, remade: str) -> str:
    """Why a consumer's hash of an artifact differs from its producer's record: a re-make when the
    producer's record is newer than the consumer's start, otherwise a mismatch (a record or an
    artifact was edited after the fact: a job never ends after a job that used its output started)."""
    if consumer is None or str(producer.get("end", "")) > str(consumer.get("start", "")):
        return remade
    return (
        f"MISMATCH: the producer's record ends {producer.get('end')}, before {event} ({consumer.get('start')}), "
        "so this is no re-make: a record or an artifact was edited"
    )


def workdir_of(results_dir: str | os.PathLike) -> Path:
    """The Snakemake working directory of a ``results/`` folder: its parent as written, symlinks kept.

    Records name artifacts relative to the working directory (``results/...``, ``data/...``). When
    ``results/`` is a symlink (results on scratch) its resolved parent is the scratch folder, where
    the sources are not; the lexical parent (``os.path.abspath``, which resolves no symlink) is the
    working directory wherever the checkout was moved to. Given the scratch folder itself (its
    lexical parent is scratch), the current directory is taken when its ``results`` is that folder.
    """
    lexical = Path(os.path.abspath(results_dir)).parent
    here = Path.cwd()
    if (
        lexical != here
        and (here / "results").is_dir()
        and Path(results_dir).is_dir()
        and (here / "results").samefile(results_dir)
        and (here / "results").is_symlink()
    ):
        return here
    return lexical


def audit(
    results_dir: str | os.PathLike, workdir: str | os.PathLike | None = None
) -> tuple[list[Problem], dict[str, int]]:
    """Re-hash every recorded artifact and check every record, input → output link and the manifest.

    ``results_dir`` is the workflow's ``results/`` folder (a symlink to scratch is fine); record paths
    are relative to the Snakemake working directory, ``workdir`` or else :func:`workdir_of`. Returns
    ``(problems, counts)``; no problems means that every output still has the hash its record holds,
    every input still has the hash it had when it was used, every produced input's hash equals the hash
    its own producer recorded (no job consumed an older version of an artifact that was re-made since),
    and the manifest agrees with the records.
    """
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise FileNotFoundError(f"{results_dir}: not a directory")
    root = Path(workdir) if workdir is not None else workdir_of(results_dir)
    if not (root / "results").is_dir() or not (root / "results").samefile(results_dir):
        raise ValueError(
            f"{results_dir}: not the results/ folder of working directory {root} "
            "(pass the working directory's results/ path, or --workdir)"
        )
    records, problems = load_records(root)
    if not records and not problems:
        return [Problem(str(results_dir), f"no provenance records under {RECORD_DIR}")], {"records": 0, "artifacts": 0}

    cache: dict[str, str | None] = {}

    def current(path: str) -> str | None:
        if path not in cache:
            p = Path(path) if Path(path).is_absolute() else root / path
            cache[path] = hash_path(p) if p.exists() else None
        return cache[path]

    for path, rec in sorted(records.items()):
        out = next(o for o in rec["outputs"] if o["path"] == path)
        now = current(path)
        if now is None:
            problems.append(Problem(path, f"missing (recorded by rule {rec['rule']})"))
        elif now != out["sha256"]:
            problems.append(Problem(path, f"modified (sha256 recorded {_short(out['sha256'])}, now {_short(now)})"))
        for inp in rec["inputs"]:
            ipath, used = inp["path"], inp["sha256"]
            producer = records.get(ipath)
            if producer is not None:
                made = next(o for o in producer["outputs"] if o["path"] == ipath)["sha256"]
                if made != used:
                    problems.append(
                        Problem(
                            path,
                            (
                                f"produced from input {ipath} whose recorded hash {_short(used)} is not the hash its "
                                f"producer (rule {producer['rule']}) recorded, {_short(made)}: "
                                + _since(producer, rec, "this job started", "the input was re-made since")
                            ),
                        )
                    )
                    continue
            now_in = current(ipath)
            if now_in is None:
                problems.append(Problem(path, f"produced from input {ipath}, which is missing"))
            elif now_in != used:
                problems.append(
                    Problem(
                        path,
                        (
                            f"produced from input {ipath} whose hash no longer matches "
                            f"(recorded {_short(used)}, now {_short(now_in)})"
                        ),
                    )
                )

    manifest = root / MANIFEST
    n_manifest = 0
    if manifest.is_file():
        try:
            graph = json.loads(manifest.read_text(encoding="utf-8"))
            nodes = graph["artifacts"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            problems.append(Problem(MANIFEST, f"unreadable manifest ({exc})"))
            graph, nodes = {}, {}
        n_manifest = len(nodes)
        for path, node in sorted(nodes.items()):
            record = records.get(path)
            if node.get("rule") is not None and record is None:
                problems.append(Problem(path, "listed in the manifest but has no provenance record"))
            elif record is not None:
                made = next(o for o in record["outputs"] if o["path"] == path)["sha256"]
                if made != node.get("sha256"):
                    problems.append(
                        Problem(
                            path,
                            (
                                f"manifest hash {_short(node.get('sha256'))} differs from its record's {_short(made)}: "
                                + _since(
                                    record,
                                    records.get(MANIFEST),
                                    "the manifest was built",
                                    "re-made after the manifest was built",
                                )
                            ),
                        )
                    )
            elif current(path) != node.get("sha256"):
                problems.append(
                    Problem(
                        path,
                        (
                            f"source file of the manifest changed (sha256 recorded {_short(node.get('sha256'))}, "
                            f"now {_short(current(path))})"
                        ),
                    )
                )
        timed = graph.get("wall_time", {}).get("artifacts", {}) if isinstance(graph, dict) else {}
        for path, node in sorted(timed.items()):
            if node.get("rule") is not None and path not in records:
                problems.append(Problem(path, "listed in the manifest (wall time) but has no provenance record"))
    unique = list(dict.fromkeys(problems))
    return unique, {"records": len(records), "artifacts": len(cache), "manifest_artifacts": n_manifest}
