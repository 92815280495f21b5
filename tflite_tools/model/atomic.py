"""Atomic file writes (a reader sees the old file or the complete new one, never a partial one),
and the two checks that make leftovers safe to judge: a file's hash, and whether the process
that named a temporary file is still running."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Opens a temporary file beside `path`; on clean exit renames it over `path`.

    If the block raises, the temporary file is removed and `path` is left as it was. The file
    gets the permissions a plain `open(path, "wb")` would have given it (0666 less the umask).
    """
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Writes `data` to `path` atomically."""
    with atomic_writer(path) as handle:
        handle.write(data)


def load_json_table(path: str | os.PathLike) -> dict:
    """The JSON object in `path`, or {} when it is missing, unreadable or not an object: an on-disk
    cache that cannot be read is rebuilt, never fatal."""
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def save_json_table(path: str | os.PathLike, table: dict) -> bool:
    """Writes a cache table atomically (creating its folder); False when the location is read-only."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, json.dumps(table, indent=0, sort_keys=True).encode())
    except OSError:
        return False
    return True


def file_digest(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes, read in blocks (kernel libraries run to megabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def process_gone(pid: int) -> bool:
    """True when no process `pid` runs here any more (a temporary file it named is a leftover);
    False for this process and for live processes of other users."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
