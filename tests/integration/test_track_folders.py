"""A built-in track in its folders: its rules, scripts and library code live under ``qrerase/tracks/<t>/``,
``rules/<t>/`` and ``workflow_scripts/<t>/``, and no module outside them names it.

"Names" means code, not prose: an identifier (``TASK_LEVEL_EXP``), a string literal that is a name or a
key (``"task_level"``, ``"task_level.baselines"``, ``"tofu_<split>"``) or an import of its package, by the
track's name or its experiments' prefix (``xling`` for ``crosslingual``). Prose may name a track or its
benchmark as an example: docstrings, comments and strings with a space (a caption, a help text, an error
message). So may a path under ``data/`` (the vendored benchmark's folder is named after its dataset:
``data/tofu`` holds TOFU's knowledge sets, which the task-level track reads too). The one exception is the
list of the built-in tracks' modules (``qrerase.tracks.BUILTIN``), which names each track once to import it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from support import REPO, RULES_FILES, SCRIPTS

from qrerase import tracks

#: The built-in tracks: each lives in its three folders.
IN_FOLDERS = list(tracks.BUILTIN)
#: Where a module may name a track: its registration in the list of built-in track modules.
ALLOWED = {("qrerase/tracks/__init__.py", "BUILTIN")}


def _folders(name: str) -> tuple[Path, ...]:
    return (REPO / "qrerase" / "tracks" / name, REPO / "rules" / name, REPO / "workflow_scripts" / name)


def _words(name: str) -> tuple[str, ...]:
    """What names a track: its name and the prefix of its experiment names (``crosslingual``, ``xling``)."""
    t = tracks.TRACKS.get(name)
    return tuple(dict.fromkeys((name, t.prefix if t else name)))


def _names(text: str, name: str) -> bool:
    return any(word in text.lower() for word in _words(name))


def _code_string(text: str) -> bool:
    """A string literal that is code (a name, a key, a pattern), not prose or a data path (module docstring)."""
    return not any(c.isspace() for c in text) and not text.startswith("data/")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def python_hits(path: Path, name: str, root: Path = REPO) -> list[str]:
    """Lines of a Python module whose code names track ``name``: an identifier, a string literal that is
    not a docstring, or an imported module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    assigned = {}  # line -> the module-level name assigned there (for ALLOWED)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for line in range(node.lineno, node.end_lineno + 1):
                assigned[line] = ",".join(t.id for t in node.targets if isinstance(t, ast.Name))
    hits = []
    rel = path.relative_to(root).as_posix()
    for node in ast.walk(tree):
        words: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words = [node.value] if _code_string(node.value) else []
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or "", *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            words = [a.name for a in node.names]
        if any(_names(w, name) for w in words) and (rel, assigned.get(node.lineno)) not in ALLOWED:
            hits.append(f"{rel}:{node.lineno}")
    return sorted(set(hits))


def rules_hits(path: Path, name: str, root: Path = REPO) -> list[str]:
    """Lines of a rules file (or the Snakefile) whose code names track ``name``: a name or a string that is
    not triple-quoted (a docstring) and is code (:func:`_code_string`); comments are skipped."""
    rel = path.relative_to(root).as_posix()
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    hits = []
    for tok in tokens:
        docstring = tok.type == tokenize.STRING and re.match(r"^[rbfu]*('''|\"\"\")", tok.string)
        prose = tok.type == tokenize.STRING and not _code_string(re.sub(r"^[rbfuRBFU]*", "", tok.string)[1:-1])
        if tok.type in (tokenize.NAME, tokenize.STRING) and not (docstring or prose) and _names(tok.string, name):
            hits.append(f"{rel}:{tok.start[0]}")
    return sorted(set(hits))


def outside_hits(name: str) -> list[str]:
    inside = _folders(name)
    modules = [p for p in sorted((REPO / "qrerase").rglob("*.py")) + SCRIPTS]
    hits = []
    for path in modules:
        if not any(path.is_relative_to(folder) for folder in inside):
            hits += python_hits(path, name)
    for path in [*RULES_FILES, REPO / "Snakefile"]:
        if not any(path.is_relative_to(folder) for folder in inside):
            hits += rules_hits(path, name)
    return hits


def test_the_scan_finds_code_and_skips_prose(tmp_path):
    """The scanner itself: an identifier, a string and an import count; a docstring and a comment do not."""
    module = tmp_path / "probe.py"
    module.write_text(
        '''"""A docstring naming task_level."""
# a comment naming task_level
from qrerase.tracks.task_level import TRACK
TASK_LEVEL_EXP = "x"
key = "task_level.baselines"


def f(x):
    """task_level again."""
    print("prose naming the task_level track", "data/task_level/facts.jsonl")
    return f"task_level_{x}"
'''
    )
    assert python_hits(module, "task_level", tmp_path) == ["probe.py:11", "probe.py:3", "probe.py:4", "probe.py:5"]
    smk = tmp_path / "probe.smk"
    smk.write_text(
        '''# task_level in a comment
def g(wildcards):
    """task_level in a docstring."""
    return path("x", exp=TASK_LEVEL_EXP)


rule r:
    params:
        section="task_level",
        caption="the task_level track's table",
        root="data/task_level",
        exp=f"task_level_{config['split']}",
'''
    )
    assert rules_hits(smk, "task_level", tmp_path) == ["probe.smk:12", "probe.smk:4", "probe.smk:9"]


@pytest.mark.parametrize("name", IN_FOLDERS)
def test_a_track_in_its_folders_is_named_by_no_module_outside_them(name):
    for folder in _folders(name):
        assert folder.is_dir(), folder
    assert (REPO / "qrerase" / "tracks" / name / "__init__.py").is_file()
    assert (REPO / "rules" / name / "rules.smk").is_file()
    hits = outside_hits(name)
    assert not hits, f"code outside the {name} track's folders names it:\n" + "\n".join(hits)


def test_every_built_in_track_is_checked():
    """All four built-in tracks are scanned (a track added to ``BUILTIN`` is scanned too)."""
    assert IN_FOLDERS == ["tofu", "crosslingual", "speech", "task_level"]
