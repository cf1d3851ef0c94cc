"""qrerase.workflow.provenance: hashing, records, manifest and audit on a small real artifact graph."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO

from qrerase.cli import main
from qrerase.workflow import manifest as mf
from qrerase.workflow import provenance as pv


def test_hash_file_is_sha256(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"hello\n")
    assert pv.hash_file(f) == hashlib.sha256(b"hello\n").hexdigest()
    assert pv.hash_path(f) == pv.hash_file(f)


def test_directory_hash_depends_on_names_and_contents_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, order in ((a, ["x", "sub/y"]), (b, ["sub/y", "x"])):
        for name in order:  # different creation order, same tree
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(name)
    (b / ".snakemake_timestamp").write_text("")  # Snakemake's marker is ignored
    os.utime(b / "x", (1, 1))
    assert pv.hash_path(a) == pv.hash_path(b)
    expected = hashlib.sha256(
        f"sub/y\t{hashlib.sha256(b'sub/y').hexdigest()}\nx\t{hashlib.sha256(b'x').hexdigest()}\n".encode()
    ).hexdigest()
    assert pv.hash_path(a) == expected
    (b / "sub" / "y").write_text("changed")
    assert pv.hash_path(a) != pv.hash_path(b)
    (b / "sub" / "y").write_text("sub/y")
    (b / "sub" / "y").rename(b / "sub" / "z")  # renaming a file changes the hash
    assert pv.hash_path(a) != pv.hash_path(b)
    with pytest.raises(FileNotFoundError, match="nope"):
        pv.hash_path(tmp_path / "nope")


def test_config_subset_matches_params_and_direct_reads():
    config = {
        "seed": 0,
        "threads": 2,
        "model": {"dtype": "float32", "tiny": {"hidden_size": 64}},
        "unlearn": {"rank": 2, "retain_rank": None, "scale": 3.0, "energy_granularity": "block"},
        "lora": {"r": 2, "target_modules": ["q_proj"]},
        "tofu": {"data": {"split": "forget10", "root": "data/tofu"}},
    }
    params = {"model": config["model"], "rank": 2, "granularity": "block", "seed": 0}
    subset = pv.config_subset(config, params, accessed=["tofu", "tofu.data", "tofu.data.split"])
    # rank=2 matches unlearn.rank by name, not lora.r (also 2); seed=0 is not threads or anything else
    assert subset == {
        "model": config["model"],
        "seed": 0,
        "tofu.data.split": "forget10",
        "unlearn.energy_granularity": "block",
        "unlearn.rank": 2,
    }
    recording = pv.RecordingDict(config)
    assert recording["tofu"]["data"]["split"] == "forget10" and recording.get("seed") == 0
    assert recording.accessed == {"tofu", "tofu.data", "tofu.data.split", "seed"}


def _job(root: Path, rule: str, inputs: list[str], outputs: dict[str, str], **params):
    """Run a tiny 'job' in root: write outputs, then record them like qrerase.workflow.job.job does."""
    start = time.time()
    for out, text in outputs.items():
        p = root / out
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        rec = pv.build_record(
            rule=rule,
            wildcards={},
            params=params,
            config={"seed": 0, **params},
            inputs=inputs,
            outputs=list(outputs),
            seed=0,
            threads=1,
            start=start,
            end=time.time(),
            workflow_dir=root,
        )
        pv.write_records(rec)
    finally:
        os.chdir(cwd)
    return rec


@pytest.fixture()
def graph(tmp_path):
    """data/src.txt -> results/a.txt -> results/b/ (dir) and results/c.txt -> manifest."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data/src.txt").write_text("source")
    _job(tmp_path, "make_a", ["data/src.txt"], {"results/a.txt": "A"}, k=1)
    _job(tmp_path, "make_b", ["results/a.txt"], {"results/b/w.bin": "B", "results/c.txt": "C"})
    # make_b declared its directory output as results/b: rewrite as a directory record
    (tmp_path / pv.record_path("results/b/w.bin")).unlink()
    (tmp_path / pv.record_path("results/c.txt")).unlink()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rec = pv.build_record(
            rule="make_b",
            wildcards={"x": "1"},
            params={},
            config={},
            inputs=["results/a.txt"],
            outputs=["results/b", "results/c.txt"],
            seed=None,
            threads=1,
            start=0.0,
            end=1.0,
            workflow_dir=tmp_path,
        )
        pv.write_records(rec)
    finally:
        os.chdir(cwd)
    _record_manifest(tmp_path, ["results/b", "results/c.txt"])
    return tmp_path


def _record_manifest(root: Path, targets: list[str]) -> dict:
    """The manifest behind ``targets``, written by a recorded job as rule provenance_manifest does."""
    cwd = os.getcwd()
    os.chdir(root)
    try:
        manifest = mf.build_manifest(targets)
    finally:
        os.chdir(cwd)
    _job(root, "provenance_manifest", targets, {pv.MANIFEST: json.dumps(manifest, indent=2, sort_keys=True) + "\n"})
    return manifest


def test_record_contents(graph):
    rec = json.loads((graph / pv.record_path("results/a.txt")).read_text())
    assert rec["rule"] == "make_a" and rec["params"] == {"k": 1} and rec["config"] == {"k": 1}
    assert rec["inputs"] == [
        {"path": "data/src.txt", "kind": "file", "sha256": pv.hash_file(graph / "data/src.txt"), "bytes": 6}
    ]
    assert rec["outputs"][0]["sha256"] == hashlib.sha256(b"A").hexdigest()
    assert rec["code"]["git_commit"] == "unknown"  # tmp_path is not a git checkout
    assert {"python", "torch", "transformers", "peft", "scipy", "numpy", "snakemake"} <= set(rec["versions"])
    assert rec["machine"] == pv.machine_info() and rec["machine"]["logical_cpus"] == os.cpu_count()
    assert rec["machine"]["cpu"] and rec["machine"]["cpu"] != "unknown"  # /proc/cpuinfo or platform names it
    assert rec["seed"] == 0 and rec["threads"] == 1 and rec["start"] <= rec["end"]
    b = json.loads((graph / pv.record_path("results/b")).read_text())
    assert b == json.loads((graph / pv.record_path("results/c.txt")).read_text())  # one record per output
    assert b["outputs"][0]["kind"] == "directory"


def test_code_version_of_a_git_checkout(tmp_path):
    run = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (tmp_path / "Snakefile").write_text("x")
    run("add", "Snakefile")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "out.csv").write_text("1")  # results/ does not make the checkout dirty
    info = pv.code_version(tmp_path)
    assert len(info["git_commit"]) == 40 and info["git_dirty"] is False
    (tmp_path / "Snakefile").write_text("y")
    assert pv.code_version(tmp_path)["git_dirty"] is True


def test_manifest_is_the_artifact_graph(graph):
    m = json.loads((graph / pv.MANIFEST).read_text())
    assert set(m["artifacts"]) == {"data/src.txt", "results/a.txt", "results/b", "results/c.txt"}
    assert m["artifacts"]["data/src.txt"]["rule"] is None
    assert m["artifacts"]["results/b"]["rule"] == "make_b"
    assert {(e["from"], e["to"]) for e in m["edges"]} == {
        ("data/src.txt", "results/a.txt"),
        ("results/a.txt", "results/b"),
        ("results/a.txt", "results/c.txt"),
    }
    with pytest.raises(ValueError, match="results/zzz: no provenance record"):
        cwd = os.getcwd()
        os.chdir(graph)
        try:
            mf.build_manifest(["results/zzz"])
        finally:
            os.chdir(cwd)


def test_audit_clean_graph(graph, capsys):
    problems, counts = mf.audit(graph / "results")
    assert problems == [] and counts["records"] == 4  # three artifacts and the manifest
    assert main(["audit", str(graph / "results")]) == 0
    assert "OK" in capsys.readouterr().out


def _paths(problems):
    return {(p.path, p.reason.split(" (")[0].split(" whose")[0]) for p in problems}


def test_audit_names_modified_and_stale_artifacts(graph, capsys):
    (graph / "results/a.txt").write_text("tampered")
    problems, _ = mf.audit(graph / "results")
    assert _paths(problems) == {
        ("results/a.txt", "modified"),
        ("results/b", "produced from input results/a.txt"),
        ("results/c.txt", "produced from input results/a.txt"),
    }
    assert main(["audit", str(graph / "results")]) == 1
    out = capsys.readouterr().out
    assert "BROKEN results/a.txt: modified" in out


def test_audit_file_inside_directory_artifact_and_source(graph):
    (graph / "results/b/w.bin").write_text("other")
    (graph / "data/src.txt").write_text("new source")
    reasons = {str(p) for p in mf.audit(graph / "results")[0]}
    assert any(r.startswith("results/b: modified") for r in reasons)
    assert any(
        r.startswith("results/a.txt: produced from input data/src.txt whose hash no longer matches") for r in reasons
    )
    assert any(r.startswith("data/src.txt: source file of the manifest changed") for r in reasons)


def test_audit_missing_and_rerun_upstream(graph):
    (graph / "results/c.txt").unlink()
    _job(graph, "make_a", ["data/src.txt"], {"results/a.txt": "A2"}, k=2)  # upstream re-made, downstream not
    reasons = {str(p) for p in mf.audit(graph / "results")[0]}
    assert "results/c.txt: missing (recorded by rule make_b)" in reasons
    assert any(r.startswith("results/b: produced from input results/a.txt whose recorded hash") for r in reasons)
    assert any(r.startswith("results/a.txt: manifest hash") for r in reasons)


def test_audit_bad_records(graph, tmp_path_factory):
    (graph / pv.record_path("results/a.txt")).write_text("{not json")
    problems, _ = mf.audit(graph / "results")
    assert any("unreadable provenance record" in p.reason for p in problems)
    empty = tmp_path_factory.mktemp("empty")
    (empty / "results").mkdir()
    assert "no provenance records" in mf.audit(empty / "results")[0][0].reason
    with pytest.raises(FileNotFoundError, match="not a directory"):
        mf.audit(empty / "nothing")


def test_remove_records(graph):
    pv.remove_records(["results/a.txt"], root=graph)
    assert not (graph / pv.record_path("results/a.txt")).exists()


def test_cli_manifest(graph, capsys):
    assert main(["manifest", str(graph / "results"), "results/c.txt"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert set(m["artifacts"]) == {"data/src.txt", "results/a.txt", "results/c.txt"}


def test_cli_module_entry_point(graph):
    proc = subprocess.run(
        [sys.executable, "-m", "qrerase.cli", "audit", str(graph / "results")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(pv.__file__).parents[1])},
    )
    assert proc.returncode == 0, proc.stderr


def _snakemake_object(config):
    """The object Snakemake hands to a script (snakemake.iocontainers.Snakemake), for one job."""
    from snakemake.iocontainers import InputFiles, Log, OutputFiles, Params, Wildcards

    params = Params(fromdict={"rank": 2, "model": config["model"]})
    return Snakemake(
        InputFiles(["data/src.txt"]),
        OutputFiles(["results/out.txt"]),
        params,
        Wildcards(fromdict={"exp": "tofu_forget10"}),
        1,
        None,
        Log(["results/logs/x.log"]),
        config,
        "demo",
        None,
        str(REPO / "workflow_scripts"),
    )


try:
    from snakemake.iocontainers import Snakemake
except ImportError:  # pragma: no cover - older Snakemake
    Snakemake = None


@pytest.mark.skipif(Snakemake is None, reason="needs snakemake.iocontainers.Snakemake")
def test_job_writes_a_record_after_success_and_none_after_failure(tmp_path, monkeypatch):
    from qrerase.workflow.job import job

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data/src.txt").write_text("x")
    (tmp_path / "results/logs").mkdir(parents=True)
    config = {"seed": 0, "model": {"dtype": "float32"}, "unlearn": {"rank": 2}, "tofu": {"data": {"split": "forget10"}}}
    smk = _snakemake_object(config)
    with job(smk) as log:
        assert smk.config["tofu"]["data"]["split"] == "forget10"  # a direct config read
        Path(smk.output[0]).write_text("result")
        log.info("done")
    assert smk.config is config  # restored
    rec = json.loads(pv.record_path("results/out.txt").read_text())
    assert rec["rule"] == "demo" and rec["wildcards"] == {"exp": "tofu_forget10"}
    assert rec["config"] == {"model": {"dtype": "float32"}, "tofu.data.split": "forget10", "unlearn.rank": 2}
    assert rec["outputs"][0]["sha256"] == hashlib.sha256(b"result").hexdigest()
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", rec["code"]["git_commit"])

    with pytest.raises(RuntimeError, match="boom"):
        with job(smk):
            Path(smk.output[0]).write_text("half")
            raise RuntimeError("boom")
    assert not pv.record_path("results/out.txt").exists()  # the old record is gone, no new one
    assert "rule demo failed: RuntimeError: boom" in (tmp_path / "results/logs/x.log").read_text()


# ---------------------------------------------------------------------------------------------
# Issue 34: wall times left out of the hashed manifest; partial forgeries reported as mismatches;
# the manifest signed with an SSH key.
# ---------------------------------------------------------------------------------------------
def _timed_run(root: Path, wall_time: str) -> dict:
    """data/src.txt -> results/a.txt -> results/tables/t.csv, and a cost table made from a benchmark file."""
    (root / "data").mkdir(parents=True)
    (root / "data/src.txt").write_text("source")
    bench = root / "results/benchmarks/make_a/x.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text(f"s\th:m:s\n{wall_time}\t0:00:01\n")  # Snakemake's benchmark file: a wall time
    _job(root, "make_a", ["data/src.txt"], {"results/a.txt": "A"})
    _job(root, "table", ["results/a.txt"], {"results/tables/t.csv": "method,value\nqr,1\n"})
    _job(root, "cost", ["results/benchmarks/make_a/x.tsv"], {"results/tables/t_cost.csv": f"make_a,{wall_time}\n"})
    return _record_manifest(root, ["results/tables/t.csv", "results/tables/t_cost.csv"])


def test_manifest_leaves_wall_times_unhashed(tmp_path):
    first, second = _timed_run(tmp_path / "one", "1.2345"), _timed_run(tmp_path / "two", "9.8765")
    assert first == second  # two clean runs whose wall times differ give the same manifest
    timed = {"results/benchmarks/make_a/x.tsv", "results/tables/t_cost.csv"}
    assert set(first["artifacts"]) == {"data/src.txt", "results/a.txt", "results/tables/t.csv"}
    assert set(first["wall_time"]["artifacts"]) == timed and "wall times" in first["wall_time"]["note"]
    assert not any("sha256" in a or "bytes" in a for a in first["wall_time"]["artifacts"].values())
    assert first["wall_time"]["artifacts"]["results/tables/t_cost.csv"]["rule"] == "cost"
    assert first["wall_time"]["edges"] == [
        {"from": "results/benchmarks/make_a/x.tsv", "to": "results/tables/t_cost.csv"}
    ]
    assert not {e["from"] for e in first["edges"]} & timed and not {e["to"] for e in first["edges"]} & timed
    assert mf.audit(tmp_path / "one/results")[0] == []  # records still hash the timing files
    (tmp_path / "one/results/benchmarks/make_a/x.tsv").write_text("edited")
    assert [str(p).split(" (")[0] for p in mf.audit(tmp_path / "one/results")[0]] == [
        "results/tables/t_cost.csv: produced from input results/benchmarks/make_a/x.tsv whose hash no longer matches"
    ]


def _signed_graph(root: Path, final: str = "results/c.txt", rule: str = "make_c", text: str = "C") -> Path:
    """data/src.txt -> results/a.txt -> ``final`` and the manifest, each written by a recorded job."""
    (root / "data").mkdir(parents=True)
    (root / "data/src.txt").write_text("source")
    _job(root, "make_a", ["data/src.txt"], {"results/a.txt": "A"})
    _job(root, rule, ["results/a.txt"], {final: text})
    _record_manifest(root, [final])
    return root


def _edit_record(root: Path, output: str, edit) -> None:
    path = root / pv.record_path(output)
    rec = json.loads(path.read_text())
    edit(rec)
    path.write_text(json.dumps(rec))


def _rehash(entries: list, path: str, root: Path) -> None:
    for e in entries:
        if e["path"] == path:
            e.update(pv.artifact(root / path), path=path)


def test_a_partial_forgery_is_a_mismatch_not_a_re_make(tmp_path):
    root = _signed_graph(tmp_path)
    # edit an artifact and its own record, nothing downstream
    (root / "results/a.txt").write_text("forged")
    _edit_record(root, "results/a.txt", lambda rec: _rehash(rec["outputs"], "results/a.txt", root))
    reasons = [str(p) for p in mf.audit(root / "results")[0]]
    assert len(reasons) == 2 and all("MISMATCH" in r and "no re-make" in r for r in reasons), reasons
    assert reasons[0].startswith("results/c.txt: produced from input results/a.txt whose recorded hash")
    assert reasons[1].startswith("results/a.txt: manifest hash")
    # a real re-make (the producer's record is newer than its consumer's start) still reads as one
    _job(root, "make_a", ["data/src.txt"], {"results/a.txt": "A2"})
    reasons = [str(p) for p in mf.audit(root / "results")[0]]
    assert reasons and not any("MISMATCH" in r for r in reasons)
    assert any(r.endswith("the input was re-made since") for r in reasons)


def _forge_consistently(root: Path) -> None:
    """What the audit cannot see: an artifact, its record, its consumer's record, manifest.json and the
    manifest's own record all edited to agree."""
    (root / "results/a.txt").write_text("forged")
    _edit_record(root, "results/a.txt", lambda rec: _rehash(rec["outputs"], "results/a.txt", root))
    _edit_record(root, "results/c.txt", lambda rec: _rehash(rec["inputs"], "results/a.txt", root))
    manifest = json.loads((root / pv.MANIFEST).read_text())
    manifest["artifacts"]["results/a.txt"]["sha256"] = pv.hash_path(root / "results/a.txt")
    for e in manifest["edges"]:
        if e["from"] == "results/a.txt":
            e["sha256"] = pv.hash_path(root / "results/a.txt")
    (root / pv.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _edit_record(root, pv.MANIFEST, lambda rec: _rehash(rec["outputs"], pv.MANIFEST, root))


needs_ssh_keygen = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None,
    reason="ssh-keygen is not installed (apt-get install openssh-client, as .ci/run does)",
)


def _signer(tmp_path: Path, root: Path) -> tuple[Path, str, list[str]]:
    """A new ed25519 key, the run's results/ and the CLI arguments of an audit that verifies its signature."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me", "-f", str(key)], check=True)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"me@lab {(tmp_path / 'id_ed25519.pub').read_text()}")
    results = str(root / "results")
    verify = ["audit", results, "--verify-signature", "--allowed-signers", str(allowed), "--identity", "me@lab"]
    return key, results, verify


@needs_ssh_keygen
def test_signed_manifest_verifies_and_catches_a_consistent_forgery(tmp_path, capsys):
    root = _signed_graph(tmp_path / "run")
    key, results, verify = _signer(tmp_path, root)
    assert main(["sign", results, "--key", str(key)]) == 0
    assert capsys.readouterr().out.strip() == f"{root}/results/provenance/manifest.json.sig"
    assert main(verify) == 0
    assert 'Good "qrerase-manifest" signature for me@lab' in capsys.readouterr().out
    assert main([*verify[:-1], "someone-else"]) == 1
    capsys.readouterr()
    _forge_consistently(root)
    assert main(["audit", results]) == 0  # the audit alone cannot see it (docs/provenance.md)
    capsys.readouterr()
    assert main(verify) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(
        f"BROKEN {root}/results/provenance/manifest.json: signature manifest.json.sig does not verify for 'me@lab'"
    )


@needs_ssh_keygen
def test_sign_and_verify_refuse_bad_input_in_one_line(tmp_path, capsys):
    root = _signed_graph(tmp_path / "run")
    results = str(root / "results")
    assert main(["sign", results, "--key", str(tmp_path / "nokey")]) == 2
    assert capsys.readouterr().err.strip() == f"qrerase sign: error: {tmp_path}/nokey: SSH private key not found"
    (tmp_path / "notakey").write_text("not a key\n")
    assert main(["sign", results, "--key", str(tmp_path / "notakey")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"qrerase sign: error: {results}/provenance/manifest.json: ssh-keygen could not sign with")
    assert "\n" not in err and not (root / "results/provenance/manifest.json.sig").exists()
    assert main(["audit", results, "--verify-signature"]) == 2
    assert "--verify-signature needs --allowed-signers FILE and --identity NAME" in capsys.readouterr().err
    allowed = tmp_path / "allowed"
    allowed.write_text("")
    assert main(["audit", results, "--verify-signature", "--allowed-signers", str(allowed), "--identity", "x"]) == 2
    assert "manifest.json.sig: manifest signature (qrerase sign) not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Issue 62: deletions cannot fool the audit; --remove-broken clears what a rerun must remake.
# ---------------------------------------------------------------------------------------------
def _table_run(root: Path) -> Path:
    """data/src.txt -> results/a.txt -> results/tables/t.csv -> the manifest, each a recorded job."""
    _signed_graph(root, "results/tables/t.csv", "table", "method,value\nqr,1\n")
    assert mf.audit(root / "results")[0] == []
    return root


def test_deleting_the_manifest_and_a_tables_record_hides_no_edit(tmp_path, capsys):
    """The probe's case: manifest.json, its record and the table's record deleted, then a number edited.
    The audit said 'OK; ... 0 manifest entries checked'."""
    root = _table_run(tmp_path)
    (root / pv.MANIFEST).unlink()
    pv.remove_records([pv.MANIFEST, "results/tables/t.csv"], root=root)
    (root / "results/tables/t.csv").write_text("method,value\nqr,0.5\n")
    assert main(["audit", str(root / "results")]) == 1
    out = capsys.readouterr().out
    assert "BROKEN results/tables/t.csv: no provenance record" in out
    assert f"BROKEN {pv.MANIFEST}: missing, though 1 tables and figures were built" in out


def test_a_deleted_intermediate_record_and_a_shrunk_manifest_are_broken(tmp_path):
    root = _table_run(tmp_path)
    manifest = json.loads((root / pv.MANIFEST).read_text())
    del manifest["artifacts"]["results/a.txt"]  # fewer entries than the records imply
    (root / pv.MANIFEST).write_text(json.dumps(manifest))
    reasons = [str(p) for p in mf.audit(root / "results")[0]]
    assert "results/a.txt: behind the manifest's targets by the records, but not listed in the manifest" in reasons
    (root / pv.MANIFEST).unlink()
    pv.remove_records([pv.MANIFEST, "results/a.txt"], root=root)
    reasons = [str(p) for p in mf.audit(root / "results")[0]]
    assert "results/a.txt: input of results/tables/t.csv (rule table) but has no provenance record" in reasons
    # a manifest without its own record is not one the workflow wrote
    _job(root, "make_a", ["data/src.txt"], {"results/a.txt": "A"})
    (root / pv.MANIFEST).write_text(json.dumps(manifest))
    reasons = [str(p) for p in mf.audit(root / "results")[0]]
    assert f"{pv.MANIFEST}: no provenance record (rule provenance_manifest writes one)" in reasons


@needs_ssh_keygen
def test_a_signed_manifest_catches_a_deleted_record_and_its_own_deletion(tmp_path, capsys):
    root = _table_run(tmp_path / "run")
    key, results, verify = _signer(tmp_path, root)
    assert main(["sign", results, "--key", str(key)]) == 0 and main(verify) == 0
    capsys.readouterr()
    pv.remove_records(["results/a.txt"], root=root)  # the signature still verifies: the graph is unchanged
    assert main(verify) == 1
    out = capsys.readouterr().out
    assert "BROKEN results/a.txt: listed in the manifest but has no provenance record" in out
    (root / pv.MANIFEST).unlink()
    pv.remove_records([pv.MANIFEST], root=root)
    assert main(verify) == 1
    out = capsys.readouterr().out
    assert f"BROKEN {pv.MANIFEST}: missing" in out


def test_remove_broken_deletes_a_corrupted_artifact_and_what_was_made_from_it(tmp_path, capsys):
    root = _table_run(tmp_path)
    (root / "results/a.txt").write_text("truncat")
    problems, _ = mf.audit(root / "results")
    modified = next(p for p in problems if p.path == "results/a.txt")
    assert modified.reason.startswith("modified") and "--remove-broken`, then the same snakemake command" in str(
        modified
    )
    assert main(["audit", str(root / "results"), "--remove-broken"]) == 1  # it was broken
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("removed")] == [
        "removed results/a.txt",
        f"removed {pv.MANIFEST}",
        "removed results/tables/t.csv",
    ]
    for path in ("results/a.txt", "results/tables/t.csv", pv.MANIFEST):
        assert not (root / path).exists() and not (root / pv.record_path(path)).exists()
    assert (root / "data/src.txt").read_text() == "source"  # a source is never deleted
    # a changed source: its consumers go, the source stays
    root = _table_run(tmp_path / "again")
    (root / "data/src.txt").write_text("new source")
    removed = mf.remove_broken(mf.audit(root / "results")[0], root)
    assert removed == ["results/a.txt", pv.MANIFEST, "results/tables/t.csv"]
    assert (root / "data/src.txt").exists()
