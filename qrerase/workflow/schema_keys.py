"""Walking the config schema: every key at any depth, with its description (:func:`config_keys`).

Every config key is a property of the config schema (``schemas/config.schema.yaml`` with the tracks'
sections, :attr:`qrerase.tracks.Track.schema`) at some depth: under ``properties``, in
an ``allOf`` / ``oneOf`` / ``anyOf`` branch, in a ``$ref``'d definition, in the items of a list of
objects (path ``a[].b``) or in an ``additionalProperties`` object (path ``a.<name>.b``). Used by the
validation (the keys allowed where an unknown key stands) and by the generated reference
(:mod:`qrerase.workflow.config_docs`); it imports neither.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigKey", "config_keys", "resolve_ref"]


@dataclass(frozen=True)
class ConfigKey:
    """One config key: its dotted path (``a[].b`` inside list items, ``a.<name>`` for any name), its
    schema node as written, its description (own or through ``$ref``; None when missing) and whether
    its parent object requires it."""

    path: str
    node: Mapping[str, Any]
    description: str | None
    required: bool


def resolve_ref(schema: Mapping, ref: str) -> Mapping:
    """The schema node a local ``$ref`` (``#/definitions/x``) points to."""
    if not ref.startswith("#/"):
        raise ValueError(f"schema: only local $refs are supported, got {ref!r}")
    node: Any = schema
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _description(schema: Mapping, node: Mapping) -> str | None:
    seen: set[str] = set()
    while True:
        text = node.get("description")
        if isinstance(text, str) and text.strip():
            return " ".join(text.split())
        ref = node.get("$ref")
        if ref is None or ref in seen:
            return None
        seen.add(ref)
        node = resolve_ref(schema, ref)


def _children(schema: Mapping, node: Any, follow_refs: bool, stack: tuple[str, ...] = ()) -> Iterator[tuple]:
    """(path suffix, child node, required, refs followed so far) of one schema node: its properties,
    those of its combinator branches (and of ``$ref`` targets when ``follow_refs``; a ref already on
    ``stack`` is not followed again), list items and ``additionalProperties`` objects."""
    if not isinstance(node, Mapping):
        return
    ref = node.get("$ref")
    if follow_refs and ref is not None and ref not in stack:
        yield from _children(schema, resolve_ref(schema, ref), follow_refs, (*stack, ref))
    for keyword in ("allOf", "oneOf", "anyOf"):  # a shared base (allOf: [$ref]) before the keys it adds
        for branch in node.get(keyword, []):
            yield from _children(schema, branch, follow_refs, stack)
    required = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        yield f".{name}", child, name in required, stack
    items = node.get("items")
    if isinstance(items, Mapping):
        for suffix, child, required_child, inner in _children(schema, items, follow_refs, stack):
            yield f"[]{suffix}", child, required_child, inner
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        yield ".<name>", extra, False, stack


def config_keys(
    schema: Mapping, follow_refs: bool = True, node: Mapping | None = None, prefix: str = ""
) -> list[ConfigKey]:
    """Every key below ``node`` (default: the whole schema), depth first in schema order. A path met twice
    (the same key in two branches) is listed once, with the first description found."""
    out: dict[str, ConfigKey] = {}

    def visit(current: Any, path: str, stack: tuple[str, ...]) -> None:
        for suffix, child, required, inner in _children(schema, current, follow_refs, stack):
            key_path = f"{path}{suffix}".lstrip(".")
            text = _description(schema, child)
            if key_path not in out or (out[key_path].description is None and text is not None):
                out[key_path] = ConfigKey(key_path, child, text, required)
            visit(child, key_path, inner)

    visit(schema if node is None else node, prefix, ())
    return list(out.values())
