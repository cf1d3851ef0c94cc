"""Which rank of a launched job opened which file: ``strace -f -v`` over a whole command (a ``snakemake``
run, say), then each traced process is given the ``RANK`` of the environment it was started with
(``execve``'s environment, which ``accelerate launch`` / ``torch.distributed.run`` set per worker) or,
for a thread or a child that did not set one, its parent's (``clone`` / ``fork`` return values)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

_CALL = re.compile(r"^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (\w+) resumed>(.*)\)\s+=\s+(-?\d+)")
_RANK = re.compile(r'"RANK=(\d+)"')
_PATH = re.compile(r'^\s*(?:AT_FDCWD|\d+<[^>]*>|-?\d+),\s+"([^"]+)"')
_FORKS = ("clone", "clone3", "fork", "vfork")


def strace_missing() -> str | None:
    """Why strace cannot attribute file opens to ranks here (a skip reason naming the package), or None."""
    exe = shutil.which("strace")
    if exe is None:
        return "strace is not installed (apt-get install strace, as .ci/run does); it attributes file opens to ranks"
    if subprocess.run([exe, "-f", "-qq", "-o", os.devnull, "true"], capture_output=True).returncode:
        return "strace cannot trace processes here (ptrace is not permitted); it attributes file opens to ranks"
    return None


def strace_prefix(log: Path) -> list[str] | None:
    """The command prefix that writes ``log`` (successful opens, execs and forks of every process,
    environments in full), or None where strace is missing or cannot trace here."""
    if strace_missing():
        return None
    exe = shutil.which("strace")
    syscalls = "trace=openat,execve," + ",".join(_FORKS)
    return [
        exe,
        "-f",
        "-v",
        "-qq",
        "--seccomp-bpf",
        "-s",
        "256",
        "-e",
        syscalls,
        "-e",
        "status=successful",
        "-o",
        str(log),
    ]


def opens_by_rank(log: Path, cwd: Path) -> Counter:
    """``Counter`` of ``(rank, resolved path)`` over the successful ``openat`` calls in ``log``; rank is
    None for a process outside any launched worker (snakemake, the launcher). Relative paths are
    resolved against ``cwd`` (the traced command's working directory)."""
    parent: dict[int, int] = {}
    own_rank: dict[int, int] = {}
    opens: list[tuple[int, str]] = []
    for line in log.read_text(errors="replace").splitlines():
        m = _CALL.match(line) or _RESUMED.match(line)
        if not m:
            continue
        pid, call, args, ret = int(m.group(1)), m.group(2), m.group(3), int(m.group(4))
        if call in _FORKS and ret > 0:
            parent[ret] = pid
        elif call == "execve" and (r := _RANK.search(args)):
            own_rank.setdefault(pid, int(r.group(1)))
        elif call == "openat" and (p := _PATH.match(args)):
            opens.append((pid, p.group(1)))

    def rank(pid: int) -> int | None:
        seen = set()
        while pid not in own_rank and pid in parent and pid not in seen:
            seen.add(pid)
            pid = parent[pid]
        return own_rank.get(pid)

    return Counter((rank(pid), str((cwd / path).resolve())) for pid, path in opens)
