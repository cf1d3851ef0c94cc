"""MkDocs hook (mkdocs.yml ``hooks:``): the pages' math as MathML, converted when the site is built.

``pymdownx.arithmatex`` (generic mode) leaves each ``\\( … \\)`` / ``\\[ … \\]`` of a page as TeX in a
``<span class="arithmatex">`` / ``<div class="arithmatex">``; this hook replaces each with the MathML
that ``latex2mathml`` (PyPI, the ``docs`` extra) converts it to. Browsers render MathML Core natively,
so the built site shows its equations with no script and no network (no CDN), wherever it is served.

``aligned`` (not supported by latex2mathml) is converted as ``align*``: the same rows and ``&``
columns, as an ``<mtable>`` (docs/stylesheets/mathml.css aligns its columns). A formula that does not
convert, or converts to MathML that is not well-formed or still holds a TeX command (latex2mathml
passes unknown commands through as text), fails the build with the page and the formula.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

from latex2mathml.converter import convert

_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.DOTALL)
_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.DOTALL)
_ALIGNED = re.compile(r"\\(begin|end)\{aligned\}")
_TEX_LEFT = re.compile(r"\\[A-Za-z]")


def tex_to_mathml(tex: str, display: str = "inline", where: str = "docs") -> str:
    """One TeX formula (HTML-escaped, as arithmatex writes it) → one ``<math>`` element (str).

    ``display`` is ``"inline"`` or ``"block"``; ``where`` names the page in the error. A formula that
    latex2mathml rejects, or whose MathML is not well-formed XML or keeps a ``\\command`` → ValueError.
    """
    if display not in ("inline", "block"):
        raise ValueError(f"{where}: display must be 'inline' or 'block', got {display!r}")
    source = _ALIGNED.sub(r"\\\1{align*}", html.unescape(tex).strip())
    try:
        mathml = convert(source, display=display)
        tree = ET.fromstring(mathml)
    except Exception as exc:  # latex2mathml raises its own exception types, ET a ParseError
        raise ValueError(f"{where}: cannot convert the formula {source!r} to MathML: {exc}") from exc
    left = [t for t in tree.itertext() if _TEX_LEFT.search(t)]
    if left:
        raise ValueError(f"{where}: the formula {source!r} keeps TeX commands {left} (unknown to latex2mathml)")
    return mathml


def on_page_content(html_text: str, page, config, files) -> str:
    """MkDocs ``on_page_content`` event: every arithmatex formula of the page's HTML → MathML."""
    where = page.file.src_uri
    html_text = _BLOCK.sub(lambda m: f'<div class="math">{tex_to_mathml(m[1], "block", where)}</div>', html_text)
    return _INLINE.sub(lambda m: tex_to_mathml(m[1], "inline", where), html_text)
