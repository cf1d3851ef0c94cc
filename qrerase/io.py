"""Atomic artifact I/O: every file is written to a temporary sibling and renamed into place.

A crashed or interrupted job therefore never leaves a half-written artifact that a later rule (or a
user) could mistake for a complete one. Weights are read and written with safetensors only.

Errors name the file: a write that fails for lack of room (disk full, quota, file size limit,
read-only file system) raises an OSError naming the artifact, a corrupt or truncated safetensors file
a ValueError naming it (:func:`load_arrays`, :func:`open_safetensors`).

Modes: ``mkstemp`` / ``mkdtemp`` create their temporaries private (0600 / 0700); before the rename
the temporary gets the mode a plain ``open`` / ``mkdir`` would have given under the process umask
(``0666 & ~umask`` / ``0777 & ~umask``), so a project group shares results as with any other file.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "load_yaml",
    "hash_file",
    "atomic_path",
    "atomic_dir",
    "write_json",
    "write_text",
    "write_csv",
    "save_arrays",
    "load_arrays",
    "open_safetensors",
    "read_jsonl",
    "read_jsonl_numbered",
    "read_text",
    "decode_utf8",
    "write_jsonl",
    "current_umask",
]


def current_umask() -> int:
    """The process umask (read by setting and restoring it: POSIX has no read-only call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: errno values of a write that found no room: named as "could not write <artifact>".
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def _write_error(path: Path, exc: BaseException) -> OSError:
    """An OSError naming ``path`` (the artifact, not its temporary), keeping the errno."""
    reason = getattr(exc, "strerror", None) or str(exc)
    err = OSError(f"{path}: could not write ({reason})")
    found = re.search(r"\(os error (\d+)\)", reason)
    err.errno = getattr(exc, "errno", None) or (int(found.group(1)) if found else None)
    return err


def _no_room(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that found no room: an OSError, or safetensors' error wrapping one
    (``... I/O error: No space left on device (os error 28)``)."""
    if isinstance(exc, OSError):
        return exc.errno in _NO_ROOM
    found = re.search(r"\(os error (\d+)\)", str(exc)) if type(exc).__name__ == "SafetensorError" else None
    return found is not None and int(found.group(1)) in _NO_ROOM


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """A writer's block: an error for lack of room (disk full, quota, size limit) names ``path``."""
    try:
        yield
    except Exception as exc:
        if _no_room(exc):
            raise _write_error(path, exc) from exc
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block succeeds.

    A block that fails for lack of room (disk full, quota, size limit) raises an OSError naming ``path``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_error(path, exc) from exc
    os.close(fd)
    tmp = Path(tmp)
    try:
        with _naming(path):
            yield tmp
        try:
            if tmp.is_file():  # a writer may have replaced the file: set the mode just before the rename
                os.chmod(tmp, 0o666 & ~current_umask())
            os.replace(tmp, path)
        except OSError as exc:
            raise _write_error(path, exc) from exc
    finally:
        if tmp.exists():
            tmp.unlink()


def _plain_modes(root: Path, umask: int) -> None:
    """Give ``root`` and everything under it the mode a plain ``mkdir`` / ``open`` would have given.

    Libraries writing into the temporary folder may use private temporaries of their own
    (transformers writes ``model.safetensors`` 0600); executable files keep their x bits.
    """
    os.chmod(root, 0o777 & ~umask)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                continue
            full = 0o777 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111 else 0o666
            os.chmod(p, full & ~umask)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; move it onto ``path`` only if the block succeeds.

    An existing ``path`` is replaced as a whole (never merged), so stale files cannot survive. Its
    folders and files get the modes of a plain ``mkdir`` / ``open`` under the umask. A block that fails
    for lack of room (disk full, quota, size limit) raises an OSError naming ``path``.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as exc:
        raise _write_error(path, exc) from exc
    try:
        with _naming(path):
            yield tmp
        try:
            _plain_modes(tmp, current_umask())
            if path.exists():
                old = path.with_name(f".{path.name}.old")
                if old.exists():
                    shutil.rmtree(old)
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old)
            else:
                os.replace(tmp, path)
        except OSError as exc:
            raise _write_error(path, exc) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """Deterministic JSON (sorted keys) written atomically."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=True, ensure_ascii=False) + "\n")


def write_csv(path: str | os.PathLike, frame) -> None:
    """Write a pandas DataFrame as CSV atomically, without the index, with a fixed float format."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.10g", lineterminator="\n")


def save_arrays(
    path: str | os.PathLike, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Save named numpy arrays as one safetensors file, atomically (keys sorted for determinism)."""
    from safetensors.numpy import save_file

    tensors = {k: np.ascontiguousarray(arrays[k]) for k in sorted(arrays)}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=dict(metadata) if metadata else None)
        _sort_safetensors_metadata(tmp)


def _sort_safetensors_metadata(path: Path) -> None:
    """Rewrite a safetensors header with its ``__metadata__`` keys sorted, in place.

    safetensors serialises metadata from a hash map, so its key order (and the file's bytes) vary
    between processes; sorting them makes equal content give byte-identical files. The header keeps
    its length (same keys and values), so tensor offsets are unchanged.
    """
    import struct

    with open(path, "r+b") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n).decode("utf-8"))
        meta = header.get("__metadata__")
        if not meta:
            return
        header["__metadata__"] = {k: meta[k] for k in sorted(meta)}
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) > n:  # pragma: no cover - same keys and values cannot grow
            raise ValueError(f"{path}: rewritten safetensors header is longer than the original")
        fh.seek(8)
        fh.write(text + b" " * (n - len(text)))


def load_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Load a safetensors file into numpy arrays; a clear error when it is missing or unreadable."""
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such safetensors file")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises several exception types
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc


@contextlib.contextmanager
def open_safetensors(path: str | os.PathLike, framework: str = "numpy") -> Iterator[Any]:
    """``safetensors.safe_open`` whose errors name the file: FileNotFoundError when it is missing, a
    ValueError when it is corrupt or truncated (while opening or while reading a tensor)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such safetensors file")
    try:
        fh = safe_open(str(path), framework=framework)
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
    try:
        with fh:
            yield fh
    except SafetensorError as exc:
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc


def decode_utf8(raw: bytes, path: str | os.PathLike) -> str:
    """``raw`` decoded as UTF-8; a ValueError naming the file, line and column of the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ValueError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {column}: {exc.reason})"
        ) from None


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file's content; FileNotFoundError, or a ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    return decode_utf8(path.read_bytes(), path)


def read_jsonl_numbered(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """``(line number, record)`` of every non-blank line of a JSON Lines file.

    Every decoding or shape error is a ValueError naming the file and line: bytes that are not UTF-8,
    a line that is not JSON, a JSON value that is not an object (an array row, a bare string).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: data file not found")
    rows = []
    for i, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{path}:{i}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}: {exc.reason})"
            ) from None
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i}: expected a JSON object per line, got {type(row).__name__} {line[:40]!r}")
        rows.append((i, row))
    return rows


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSON Lines file of objects; a clear error naming the file and line on bad input
    (:func:`read_jsonl_numbered`)."""
    return [row for _, row in read_jsonl_numbered(path)]


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    """Write records as JSON Lines (one per line, UTF-8, stable key order), atomically."""
    write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def hash_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def load_yaml(path: str | os.PathLike) -> Any:
    """A YAML file as ``yaml.safe_load`` reads it (libyaml's parser where PyYAML has it), except that a
    key repeated in one mapping is a one-line ``ValueError`` naming ``file:line`` and the key: PyYAML
    keeps the last one silently, so a second ``unlearn:`` section in an overlay would drop the first's
    keys. A file that does not parse is a ``ValueError`` naming it and the parser's first line."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    where = str(path)

    class _Loader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ValueError(f"{where}:{line}: duplicate key {key!r} (first at line {seen[key]})")
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    text = Path(path).read_text(encoding="utf-8")
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{where}: not valid YAML ({first})") from None
