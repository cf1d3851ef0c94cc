"""CPU seconds of one process by phase: what a job spends loading models beside its work.

The process's CPU time (:func:`time.process_time`: user + system, every thread) is split into named
phases by :func:`phase` (a context manager) or :func:`cpu_phase` (a decorator). Nested phases of the same
name count once, for the outermost; a phase inside another name's counts for both (the totals are
not exclusive). :func:`qrerase.workflow.job.job` logs the totals with the CPU the process had spent
before the job began (interpreter start-up and imports), and :mod:`qrerase.bench.run_profile` reads
those lines back into a per-rule profile.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["phase", "cpu_phase", "totals", "reset", "CPU_LINE", "cpu_line", "parse_cpu_line"]

_TOTALS: dict[str, float] = {}
_DEPTH: dict[str, int] = {}

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the CPU seconds the block takes to phase ``name`` (a non-empty string)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"phase: name must be a non-empty string, got {name!r}")
    depth = _DEPTH.get(name, 0)
    _DEPTH[name] = depth + 1
    begin = time.process_time()
    try:
        yield
    finally:
        _DEPTH[name] = depth
        if depth == 0:
            _TOTALS[name] = _TOTALS.get(name, 0.0) + time.process_time() - begin


def cpu_phase(name: str) -> Callable[[F], F]:
    """Decorator: every call of the function counts towards phase ``name`` (see :func:`phase`)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def totals() -> dict[str, float]:
    """CPU seconds per phase so far in this process (a copy; phases never entered are absent)."""
    return dict(_TOTALS)


def reset() -> None:
    """Forget every total (a test, or a process that runs several jobs)."""
    _TOTALS.clear()
    _DEPTH.clear()


#: The prefix of a job log's CPU line (:func:`cpu_line`).
CPU_LINE = "cpu seconds of rule"

_FIELDS = ("startup", "load", "record", "total")
_LINE = re.compile(CPU_LINE + r" (?P<rule>\S+): " + " ".join(rf"{f}=(?P<{f}>[0-9.]+)" for f in _FIELDS))


def cpu_line(rule: str, startup: float, totals: dict[str, float], total: float) -> str:
    """The CPU line a finished job logs: ``cpu seconds of rule <rule>: startup=<s> load=<s>
    record=<s> total=<s>``. ``startup`` is the process's CPU before the job began (the interpreter,
    Snakemake's script preamble, the script's imports); ``load`` the model and tokenizer loads
    (:func:`cpu_phase`, lazy imports of transformers included); ``record`` the provenance hashing;
    ``total`` the whole process's. The rest of ``total`` is the job's work. :func:`parse_cpu_line` reads it."""
    parts = {"startup": startup, "load": totals.get("load", 0.0), "record": totals.get("record", 0.0), "total": total}
    return f"{CPU_LINE} {rule}: " + " ".join(f"{k}={v:.3f}" for k, v in parts.items())


def parse_cpu_line(line: str) -> dict[str, float] | None:
    """``{startup, load, record, total}`` seconds of a line holding :func:`cpu_line`'s text, else None."""
    m = _LINE.search(line)
    return {f: float(m[f]) for f in _FIELDS} if m else None
