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
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["phase", "cpu_phase", "totals", "reset"]

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
