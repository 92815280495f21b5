"""Folders that are trusted only as recorded: every file's SHA-256 in a record written last, built
in a private staging folder named after its writer's process, and put in place in one rename. The
compile cache (halide_gen.cache: one folder per entry) and `fuse -o OUT` (tflite_tools.outdir) are
both such folders; this module is what they share.

    staging = staging_folder(parent, "build")   # .tmp-<pid>-build-XXXX, beside its destination
    ...write files...
    write_record(staging, "MANIFEST")            # last: a folder with a valid record is complete
    os.replace(staging, destination)
    ...
    mismatch(destination, "MANIFEST")            # None, or why the folder cannot be trusted

A staging folder whose writer is no longer running is a leftover (`sweep_leftovers`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .atomic import file_digest, process_gone

TMP_PREFIX = ".tmp-"
# A temporary folder whose writer cannot be identified is a leftover once it is this old: no
# single build takes a day.
STALE_SECONDS = 24 * 3600


def files_below(folder: Path) -> list[str]:
    """Every file below `folder`, as relative POSIX paths (symlinks count as files, never followed)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        base = Path(dirpath)
        found += [(base / n).relative_to(folder).as_posix() for n in filenames]
        found += [(base / n).relative_to(folder).as_posix() for n in dirnames if (base / n).is_symlink()]
    return sorted(found)


def write_record(folder: Path, record: str, **fields) -> None:
    """Records the SHA-256 of every file below `folder` in `folder/record` ({"files": {path: hash}}
    and `fields`), as the folder's last write."""
    files = {name: file_digest(folder / name) for name in files_below(folder) if name != record}
    (folder / record).write_text(json.dumps({**fields, "files": files}, indent=0, sort_keys=True))


def recorded_files(folder: Path, record: str) -> dict[str, str] | None:
    """The files `folder/record` lists (relative path -> SHA-256), or None when it is missing,
    unreadable or malformed."""
    try:
        files = json.loads((Path(folder) / record).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        return None
    return files


def mismatch(folder: Path, record: str) -> str | None:
    """None when the files below `folder` are exactly those its record lists, each with its
    recorded hash; else why not (one line)."""
    recorded = recorded_files(folder, record)
    if recorded is None:
        return "no readable record"
    try:
        present = set(files_below(folder)) - {record}
    except OSError as exc:
        return f"cannot be listed ({exc.strerror})"
    if set(recorded) != present:
        return "its files are not the ones its record lists"
    for name, expected in recorded.items():
        try:
            if not (folder / name).is_file() or file_digest(folder / name) != expected:
                return f"{name} does not match its recorded hash"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror})"
    return None


def staging_folder(parent: Path, what: str) -> Path:
    """A fresh private folder in `parent`, named after this process (`.tmp-<pid>-<what>-*`) so that
    a later run can tell whether it is a leftover."""
    return Path(tempfile.mkdtemp(dir=parent, prefix=f"{TMP_PREFIX}{os.getpid()}-{what}-"))


def writer_gone(path: Path) -> bool:
    """True when the process that named a temporary file or folder is no longer running, or when
    it is STALE_SECONDS old and its writer cannot be told."""
    pid = path.name[len(TMP_PREFIX):].split("-", 1)[0]
    if pid.isdigit():
        return process_gone(int(pid))
    try:
        return time.time() - path.lstat().st_mtime > STALE_SECONDS
    except OSError:
        return False


def sweep_leftovers(parent: Path, pattern: str = f"{TMP_PREFIX}*") -> None:
    """Removes the temporary files and folders matching `pattern` in `parent` that killed runs left."""
    try:
        leftovers = [p for p in Path(parent).glob(pattern) if p.name.startswith(TMP_PREFIX)]
    except OSError:
        return
    for path in leftovers:
        if writer_gone(path):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
