"""The library's layout, read from the source with ``ast`` (no module is imported, so no torch needed).

- no module of ``qrerase/`` is longer than :data:`MAX_LINES` lines;
- no import cycle among ``qrerase`` modules, imports inside functions (lazy imports) included;
- no module imports another module's private (``_underscore``) names;
- ``qrerase.method`` (the paper's method: numpy / scipy / safetensors) imports no torch-side package
  (torch only lazily, in the two functions of :data:`TORCH_ALLOWED`) and nothing of ``qrerase`` except
  ``qrerase.io`` and itself;
- ``import qrerase`` does not import torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, RULES_FILES, SCRIPTS

PACKAGE = REPO / "qrerase"
MAX_LINES = 450
TORCH_SIDE = ("torch", "transformers", "peft", "tokenizers", "accelerate")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """Every import of a module (top level and inside functions): ``(module, imported names, line)``.

    Relative imports are resolved; ``from pkg import sub`` where ``pkg.sub`` is a module of the
    package counts as an import of ``pkg.sub``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [alias.name for alias in node.names]
            subs = [n for n in names if f"{module}.{n}" in MODULES]
            out += [(f"{module}.{n}", [], node.lineno) for n in subs]
            rest = [n for n in names if n not in subs]
            if rest or not subs:
                out.append((module, rest, node.lineno))
    return out


IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _internal(module: str) -> str | None:
    """The qrerase module an import refers to (its longest known prefix), or None."""
    while module:
        if module in MODULES:
            return module
        module = module.rpartition(".")[0]
    return None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_length(name):
    n = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{MODULES[name].relative_to(REPO)} has {n} lines (at most {MAX_LINES}); split it by concern"


def test_no_import_cycles():
    graph = {
        name: sorted({t for m, _, _ in imports if (t := _internal(m)) and t != name and m.startswith("qrerase")})
        for name, imports in IMPORTS.items()
    }
    state: dict[str, int] = {}  # 1: on the DFS stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def _private_imports(files: dict[str, Path]) -> list[str]:
    bad = []
    for name, path in files.items():
        imports = IMPORTS[name] if name in IMPORTS else _imports(name, path)
        for module, names, line in imports:
            if not module.startswith("qrerase") or module == name:
                continue
            bad += [
                f"{path.relative_to(REPO)}:{line}: {module}.{n}"
                for n in names
                if n.startswith("_") and n != "__version__"
            ]
    return bad


def test_no_imports_of_private_names():
    scripts = {".".join(p.relative_to(REPO).with_suffix("").parts): p for p in SCRIPTS}
    bad = _private_imports(MODULES) + _private_imports(scripts)
    assert not bad, "imports of another module's private names:\n" + "\n".join(bad)


#: The only torch imports the method may make, inside the functions that are handed torch objects or
#: torch-only files: ``apply_updates`` subtracting U V from the weights of a torch model (eq. 6), and
#: the reader of bfloat16 adapter files (numpy has no bfloat16). Both import torch lazily, so
#: ``qrerase.method`` imports, and works on numpy arrays, without torch installed.
TORCH_ALLOWED = {("qrerase.method.erase", "apply_updates"), ("qrerase.method.adapters", "_load_weights")}


def _function_of_line(path: Path, line: int) -> str | None:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            return node.name
    return None


def test_method_is_numpy_only():
    bad = []
    for name, imports in IMPORTS.items():
        if not name.startswith("qrerase.method"):
            continue
        for module, _, line in imports:
            top = module.split(".")[0]
            internal = _internal(module) if top == "qrerase" else None
            if top in TORCH_SIDE and (name, _function_of_line(MODULES[name], line)) in TORCH_ALLOWED and top == "torch":
                continue
            if top in TORCH_SIDE or (
                internal and not internal.startswith("qrerase.method") and internal not in ("qrerase", "qrerase.io")
            ):
                bad.append(f"{MODULES[name].relative_to(REPO)}:{line}: imports {module}")
    assert not bad, "qrerase.method must stay numpy/scipy-only:\n" + "\n".join(bad)


def test_import_qrerase_is_torch_free():
    code = f"import sys, qrerase; print(sorted(m for m in {TORCH_SIDE!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_rules_stay_short_and_look_tracks_up_through_the_registry():
    """rules/common.smk stays a short shared header (at most 200 lines; the launch machinery and the path
    table are library code), and no rules file looks a function up by name (`globals()[...]`): a track's
    functions are bound to its Track (qrerase.tracks.Track.bind)."""
    common = (REPO / "rules" / "common.smk").read_text(encoding="utf-8")
    assert len(common.splitlines()) <= 200
    for smk in [*RULES_FILES, REPO / "Snakefile"]:
        assert "globals()" not in smk.read_text(encoding="utf-8"), smk.name
