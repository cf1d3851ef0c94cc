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

__all__ = [
    "BENCHMARK_DIR",
    "FINAL_DIRS",
    "WALL_TIME_NOTE",
    "build_manifest",
    "missing_artifacts",
    "audit",
    "remove_broken",
    "workdir_of",
]

#: Snakemake's benchmark files (wall time, memory of each job): ``results/benchmarks/<rule>/<job>.tsv``.
BENCHMARK_DIR = "results/benchmarks"
#: Where the run's final artifacts live: each file there must have a provenance record (the audit).
FINAL_DIRS = ("results/tables/", "results/figures/")
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
    return _graph(targets, records)


def _graph(targets: Iterable[str], records: dict[str, dict]) -> dict[str, Any]:
    """:func:`build_manifest` on records already loaded."""
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
    remake = f"`qrerase audit {results_dir} --remove-broken`, then the same snakemake command"

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
            problems.append(
                Problem(
                    path,
                    f"modified (sha256 recorded {_short(out['sha256'])}, now {_short(now)}); "
                    f"{remake}, remakes it and what was made from it",
                )
            )
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

    on_disk = _final_files(root)
    problems += _unrecorded(records, root, on_disk, remake)
    manifest = root / MANIFEST
    n_manifest = 0
    finals = sorted({p for p in records if p.startswith(FINAL_DIRS)} | set(on_disk))
    if not manifest.is_file() and finals:
        problems.append(
            Problem(
                MANIFEST,
                (
                    f"missing, though {len(finals)} tables and figures were built (e.g. {finals[0]}): a run "
                    "without its artifact graph is not complete; the default target (`snakemake --cores N`) "
                    "builds it"
                ),
            )
        )
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
        if nodes or timed:
            problems += _manifest_holes(graph, {**nodes, **timed}, records)
    unique = list(dict.fromkeys(problems))
    return unique, {"records": len(records), "artifacts": len(cache), "manifest_artifacts": n_manifest}


def _recorded(path: str, records: dict[str, dict]) -> bool:
    """Whether ``path`` is a recorded artifact or a file inside a recorded directory artifact."""
    parts = path.split("/")
    return any("/".join(parts[:i]) in records for i in range(len(parts), 0, -1))


def _final_files(root: Path) -> list[str]:
    """The files under :data:`FINAL_DIRS`, relative to the working directory, sorted."""
    return sorted(
        f.relative_to(root).as_posix() for final in FINAL_DIRS for f in (root / final).rglob("*") if f.is_file()
    )


def _unrecorded(records: dict[str, dict], root: Path, on_disk: list[str], remake: str) -> list[Problem]:
    """Artifacts a job must have made that have no record: each file under :data:`FINAL_DIRS` (``on_disk``), and each
    input under ``results/`` (Snakemake's benchmark files aside) that a recorded job used. A deleted
    record, or a table written by hand, is not an artifact the audit can vouch for."""
    problems = [
        Problem(rel, f"no provenance record: no recorded job made it, or its record was deleted; {remake}")
        for rel in on_disk
        if not _recorded(rel, records)
    ]
    used: dict[str, str] = {}
    for path, rec in sorted(records.items()):
        for inp in rec["inputs"]:
            ipath = inp["path"]
            if ipath.startswith("results/") and not ipath.startswith(BENCHMARK_DIR + "/"):
                used.setdefault(ipath, f"{path} (rule {rec['rule']})")
    for ipath, consumer in sorted(used.items()):
        if not _recorded(ipath, records) and not ipath.startswith(FINAL_DIRS):
            problems.append(Problem(ipath, f"input of {consumer} but has no provenance record"))
    return problems


def _manifest_holes(graph: dict, nodes: dict[str, dict], records: dict[str, dict]) -> list[Problem]:
    """The manifest against the records: it must list every artifact that the records place behind its
    targets, and its own record must list those targets as its inputs."""
    problems = []
    targets = [str(t) for t in graph.get("targets", [])]
    own = records.get(MANIFEST)
    if own is None:
        problems.append(Problem(MANIFEST, "no provenance record (rule provenance_manifest writes one)"))
    elif sorted({i["path"] for i in own["inputs"]}) != sorted(set(targets)):
        problems.append(Problem(MANIFEST, "its targets are not the inputs its provenance record lists"))
    try:
        implied = _graph([t for t in targets if t in records], records)
    except (KeyError, TypeError, StopIteration):
        return problems
    for path in sorted({*implied["artifacts"], *implied["wall_time"]["artifacts"]} - set(nodes)):
        problems.append(Problem(path, "behind the manifest's targets by the records, but not listed in the manifest"))
    return problems


def remove_broken(problems: Iterable[Problem], root: str | os.PathLike) -> list[str]:
    """Delete every broken artifact a job made and everything made from it, with their records, so that
    the same snakemake command remakes them (a missing output is what Snakemake remakes; a corrupted
    one whose mtime is unchanged it would reuse). ``problems``: :func:`audit`'s. Source files (outside
    ``results/``) are never deleted: their consumers are. Returns the removed paths, sorted."""
    import shutil

    root = Path(root)
    records, _ = load_records(root)
    consumers: dict[str, set[str]] = {}
    for made, rec in records.items():
        for inp in rec["inputs"]:
            consumers.setdefault(inp["path"], set()).add(made)
    broken = set()
    for problem in problems:
        path = problem.path
        if path.startswith(RECORD_DIR + "/"):  # an unreadable record: the artifact it describes
            rel = path[len(RECORD_DIR) + 1 :].removesuffix(".json")
            path = rel[len("_outside/") :] if rel.startswith("_outside/") else f"results/{rel}"
            (root / problem.path).unlink(missing_ok=True)
        if path.startswith("results/"):
            broken.add(path)
        else:  # a changed source file: what was made from it
            broken |= consumers.get(path, set())
    todo = list(broken)
    while todo:
        for made in consumers.get(todo.pop(), ()):
            if made not in broken:
                broken.add(made)
                todo.append(made)
    removed = []
    for path in sorted(broken):
        target = root / path
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif os.path.lexists(target):
            target.unlink()
        record_path(path, root).unlink(missing_ok=True)
        removed.append(path)
    return removed
