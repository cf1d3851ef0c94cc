"""Code style, enforced: ``ruff check``, ``ruff format --check``, ``snakemake --lint``, ``snakefmt --check``
and ``mypy`` over the repository must report nothing (the same checks as ``.pre-commit-config.yaml``).

Each check also runs once on a small known-bad input, so a check that silently stopped checking (a
wrong path, an excluded directory, a tool that exits 0 on findings) fails here too. The linters'
versions are pinned in pyproject.toml's ``test`` extra and must match the pre-commit ``rev``s.
A tool that is not installed skips its test with the reason (``pip install -e ".[test]"`` installs them).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from support import REPO


def _tool(module: str):
    """Skip unless ``python -m <module>`` can run in this interpreter's environment."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")


def _run(*args: str, cwd: Path = REPO, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=300
    )


def _report(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"


# --- the repository is clean ------------------------------------------------------------------------


def test_ruff_check_is_clean():
    _tool("ruff")
    proc = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert proc.returncode == 0, _report(proc)


def test_ruff_format_is_clean():
    _tool("ruff")
    proc = _run("ruff", "format", "--no-cache", "--check", ".")
    assert proc.returncode == 0, "run `ruff format .`\n" + _report(proc)


def test_snakefmt_is_clean():
    _tool("snakefmt")
    proc = _run("snakefmt", "--check", ".")
    assert proc.returncode == 0, "run `snakefmt .`\n" + _report(proc)


def test_snakemake_lint_is_clean():
    """``snakemake --lint`` on the default config, in the repository (the config's data paths are
    relative to it); it builds no DAG and takes no lock. It exits 1 on any lint."""
    _tool("snakemake")
    proc = _run("snakemake", "--lint")
    assert proc.returncode == 0, _report(proc)
    assert "Congratulations" in proc.stdout + proc.stderr, _report(proc)


def _mypy_config() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def test_mypy_is_clean_and_its_exemptions_are_exactly_the_failing_modules(tmp_path):
    """``mypy`` (``[tool.mypy]`` of pyproject.toml) over qrerase/: run once without the exemptions, the
    modules with errors are exactly those the config exempts. A new error elsewhere fails (name the
    module and the line), and so does an exempt module that now checks clean (take it off the list)."""
    _tool("mypy")
    cfg = _mypy_config()
    (exempt,) = [o["module"] for o in cfg["overrides"] if o.get("ignore_errors")]
    bare = "\n".join(
        ["[mypy]", f"files = {','.join(cfg['files'])}", "ignore_missing_imports = True", "python_version = 3.11"]
    )
    (tmp_path / "mypy.ini").write_text(bare + "\n")
    proc = _run("mypy", "--config-file", str(tmp_path / "mypy.ini"), "--cache-dir", str(tmp_path / "cache"))
    failing = {
        ".".join(Path(m.group(1)).with_suffix("").parts).removesuffix(".__init__")
        for m in re.finditer(r"^(qrerase/\S+?\.py):\d+: error:", proc.stdout, flags=re.M)
    }
    new = sorted(failing - set(exempt))
    assert not new, "type errors outside the exempt modules:\n" + "\n".join(
        line for line in proc.stdout.splitlines() if any(line.startswith(m.replace(".", "/")) for m in new)
    )
    assert not sorted(set(exempt) - failing), (
        f"exempt modules that now check clean (remove them): {sorted(set(exempt) - failing)}"
    )
    assert proc.returncode == (1 if failing else 0), _report(proc)


def test_mypy_reports_a_type_error(tmp_path):
    """The check checks: a module with a type error fails it."""
    _tool("mypy")
    bad = tmp_path / "bad.py"
    bad.write_text('def f(x: int) -> int:\n    return x\n\n\nf("one")\n')
    proc = _run("mypy", "--no-incremental", "--config-file", "/dev/null", str(bad))
    assert proc.returncode == 1 and 'incompatible type "str"' in proc.stdout, _report(proc)


def test_no_noqa_for_undefined_snakemake():
    """``snakemake`` is a builtin for workflow_scripts/ (workflow_scripts/ruff.toml), not a per-line noqa."""
    files = [
        REPO / "Snakefile",
        *(p for d in ("qrerase", "workflow_scripts", "tests", "rules") for p in (REPO / d).rglob("*")),
    ]
    hits = [
        f"{path.relative_to(REPO)}:{i}"
        for path in sorted(files)
        if path.suffix in (".py", ".smk") or path.name == "Snakefile"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"#\s*noqa:[\sA-Z0-9,]*\bF821\b", line)
    ]
    assert len(files) > 100, "the scan found the sources"
    assert not hits, hits


# --- each check can fail ----------------------------------------------------------------------------

SCRIPT = "print(snakemake.input[0])\nprint(snakemake.output[0])\n"


def _ruff_stdin(path: str, code: str, *extra: str) -> subprocess.CompletedProcess:
    return _run(
        "ruff", "check", "--no-cache", "--output-format", "concise", "--stdin-filename", path, *extra, "-", stdin=code
    )


def test_ruff_snakemake_builtin_only_in_workflow_scripts():
    _tool("ruff")
    inside = _ruff_stdin("workflow_scripts/example.py", SCRIPT)
    assert inside.returncode == 0, _report(inside)
    outside = _ruff_stdin("qrerase/example.py", SCRIPT)
    assert outside.returncode == 1 and "F821" in outside.stdout, _report(outside)
    stale = _ruff_stdin("workflow_scripts/example.py", SCRIPT.replace("\n", "  # noqa: " + "F821\n", 1))
    assert stale.returncode == 1 and "RUF100" in stale.stdout, _report(stale)
    long_line = "x = " + " + ".join(["1"] * 60) + "\n"
    assert len(long_line) > 121
    too_long = _ruff_stdin("qrerase/example.py", long_line, "--select", "E501")
    assert too_long.returncode == 1 and "E501" in too_long.stdout, _report(too_long)


def test_ruff_format_check_fails_on_unformatted_code():
    _tool("ruff")
    proc = _run("ruff", "format", "--check", "--stdin-filename", "qrerase/example.py", "-", stdin="x = {  'a':1 }\n")
    assert proc.returncode == 1, _report(proc)


def test_snakefmt_check_fails_on_unformatted_rules(tmp_path):
    _tool("snakefmt")
    bad = tmp_path / "bad.smk"
    bad.write_text('rule a:\n    output: "a.txt"\n    shell: "touch {output}"\n', encoding="utf-8")
    proc = _run("snakefmt", "--check", str(bad), cwd=tmp_path)
    assert proc.returncode == 1, _report(proc)


def test_snakemake_lint_fails_on_a_rule_without_log(tmp_path):
    _tool("snakemake")
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(
        'rule a:\n    output:\n        "a.txt",\n    shell:\n        "touch {output}"\n', encoding="utf-8"
    )
    proc = _run("snakemake", "--lint", "-s", str(snakefile), "--directory", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 1, _report(proc)
    assert "log" in (proc.stdout + proc.stderr).lower(), _report(proc)


# --- pinned versions --------------------------------------------------------------------------------


def _pins() -> dict[str, str]:
    """``name -> version`` of the ``==`` pins in pyproject.toml's ``test`` extra."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = {}
    for req in project["optional-dependencies"]["test"]:
        name, sep, pinned = req.partition("==")
        if sep:
            pins[name.strip()] = pinned.strip()
    return pins


def test_pre_commit_revs_match_the_pinned_linters():
    pins = _pins()
    assert {"ruff", "snakefmt"} <= set(pins), f"pyproject.toml's test extra pins {pins}"
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    revs = {repo["repo"].rstrip("/").rsplit("/", 1)[-1]: repo.get("rev") for repo in config["repos"]}
    assert revs.get("ruff-pre-commit") == f"v{pins['ruff']}", revs
    assert revs.get("snakefmt") == f"v{pins['snakefmt']}", revs
    hooks = {hook["id"] for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "snakefmt", "snakemake-lint"} <= hooks, hooks


@pytest.mark.parametrize("tool", ["ruff", "snakefmt"])
def test_installed_linter_is_the_pinned_one(tool):
    _tool(tool)
    pinned = _pins()[tool]
    assert version(tool) == pinned, f"{tool} {version(tool)} is installed but pyproject.toml pins {pinned}"
