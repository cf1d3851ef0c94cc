"""The configuration reference (``docs/configuration.md``), generated from the config schema.

Every config key is a property of the config schema (``schemas/config.schema.yaml`` with the tracks'
sections, :attr:`qrerase.tracks.Track.schema`) at some depth: under ``properties``, in
an ``allOf`` / ``oneOf`` / ``anyOf`` branch, in a ``$ref``'d definition, in the items of a list of
objects (path ``a[].b``) or in an ``additionalProperties`` object (path ``a.<name>.b``).
:func:`config_keys` walks them all; :func:`undocumented` names every key without a ``description``
(its own, or that of the definition its ``$ref`` points to); :func:`render` writes the Markdown page:
one table per top-level section (key path, type with its bounds or allowed values, the value in
``config.yaml``, description) and one per shared object definition. The output depends only on the
schema (as :func:`qrerase.workflow.validation.load_schema` returns it, registry enums injected) and the
defaults given, so the committed page can be compared with a fresh render (tests/unit/test_schema_docs.py).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .schema_keys import ConfigKey, config_keys, resolve_ref

__all__ = ["ConfigKey", "config_keys", "undocumented", "render", "generate", "write", "DOCS_PATH", "DEFAULTS_PATH"]

#: Where the generated reference lives (in a checkout: docs/ is not package data).
DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
#: The config its "Default" column reads: the embedded default config.yaml (package data).
DEFAULTS_PATH = Path(__file__).resolve().parent / "config.yaml"

_VALUE_WIDTH = 60  # longer config.yaml values are cut (the page links config.yaml for the whole value)


def undocumented(schema: Mapping) -> list[str]:
    """The paths of every key without a description: the config's keys (``$ref``s followed) and the keys
    of each definition (``definitions.<name>.<key>``), so an unused definition is checked too."""
    missing = [k.path for k in config_keys(schema) if k.description is None]
    for name, definition in schema.get("definitions", {}).items():
        keys = config_keys(schema, node=definition, prefix=f"definitions.{name}")
        missing += [k.path for k in keys if k.description is None]
    return list(dict.fromkeys(missing))


# ----------------------------------------------------------------------------------------- rendering


def _number(value: Any) -> str:
    return json.dumps(value)


def _bounds(node: Mapping) -> str:
    """``in [a, b)``, ``≥ a``, ``> a``, ``≤ b`` or ``< b`` from the node's (exclusive) minimum and maximum."""
    low = next(((br, node[k]) for br, k in (("[", "minimum"), ("(", "exclusiveMinimum")) if k in node), None)
    high = next(((br, node[k]) for br, k in (("]", "maximum"), (")", "exclusiveMaximum")) if k in node), None)
    if low and high:
        return f" in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
    if low:
        return f" {'≥' if low[0] == '[' else '>'} {_number(low[1])}"
    if high:
        return f" {'≤' if high[0] == ']' else '<'} {_number(high[1])}"
    return ""


def _type(schema: Mapping, node: Any) -> str:
    """A node's type with its bounds, allowed values, pattern and list constraints, in words."""
    if not isinstance(node, Mapping):
        return "any"
    ref = node.get("$ref")
    if ref is not None:
        node = {**resolve_ref(schema, ref), **{k: v for k, v in node.items() if k != "$ref"}}
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{v if isinstance(v, str) else json.dumps(v)}`" for v in node["enum"])
    for keyword in ("oneOf", "anyOf"):
        if keyword in node:
            return " or ".join(_type(schema, branch) for branch in node[keyword])
    if "allOf" in node and "type" not in node:
        return _type(schema, node["allOf"][0])  # the first branch carries the type (the others add keys)
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    words = []
    for k in kinds:
        if k == "array":
            text = "list"
            if "items" in node:
                item = _type(schema, node["items"])
                text += f" of values from {item[len('one of ') :]}" if item.startswith("one of ") else f" of {item}"
            extras = []
            if "minItems" in node:
                extras.append(f"at least {node['minItems']} item{'s' if node['minItems'] != 1 else ''}")
            if node.get("uniqueItems"):
                extras.append("unique")
            words.append(text + (f" ({', '.join(extras)})" if extras else ""))
        elif k == "object" and isinstance(node.get("additionalProperties"), Mapping):
            words.append("mapping of name to object")
        else:
            words.append(f"{k}{_bounds(node)}" if k in ("integer", "number") else str(k))
    text = " or ".join(words) if words else "object" if "properties" in node else "any"
    if "pattern" in node:
        text += f" matching `{node['pattern']}`"
    return text


def _lookup(cfg: Mapping | None, path: str) -> tuple[bool, Any]:
    if cfg is None or "[]" in path or "<name>" in path:
        return False, None
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if len(text) > _VALUE_WIDTH:
        text = text[: _VALUE_WIDTH - 1] + "…"
    return f"`{text}`" if "`" not in text else text


def _prose(text: str) -> str:
    """Markdown-safe prose: code spans kept, elsewhere ``<``, ``>``, ``*`` and word-edge ``_`` escaped."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside code spans
        part = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
        parts[i] = re.sub(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])", r"\\_", part)
    return "`".join(parts)


def _cell(text: str) -> str:
    """A table cell: a pipe outside code is escaped (``\\|``); a code span holding a pipe becomes
    ``<code>`` with ``&#124;``, since renderers differ on escapes inside backticks in tables."""
    out = []
    for i, part in enumerate(text.split("`")):  # odd parts are code spans
        if i % 2 == 0:
            out.append(part.replace("|", r"\|"))
        elif "|" in part:
            out.append("<code>" + html.escape(part, quote=False).replace("|", "&#124;") + "</code>")
        else:
            out.append(f"`{part}`")
    return "".join(out)


def _default(key: ConfigKey, defaults: Mapping | None, inline_children: bool) -> str:
    found, value = _lookup(defaults, key.path)
    if found and not (inline_children and isinstance(value, Mapping)):
        return _value(value)
    if isinstance(key.node, Mapping) and "default" in key.node:
        return f"{_value(key.node['default'])} (schema)"
    return ""


def _table(schema: Mapping, keys: list[ConfigKey], defaults: Mapping | None) -> list[str]:
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    paths = [k.path for k in keys]
    for key in keys:
        inline_children = any(p.startswith(key.path + ".") or p.startswith(key.path + "[]") for p in paths)
        description = _prose(key.description or "(undocumented)")
        if key.required:
            description = f"**Required.** {description}"
        row = [f"`{key.path}`", _type(schema, key.node), _default(key, defaults, inline_children), description]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def render(schema: Mapping, defaults: Mapping | None = None) -> str:
    """The configuration reference as Markdown. ``schema``: as :func:`~qrerase.workflow.validation.load_schema`
    returns it; ``defaults``: the default config (``config.yaml``) whose values fill the Default column."""
    keys = config_keys(schema)
    top = [k for k in keys if "." not in k.path and "[]" not in k.path]
    sections = [k for k in top if any(o.path.startswith(k.path + ".") for o in keys)]
    plain = [k for k in top if k not in sections]
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `qrerase config-docs` from the config schema and config.yaml; do not edit. -->",
        "",
        "Every key of a config file is validated against the config schema when the workflow starts",
        "(`qrerase.workflow.validation.validate`): `schemas/config.schema.yaml`, with each track's own section",
        "from its `Track.schema` (a built-in track's `qrerase/tracks/<name>/schema.yaml`). This page is",
        "generated from that schema, so each description below is the one in the schema. Method and track",
        "names come from `qrerase.registry`.",
        "*Default* is the value in the embedded `config.yaml` (long values cut; see the file), or the",
        "schema's own default. A path `a[].b` is key `b` of each item of list `a`; `a.<name>` stands for any",
        "name. Keys marked *Required* must be present whenever their parent is.",
        "",
        "A key repeated in one mapping of any config file (`unlearn:` twice in an overlay) is refused with",
        "the file, the line and the key; YAML readers keep the last one silently. `--config key=VALUE` takes",
        "a top-level key (Snakemake itself refuses a dotted one such as `unlearn.scale=2`); a nested value",
        "`--config 'unlearn={rank: 3}'` is typed as in a config file. For more, write the keys to a file and",
        "pass it with `--configfile`.",
        "",
        "## Top level",
        "",
        *_table(schema, plain, defaults),
    ]
    for section in sections:
        members = [k for k in keys if k.path.startswith(section.path + ".")]
        lines += ["", f"## `{section.path}`", "", _prose(section.description or "(undocumented)"), ""]
        lines += _table(schema, members, defaults)
    return "\n".join(lines) + "\n"


def generate(schema_path: str | Path | None = None, defaults_path: str | Path | None = DEFAULTS_PATH) -> str:
    """The reference rendered from the schema file (registry enums injected) and the default config
    (its Default column is left empty when ``defaults_path`` is None or missing)."""
    from ..io import load_yaml
    from .validation import SCHEMA_PATH, load_schema

    schema = load_schema(schema_path or SCHEMA_PATH)
    defaults = None
    if defaults_path is not None and Path(defaults_path).is_file():
        defaults = load_yaml(defaults_path)
    return render(schema, defaults)


def write(out: str | Path = DOCS_PATH, text: str | None = None) -> str:
    """Write the reference (``text``, default :func:`generate`'s) to ``out`` atomically; returns it."""
    from ..io import write_text

    text = generate() if text is None else text
    write_text(out, text)
    return text
