"""Romanisation (transliteration into Latin script) of non-Latin TOFU translations.

The paper's cross-lingual tables include romanised variants of some languages ("Hindi (R)"): the same
text written in Latin letters. Here they are made with real transliteration libraries, one per
script (:data:`ROMANISERS`):

==============  ======================================================  ======================
script          library and scheme                                      reversible
==============  ======================================================  ======================
``devanagari``  ``indic_transliteration.sanscript`` → ISO 15919          yes (but ASCII digits come back
                (danda । written as a full stop)                        as Devanagari digits, । as .)
``japanese``    ``pykakasi`` (kanji/kana → modified Hepburn romaji)      no (kanji readings are
                                                                        dictionary choices)
==============  ======================================================  ======================

ISO 15919 writes long vowels and retroflexes with diacritics (``kā``, ``ṭ``); it maps back to
Devanagari exactly, except that ASCII digits come back as Devanagari digits. Scripts without an
entry here (Arabic, Hebrew, Hangul, Cyrillic) have no romaniser: asking for one is an error.

Every function is pure and deterministic; the libraries are imported on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ROMANISERS", "romaniser", "romanise_text", "romanise_record", "TEXT_FIELDS"]

#: script -> human description of the transliteration used.
ROMANISERS: dict[str, str] = {
    "devanagari": "Devanagari -> ISO 15919 (indic-transliteration)",
    "japanese": "Japanese kanji/kana -> Hepburn romaji (pykakasi)",
}

#: record fields that hold text (strings, or lists of strings for perturbed answers).
TEXT_FIELDS: tuple[str, ...] = ("question", "answer", "paraphrased_answer", "paraphrased_question", "perturbed_answer")


def _devanagari() -> Callable[[str], str]:
    from indic_transliteration import sanscript

    def convert(text: str) -> str:
        # ISO 15919 keeps the danda sentence marks (। ॥); written in Latin script they are full stops.
        return sanscript.transliterate(text, sanscript.DEVANAGARI, sanscript.ISO).replace("॥", ".").replace("।", ".")

    return convert


def _japanese() -> Callable[[str], str]:
    import pykakasi

    kks = pykakasi.kakasi()

    def convert(text: str) -> str:
        # pykakasi splits text into segments (words, punctuation, spaces); romaji segments are joined
        # by single spaces and runs of whitespace collapsed, so the output is space-separated words.
        return " ".join(" ".join(seg["hepburn"] for seg in kks.convert(text)).split())

    return convert


_FACTORIES: dict[str, Callable[[], Callable[[str], str]]] = {"devanagari": _devanagari, "japanese": _japanese}


@functools.cache
def romaniser(script: str) -> Callable[[str], str]:
    """The ``str -> str`` romaniser of ``script`` (see :data:`ROMANISERS`); ``ValueError`` if there is none."""
    if script not in _FACTORIES:
        raise ValueError(
            f"no romaniser for the {script} script; available: "
            + ", ".join(f"{s} ({d})" for s, d in ROMANISERS.items())
        )
    return _FACTORIES[script]()


def romanise_text(text: str, script: str) -> str:
    """Transliterate ``text`` (written in ``script``) into Latin script."""
    if not isinstance(text, str):
        raise TypeError(f"romanise_text: expected a string, got {type(text).__name__}")
    return romaniser(script)(text)


def romanise_record(record: Mapping[str, Any], script: str) -> dict[str, Any]:
    """A copy of a TOFU record with every text field (:data:`TEXT_FIELDS`) transliterated.

    ``perturbed_answer`` may be a list of strings (each is transliterated); other fields are copied
    unchanged.
    """
    convert = romaniser(script)
    out = dict(record)
    for key in TEXT_FIELDS:
        if key not in out or out[key] is None:
            continue
        value = out[key]
        if isinstance(value, str):
            out[key] = convert(value)
        elif isinstance(value, (list, tuple)):
            out[key] = [convert(v) for v in value]
        else:
            raise TypeError(f"romanise_record: field {key!r} holds {type(value).__name__}, expected text")
    return out
