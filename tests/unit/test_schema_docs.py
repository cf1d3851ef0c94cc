"""Every config key in the schema has a description; docs/configuration.md is the generator's output."""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from support import REPO as ROOT

from qrerase import registry
from qrerase.cli import main
from qrerase.workflow.config_docs import DOCS_PATH, config_keys, generate, render, undocumented
from qrerase.workflow.validation import load_schema

CONFIGS = [
    ROOT / "config.yaml",
    *sorted((ROOT / "config").glob("*.yaml")),
    *sorted((ROOT / "tests/configs").glob("*.yaml")),
]


@pytest.fixture(scope="module")
def schema() -> dict:
    return load_schema()


def test_every_key_has_a_description(schema):
    missing = undocumented(schema)
    assert not missing, f"schema keys without a description: {', '.join(missing)}"


def _drop_description(node: dict, *path) -> None:
    for step in path:
        node = node[step]
    del node["description"]


def test_undocumented_names_each_missing_key(schema):
    broken = copy.deepcopy(schema)
    props = ("properties",)
    _drop_description(broken, "definitions", "speech_sweep", *props, "param")  # a $ref'd definition
    _drop_description(broken, "definitions", "engine_keys", "backend")  # reached only through $ref
    sizes = (*props, "task_level", *props, "data", *props, "sizes", "additionalProperties")
    _drop_description(broken, *sizes, *props, "train")  # inside an additionalProperties object
    _drop_description(broken, *props, "finetune", "allOf", 1, *props, "mode")  # an allOf branch
    _drop_description(broken, *props, "model", *props, "template", "oneOf", 1, *props, "answer_end")  # oneOf
    _drop_description(broken, *props, "tofu", *props, "imported_models", "items", *props, "log")  # list items
    missing = set(undocumented(broken))
    for key in (
        "speech.tradeoff.baselines.ga.param",
        "speech.tradeoff.baselines.bad_teaching.param",
        "definitions.speech_sweep.param",
        "finetune.backend",
        "speech.baselines.common.backend",
        "tofu.baselines.flat.backend",
        "task_level.data.sizes.<name>.train",
        "finetune.mode",
        "model.template.answer_end",
        "tofu.imported_models[].log",
    ):
        assert key in missing, key
    assert "finetune.epochs" not in missing and "task_level.data.sizes.<name>.eval" not in missing


def _config_paths(node: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.append(path)
        if isinstance(value, dict):
            out += _config_paths(value, path)
    return out


@pytest.mark.parametrize("config_path", CONFIGS, ids=lambda p: p.name)
def test_walk_reaches_every_key_of_the_shipped_configs(schema, config_path):
    """The walker is the schema's key space: every key written in a shipped config is one of its paths."""
    paths = {k.path for k in config_keys(schema)}
    sizes = "task_level.data.sizes."
    unknown = []
    for path in _config_paths(yaml.safe_load(config_path.read_text()) or {}):
        if path.startswith(sizes) and path != sizes.rstrip("."):  # a skill name: the <name> placeholder
            skill, _, rest = path[len(sizes) :].partition(".")
            path = f"{sizes}<name>" + (f".{rest}" if rest else "")
        if path not in paths:
            unknown.append(path)
    assert not unknown, f"{config_path.name}: keys the walker does not reach: {unknown}"


def test_render_lists_types_bounds_enums_and_defaults(schema):
    defaults = yaml.safe_load((ROOT / "config.yaml").read_text())
    text = render(schema, defaults)
    rows = {line.split(" | ")[0].strip("| `"): line for line in text.splitlines() if line.startswith("| `")}
    sections = {line[4:-1] for line in text.splitlines() if line.startswith("## `")}  # top-level objects
    assert sorted(rows.keys() | sections) == sorted(k.path for k in config_keys(schema))
    assert not rows.keys() & sections and {"tofu", "speech", "finetune", "resources"} <= sections
    assert "| integer in [0, 4294967295] | `0` | **Required.** every random choice" in rows["seed"]
    assert "number > 0" in rows["unlearn.scale"] and f"`{defaults['unlearn']['scale']}`" in rows["unlearn.scale"]
    assert "null or integer in [2, 200]" in rows["tofu.data.n_authors"]
    for name in registry.methods_for("speech"):  # enums injected from the registry, not the file
        assert f"`{name}`" in rows["methods.speech"]
    assert "<code>^(cpu&#124;auto&#124;cuda(:[0-9]+)?)$</code>" in rows["model.device"]  # no bare | in a row
    assert "`1` (schema)" in rows["resources.train.processes"] or "`1`" in rows["resources.train.processes"]
    assert "&lt;rule&gt;" in rows["finetune.checkpoint_every"]  # prose escaped for Markdown
    assert "task_level.data.sizes.<name>.new" in rows and "tofu.imported_models[].name" in rows
    for line in rows.values():  # four cells: no stray pipe splits a row
        assert len(re.split(r"(?<!\\)\|", line)) == 6, line
    assert render(schema, defaults) == text  # deterministic
    assert "| `seed` | integer in [0, 4294967295] |  |" in render(schema, None)  # no defaults: empty column


def test_committed_reference_is_current():
    assert DOCS_PATH.read_text(encoding="utf-8") == generate(), (
        "docs/configuration.md is stale: run `qrerase config-docs`"
    )


def test_cli_writes_and_checks(tmp_path, capsys):
    out = tmp_path / "configuration.md"
    args = ["config-docs", "--out", str(out), "--defaults", str(ROOT / "config.yaml")]
    assert main([*args, "--check"]) == 1 and not out.exists()
    assert main(args) == 0
    assert out.read_text(encoding="utf-8") == DOCS_PATH.read_text(encoding="utf-8")
    assert main([*args, "--check"]) == 0
    out.write_text(out.read_text(encoding="utf-8").replace("torch threads per job", "threads"), encoding="utf-8")
    assert main([*args, "--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_schema_is_package_data_linked_to_the_source():
    """The loader reads qrerase/workflow/config.schema.yaml (package data, copied into a wheel); in the
    checkout it is a link to schemas/config.schema.yaml, the file the Snakefile validates with."""
    from qrerase.workflow.validation import SCHEMA_PATH

    assert SCHEMA_PATH.parent == ROOT / "qrerase" / "workflow" and SCHEMA_PATH.is_symlink()
    assert SCHEMA_PATH.resolve() == (ROOT / "schemas" / "config.schema.yaml").resolve()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"qrerase.workflow" = ["config.schema.yaml", "config.yaml"]' in pyproject
