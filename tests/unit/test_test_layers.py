"""The tests' own layout, read from the source with ``ast`` (nothing is imported or run).

- every test module (``test_*.py``) is in ``tests/unit``, ``tests/integration`` or ``tests/workflow``, and
  its file name is unique (pytest's default ``prepend`` import mode imports it by that name);
- no module under ``tests/`` imports a test module or ``conftest``: shared helpers live in ``tests/support``;
- a unit test starts no subprocess (it does not import ``subprocess``);
- the ``workflow`` marker (pyproject.toml) is used by every module of ``tests/workflow`` and by no other.

tests/support/__init__.py says which test goes in which folder.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from support import TESTS

LAYERS = ("unit", "integration", "workflow")
TEST_FILES = sorted(TESTS.rglob("test_*.py"))
#: Every Python file of the tests folder: test modules, conftest, the support package, the toy plug-ins.
SOURCES = sorted(TESTS.rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(TESTS.parent))


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imported_modules(tree: ast.Module) -> list[tuple[str, int]]:
    """Every module an import names (top level and inside functions), with its line: ``import a.b`` and
    ``from a.b import c`` give ``a.b``; ``from a import b`` also gives ``a.b`` (b may be a module)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, node.lineno))
            out += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return out


def _uses_marker(tree: ast.Module, name: str) -> bool:
    """Whether the module names ``pytest.mark.<name>`` anywhere (``pytestmark`` or a decorator)."""
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        for node in ast.walk(tree)
    )


def test_the_scan_finds_the_tests():
    assert len(TEST_FILES) > 50 and all((TESTS / layer).is_dir() for layer in LAYERS)
    assert (TESTS / "support" / "__init__.py").is_file() and (TESTS / "conftest.py").is_file()


def test_every_test_module_is_in_a_layer_with_a_unique_name():
    outside = [_rel(p) for p in TEST_FILES if p.parent.parent != TESTS or p.parent.name not in LAYERS]
    assert not outside, f"test modules outside tests/{{{','.join(LAYERS)}}}/: {outside}"
    names = [p.name for p in TEST_FILES]
    assert len(set(names)) == len(names), sorted({n for n in names if names.count(n) > 1})
    inits = [_rel(TESTS / layer / "__init__.py") for layer in LAYERS if (TESTS / layer / "__init__.py").exists()]
    assert not inits, f"the layers are plain folders (no package), so a test module is found by its name: {inits}"


def _forbidden_imports(tree: ast.Module, forbidden: set[str]) -> list[tuple[str, int]]:
    """The imports of ``tree`` that name a module of ``forbidden`` at any level of their dotted name."""
    return [(module, line) for module, line in _imported_modules(tree) if forbidden & set(module.split("."))]


def test_no_module_imports_a_test_module_or_conftest():
    forbidden = {p.stem for p in TEST_FILES} | {"conftest"}
    bad = [
        f"{_rel(path)}:{line}: imports {module}"
        for path in SOURCES
        for module, line in _forbidden_imports(_tree(path), forbidden)
    ]
    assert not bad, "shared helpers belong in tests/support/:\n" + "\n".join(bad)


def test_unit_tests_start_no_subprocess():
    bad = [
        f"{_rel(path)}:{line}"
        for path in TEST_FILES
        if path.parent.name == "unit"
        for module, line in _imported_modules(_tree(path))
        if module.split(".")[0] == "subprocess"
    ]
    assert not bad, "a test that starts a process belongs in tests/integration/:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", LAYERS)
def test_the_workflow_marker_is_the_workflow_folder(layer):
    files = [p for p in TEST_FILES if p.parent.name == layer]
    marked = {_rel(p) for p in files if _uses_marker(_tree(p), "workflow")}
    if layer == "workflow":
        assert marked == {_rel(p) for p in files}, "unmarked end-to-end modules"
    else:
        assert not marked, f"tests marked workflow outside tests/workflow/: {sorted(marked)}"


def test_the_checks_above_can_fail():
    """Each check on a small known-bad source, so a scan that silently stopped matching fails here."""
    bad = ast.parse(
        "import subprocess\nfrom test_workflow import snakemake\nfrom support.snakemake_cli import planned_rules\n"
        "def f():\n    from conftest import x\n    import tests.unit.test_x\n"
        "pytestmark = pytest.mark.workflow\n"
    )
    found = _forbidden_imports(bad, {"test_workflow", "test_x", "conftest"})
    assert sorted(found) == [
        ("conftest", 5),
        ("conftest.x", 5),
        ("test_workflow", 2),
        ("test_workflow.snakemake", 2),
        ("tests.unit.test_x", 6),
    ]
    assert [m for m, _ in _imported_modules(bad) if m.split(".")[0] == "subprocess"] == ["subprocess"]
    assert _uses_marker(bad, "workflow") and not _uses_marker(bad, "slow")
    assert not _uses_marker(ast.parse("workflow = 1\nx = pytest.workflow\n"), "workflow")
