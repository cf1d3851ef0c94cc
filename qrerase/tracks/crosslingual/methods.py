"""The cross-lingual track's methods: the built-in text baselines, run with the shared text runner (torch-free).

Imported by :mod:`qrerase.registry` after the text baselines (:data:`qrerase.baselines.MODULES`) and before
the other tracks' methods (:attr:`qrerase.tracks.Track.methods`), so the registry's order is unchanged:
each text baseline serves the TOFU track, then this one.
"""

from __future__ import annotations

from ...registry import baselines_of_runner, extend_method

for _name in baselines_of_runner("text"):
    extend_method(_name, tracks=("crosslingual",), run={})
