"""Every number of the config schema is validated by type and range, and NaN/inf nowhere pass.

The test walks schemas/config.schema.yaml (through $ref, allOf, oneOf, additionalProperties and
array items), and for every numeric key tries an out-of-range value, an ill-typed value (2.0 for an
integer, a string, a bool) and NaN/inf, each expecting one line naming the key. A few cases also go
through ``snakemake -n`` to show the error comes at planning time and writes nothing.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO

from qrerase.workflow.validation import ConfigError, check_schema, load_schema, validate

SCHEMA = load_schema()
NUMERIC = ("integer", "number")


def resolve(node: dict) -> dict:
    """A schema node with its $ref and allOf merged in (properties and required united)."""
    node = dict(node)
    if "$ref" in node:
        target = SCHEMA
        for part in node.pop("$ref").removeprefix("#/").split("/"):  # a JSON pointer: #/definitions/a/b
            target = target[part]
        node = {**resolve(target), **node}
    for part in node.pop("allOf", []):
        part = resolve(part)
        for key, value in part.items():
            if key == "properties":
                node["properties"] = {**value, **node.get("properties", {})}
            elif key == "required":
                node["required"] = sorted(set(value) | set(node.get("required", [])))
            else:
                node.setdefault(key, value)
    return node


def types(node: dict) -> set[str]:
    t = node.get("type", [])
    return {t} if isinstance(t, str) else set(t)


def numeric_leaves(node: dict, path: tuple = (), along: tuple = ()):
    """(path, leaf schema, schemas of the path's containers) for every numeric key; '*' is an
    additionalProperties key, '[]' an array item."""
    node = resolve(node)
    for branch in node.get("oneOf", []):
        yield from numeric_leaves(branch, path, along)
    if types(node) & set(NUMERIC):
        yield path, node, along
    for key, sub in node.get("properties", {}).items():
        yield from numeric_leaves(sub, path + (key,), along + (node,))
    if isinstance(node.get("additionalProperties"), dict):
        yield from numeric_leaves(node["additionalProperties"], path + ("*",), along + (node,))
    if "items" in node:
        yield from numeric_leaves(node["items"], path + ("[]",), along + (node,))


def example(node: dict):
    """A valid value of a schema node (objects get their required keys only)."""
    node = resolve(node)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return node["enum"][0]
    if "oneOf" in node:
        return example(next(b for b in node["oneOf"] if types(resolve(b)) != {"null"}))
    t = types(node) - {"null"}
    if "object" in t or (not t and "properties" in node):
        props = node.get("properties", {})
        return {k: example(props[k]) for k in node.get("required", [])}
    if "array" in t:
        return [example(node["items"])] * max(1, node.get("minItems", 1))
    if "integer" in t:
        return max(1, node.get("minimum", 1), node.get("exclusiveMinimum", 0) + 1)
    if "number" in t:
        low = node.get("minimum", node.get("exclusiveMinimum", 0))
        high = node.get("maximum", node.get("exclusiveMaximum", low + 2))
        return (low + high) / 2
    if "boolean" in t:
        return False
    return "x"


def _read_base() -> dict:
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    task = yaml.safe_load((REPO / "tests" / "configs" / "test_task.yaml").read_text())
    cfg.setdefault("task_level", task["task_level"])
    return cfg


_BASE = _read_base()


def base_config() -> dict:
    """config.yaml with the task-level track's section (every optional section the schema knows)."""
    return copy.deepcopy(_BASE)


def place(cfg: dict, path: tuple, along: tuple, leaf_schema: dict, value) -> str:
    """Put ``value`` at ``path`` in ``cfg`` (missing containers made valid); the dotted key it names."""
    node, keys, parent = cfg, [], None  # parent: set one step before a "[]" part
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if part == "[]":  # node is the array's parent dict; keys[-1] the array
            parent_key = keys[-1]
            holder = parent
            holder[parent_key] = [value] if last else [example(along[i + 1] if i + 1 < len(along) else leaf_schema)]
            keys.append("0")
            node = holder[parent_key][0]
            continue
        if part == "*":
            part = next(iter(node), "x") if isinstance(node, dict) else "x"
        keys.append(str(part))
        if last:
            node[part] = value
            break
        container = along[i + 1] if i + 1 < len(along) else leaf_schema
        nxt = path[i + 1]
        if nxt == "[]":
            parent = node
            continue
        if not isinstance(node.get(part), dict):
            node[part] = example(container)
        parent, node = node, node[part]
    return ".".join(keys)


def bad_values(schema: dict) -> list:
    """Out-of-range and ill-typed values, then NaN and infinity."""
    out = []
    if "minimum" in schema:
        out.append(schema["minimum"] - 1)
    if "exclusiveMinimum" in schema:
        out.append(schema["exclusiveMinimum"])
    if "maximum" in schema:
        out.append(schema["maximum"] + 1)
    if "exclusiveMaximum" in schema:
        out.append(schema["exclusiveMaximum"])
    valid = example(schema)
    if "integer" in types(schema):
        out.append(float(valid))  # 2.0 for a rank: JSON Schema's integer would take it
    out += [str(valid), True, math.nan, math.inf, -math.inf]
    return out


LEAVES = {}
for _path, _leaf, _along in numeric_leaves(SCHEMA):
    LEAVES.setdefault(_path, (_leaf, _along))


def test_the_walk_finds_the_numeric_keys():
    keys = {".".join(p) for p in LEAVES}
    assert {
        "seed",
        "unlearn.rank",
        "unlearn.scale",
        "lora.dropout",
        "tofu.baselines.npo.beta",
        "tofu.baselines.ga.lr",
        "speech.scale",
        "task_level.scale",
        "tradeoff.scales.[]",
        "speech.baselines.scrub.temperature",
        "task_level.data.sizes.*.train",
        "resources.train.mem_mb",
        "crosslingual.pretrain.lr",
    } <= keys
    assert len(keys) > 120


@pytest.mark.parametrize("path", sorted(LEAVES), ids=lambda p: ".".join(p))
def test_every_numeric_key_is_bounded_and_refuses_bad_values(path, monkeypatch):
    monkeypatch.chdir(REPO)  # config paths (data/...) are relative to the working directory
    leaf, along = LEAVES[path]
    assert "minimum" in leaf or "exclusiveMinimum" in leaf, f"{'.'.join(path)}: no lower bound in the schema"
    good = base_config()
    key = place(good, path, along, leaf, example(leaf))
    check_schema(good)  # the filled-in config is valid with a valid value at the key
    for value in bad_values(leaf):
        cfg = base_config()
        place(cfg, path, along, leaf, value)
        with pytest.raises(ConfigError) as info:
            validate(cfg)
        text = str(info.value)
        assert text.startswith(f"config key '{key}': "), (value, text)
        assert "\n" not in text


@pytest.mark.parametrize("value", [2.0, 2.5, "2"])
def test_a_float_rank_is_refused(value, monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = base_config()
    cfg["unlearn"]["rank"] = value
    with pytest.raises(ConfigError, match=r"^config key 'unlearn\.rank': .* is not of type 'integer'"):
        validate(cfg)


def test_nan_is_refused_under_any_key_even_one_the_schema_does_not_bound(monkeypatch):
    monkeypatch.chdir(REPO)
    cfg = base_config()
    cfg["model"]["template"] = {"question_start": math.nan}  # a string key: NaN still named first
    with pytest.raises(
        ConfigError, match=r"^config key 'model\.template\.question_start': nan is not a finite number$"
    ):
        validate(cfg)


def _dry_run(tmp_path: Path, override: str) -> subprocess.CompletedProcess:
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "test.yaml").read_text())
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    for key, value in yaml.safe_load(override).items():  # merged: a repeated top-level key is refused
        cfg[key] = {**cfg.get(key, {}), **value}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "-n",
        "--cores",
        "1",
        "--configfile",
        str(tmp_path / "bad.yaml"),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "override, message",
    [
        ("unlearn: {rank: 2, scale: -1}\n", "config key 'unlearn.scale': -1 is less than or equal to the minimum of 0"),
        ("unlearn: {rank: 2.0}\n", "config key 'unlearn.rank': 2.0 is not of type 'integer'"),
        ("finetune: {epochs: 1, lr: .nan, batch_size: 4}\n", "config key 'finetune.lr': nan is not a finite number"),
    ],
)
def test_bad_numbers_fail_at_planning_time_and_write_nothing(tmp_path, override, message):
    proc = _dry_run(tmp_path, override)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert message in text, text[-2000:]
    assert not (tmp_path / "results").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".snakemake") == ["bad.yaml"]


def test_the_removed_deepspeed_backend_fails_at_planning_time(tmp_path):
    """DeepSpeed was removed from the backends until it can be tested (docs/training-engine.md)."""
    proc = _dry_run(tmp_path, "finetune: {epochs: 1, lr: 0.001, batch_size: 4, backend: deepspeed}\n")
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "config key 'finetune.backend': 'deepspeed' is not one of ['ddp', 'fsdp']" in text, text[-2000:]
    assert not (tmp_path / "results").exists()
