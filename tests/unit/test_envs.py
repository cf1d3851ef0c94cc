"""The per-family conda environments (envs/*.yaml) list every package their rules' scripts import.

conda is not needed: the environment files are parsed as YAML and each rule's script is scanned
statically — its own imports, the module-level imports of every qrerase module it imports
(transitively), and the function-level imports of the library functions it uses, following calls
to other functions of the library. An import guarded by ``if <param> is not None`` in a function is
only counted when the script passes that keyword (``job(snakemake, seed=...)`` imports torch,
``job(snakemake)`` does not).
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml
from support import REPO, RULES_FILES

# import name -> distribution name where they differ
DIST = {"yaml": "pyyaml", "rouge_score": "rouge-score", "sklearn": "scikit-learn"}
# provided by the job runner itself (Snakemake's script preamble), not by the rule's environment
RUNNER = {"snakemake", "qrerase"}


def env_packages(env_file: Path) -> set[str]:
    env = yaml.safe_load(env_file.read_text())
    assert set(env) >= {"channels", "dependencies"}, env_file
    names = set()
    for dep in env["dependencies"]:
        items = dep["pip"] if isinstance(dep, dict) else [dep]
        for item in items:
            names.add(re.split(r"[=<>!~ \[]", item, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def rules() -> dict[str, tuple[str, str]]:
    """rule name -> (conda env path, script path), both relative to the repository root."""
    found = {}
    for smk in RULES_FILES:
        for block in re.split(r"(?m)^rule ", smk.read_text())[1:]:
            name = block.split(":", 1)[0].strip()
            conda = re.search(r'conda:\s*\n\s*"(?:\.\./)+(envs/[\w.-]+)"', block)
            script = re.search(r'script:\s*\n\s*"(?:\.\./)+([\w./-]+)"', block)
            # training rules: `shell: launch("X.py")` runs workflow_scripts/X.py (rules/common.smk)
            launched = re.search(r'shell:\s*\n\s*launch\("([\w./-]+)"', block)
            if script or launched:
                assert conda, f"rule {name} runs a script but declares no conda env"
                path = script.group(1) if script else f"workflow_scripts/{launched.group(1)}"
                found[name] = (conda.group(1), path)
    return found


@cache
def _module(name: str) -> ast.Module:
    return ast.parse(_source(name).read_text())


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    # in a package's __init__, `.` is the package itself
    level = node.level - 1 if _source(module).name == "__init__.py" else node.level
    base = module.rsplit(".", level)[0] if level else module
    return f"{base}.{node.module}" if node.module else base


def _imports(nodes, module: str, skip_params: set[str] = frozenset()):
    """(third-party top-level names, [(qrerase module, name or None)]) of import statements in nodes."""
    third, internal = set(), []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and skip_params:
            test = node.test
            if (
                isinstance(test, ast.Compare)
                and isinstance(test.left, ast.Name)
                and test.left.id in skip_params
                and isinstance(test.ops[0], ast.IsNot)
            ):
                stack += node.orelse
                continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                (internal.append((alias.name, None)) if top == "qrerase" else third.add(top))
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if target.split(".")[0] == "qrerase":
                # `from .. import engine` imports the module qrerase.engine, not a name of qrerase
                internal += [
                    (f"{target}.{a.name}", None) if _is_module(f"{target}.{a.name}") else (target, a.name)
                    for a in node.names
                ]
            else:
                third.add(target.split(".")[0])
        stack += [c for c in ast.iter_child_nodes(node) if not isinstance(node, ast.Lambda)]
    return third, internal


def _source(name: str) -> Path:
    """The file of module ``name``: ``a/b.py``, or ``a/b/__init__.py`` for a package."""
    path = REPO / Path(*name.split("."))
    return path / "__init__.py" if (path / "__init__.py").is_file() else path.with_suffix(".py")


def _is_module(name: str) -> bool:
    return _source(name).is_file()


@cache
def _direct(module: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """(third-party packages, qrerase modules) the module-level statements of `module` import; the
    modules include its parent packages, whose `__init__` runs first."""
    tree = _module(module)
    top = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    third, internal = _imports(top, module)
    targets = [mod if name is None or not _is_module(f"{mod}.{name}") else f"{mod}.{name}" for mod, name in internal]
    parents = [module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)]
    return frozenset(third), tuple(t for t in [*targets, *parents] if _is_module(t) and t != module)


@cache
def module_level(module: str) -> frozenset[str]:
    """Third-party packages imported when `module` is imported (module-level, transitively)."""
    third, todo, seen = set(), [module], {module}
    while todo:
        direct, internal = _direct(todo.pop())
        third |= direct
        todo += [m for m in internal if m not in seen]
        seen.update(internal)
    return frozenset(third)


def symbol_imports(module: str, name: str, skip_params: frozenset[str] = frozenset(), seen=None) -> set[str]:
    """Third-party packages a call of `module.name` may import (its body and the library calls in it)."""
    seen = set() if seen is None else seen
    if (module, name) in seen or not _is_module(module):
        return set()
    seen.add((module, name))
    tree = _module(module)
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    aliases = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and _resolve(module, node).startswith("qrerase"):
            aliases.update({a.asname or a.name: (_resolve(module, node), a.name) for a in node.names})
    third = set(module_level(module))
    node = defs.get(name)
    if node is None:
        return third
    body_third, internal = _imports(node.body, module, set(skip_params))
    third |= body_third
    for mod, sym in internal:
        third |= module_level(mod) | (symbol_imports(mod, sym, seen=seen) if sym else set())
    called = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    called |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    for sym in called:
        if sym in defs and sym != name:
            third |= symbol_imports(module, sym, seen=seen)
        elif sym in aliases:
            third |= symbol_imports(*aliases[sym], seen=seen)
    return third


def script_imports(script: str) -> set[str]:
    tree = ast.parse((REPO / script).read_text())
    third, internal = _imports(tree.body, "workflow_scripts")
    passed: dict[str, set[str]] = {}
    positional: dict[str, int] = {}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            passed.setdefault(call.func.id, set()).update(k.arg for k in call.keywords if k.arg)
            positional[call.func.id] = max(positional.get(call.func.id, 0), len(call.args))
    for mod, name in internal:
        third |= module_level(mod)
        if name is None:
            continue
        fn = _module(mod).body
        args = next((n.args for n in fn if isinstance(n, ast.FunctionDef) and n.name == name), None)
        optional = set()
        if args is not None:  # parameters with a default that the script never passes
            with_default = args.args[len(args.args) - len(args.defaults) :]
            optional = {a.arg for i, a in enumerate(args.args) if a in with_default and i >= positional.get(name, 0)}
            optional |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
        third |= symbol_imports(mod, name, frozenset(optional - passed.get(name, set())))
    return {m for m in third if m not in sys.stdlib_module_names and m not in RUNNER and m != "__future__"}


def test_every_rule_uses_an_existing_env_listing_what_its_script_imports():
    found = rules()
    assert {"finetune", "lora", "factors", "evaluate", "tofu_table", "provenance_manifest"} <= set(found)
    for rule, (env, script) in found.items():
        assert (REPO / env).is_file(), f"rule {rule}: {env} not found"
        needed = {DIST.get(m, m).lower().replace("_", "-") for m in script_imports(script)}
        missing = needed - env_packages(REPO / env)
        assert not missing, f"rule {rule} ({script}) imports {sorted(missing)}, not in {env}"


def test_rule_families_are_smaller_than_the_all_in_one_env():
    envs = {rule: env for rule, (env, _) in rules().items()}
    assert envs["factors"] == "envs/linalg.yaml" and envs["tofu_table"] == "envs/tables.yaml"
    assert envs["finetune"] == "envs/train.yaml" and envs["evaluate"] == "envs/eval.yaml"
    assert "torch" not in env_packages(REPO / "envs/linalg.yaml") | env_packages(REPO / "envs/tables.yaml")
    everything = env_packages(REPO / "envs/qrerase.yaml")
    for family in ("train", "eval", "linalg", "tables"):
        assert env_packages(REPO / f"envs/{family}.yaml") <= everything


@pytest.mark.parametrize(
    "script, expected, absent",
    [
        ("workflow_scripts/core/factors.py", {"numpy", "scipy", "safetensors"}, {"torch"}),
        ("workflow_scripts/core/finetune.py", {"torch", "transformers", "pandas", "tqdm"}, {"tokenizers"}),
        ("workflow_scripts/core/train_tokenizer.py", {"tokenizers", "transformers"}, set()),
        ("workflow_scripts/core/evaluate.py", {"torch", "rouge_score", "peft"}, set()),
        ("workflow_scripts/tofu/table.py", {"pandas", "matplotlib", "scipy"}, {"torch"}),
    ],
)
def test_import_scan_sees_lazy_imports(script, expected, absent):
    found = script_imports(script)
    assert expected <= found and not (absent & found), sorted(found)


def _pins(env_file: Path) -> dict[str, str]:
    """name -> the exact version of every dependency of an env file; a dependency that is not an
    exact pin (conda ``name=version``, pip ``name==version``) fails, naming it."""
    env = yaml.safe_load(env_file.read_text())
    pins = {}
    for dep in env["dependencies"]:
        items, pattern = (
            (dep["pip"], r"([A-Za-z0-9_.-]+)==([0-9][\w.+]*)")
            if isinstance(dep, dict)
            else ([dep], r"([A-Za-z0-9_.-]+)=([0-9][\w.]*)")
        )
        for item in items:
            match = re.fullmatch(pattern, item)
            assert match, f"{env_file.name}: {item!r} is not an exact pin ({pattern})"
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_envs_pin_exact_versions_one_per_package():
    """Every env file pins exact versions (as the Snakemake workflow catalog does), a package has one
    version in every file, and each pin satisfies pyproject.toml's lower bound (docs/environments.md)."""
    from packaging.requirements import Requirement

    versions: dict[str, set[str]] = {}
    for env_file in sorted((REPO / "envs").glob("*.yaml")):
        for name, version in _pins(env_file).items():
            versions.setdefault(name, set()).add(version)
    assert {n: v for n, v in versions.items() if len(v) > 1} == {}
    pyproject = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"(?s)^dependencies = \[(.*?)^\]", pyproject, re.M).group(1)
    bounds = [Requirement(r) for r in re.findall(r'^\s*"([^"]+)"', deps, re.M)]  # comments may quote too
    assert len(bounds) >= 10
    for req in bounds:
        name = req.name.lower().replace("_", "-")
        assert name in versions, f"pyproject dependency {name} is pinned in no env file"
        (version,) = versions[name]
        assert req.specifier.contains(version, prereleases=True), f"{name}=={version} outside pyproject's {req}"
