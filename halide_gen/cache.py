"""The compile cache: folders of build products that are verified before they are used.

Every compiled artifact (a kernel's static library and its description, the Halide runtime, the
delegate runtime's objects) lives in one entry folder under the cache root:

    <root>/<name>/            the files the builder wrote
    <root>/<name>/MANIFEST    SHA-256 of every other file, written last

An entry is built in a private `.tmp-<pid>-*` folder and renamed into place in one step, so a
reader sees a complete entry or none. A reader trusts an entry only if its manifest lists exactly
the files present and every hash matches: a truncated, overwritten or half-deleted entry (a full
disk, a killed copy, a hand edit) is set aside with a warning and rebuilt, never linked into a
delegate. Temporary folders that a killed process left behind are removed on a later visit.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

from tflite_tools.model.atomic import file_digest, process_gone

MANIFEST = "MANIFEST"
_TMP_PREFIX = ".tmp-"
# A temporary folder whose writer cannot be identified is a leftover once it is this old: no
# single build takes a day.
_STALE_SECONDS = 24 * 3600
_swept: set[Path] = set()  # cache folders tidied by this process (once is enough)


class CacheWarning(UserWarning):
    """A cache entry was damaged (and is rebuilt) or the cache could not be tidied."""


class CacheEntryError(Exception):
    """Why an entry cannot be trusted (one line)."""


def write_manifest(folder: Path) -> None:
    """Records the hash of every file in `folder` (flat), as the folder's last write."""
    files = {p.name: file_digest(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=0, sort_keys=True))


def verify_entry(entry: Path) -> None:
    """Raises CacheEntryError unless every file in `entry` is exactly what its manifest says."""
    try:
        recorded = json.loads((entry / MANIFEST).read_text())["files"]
        present = {p.name for p in entry.iterdir() if p.name != MANIFEST}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CacheEntryError(f"no readable manifest ({type(exc).__name__})") from None
    if not isinstance(recorded, dict) or set(recorded) != present:
        raise CacheEntryError("its files are not the ones its manifest lists")
    for name, expected in recorded.items():
        try:
            if not (entry / name).is_file() or file_digest(entry / name) != expected:
                raise CacheEntryError(f"{name} does not match its recorded hash")
        except OSError as exc:
            raise CacheEntryError(f"{name} cannot be read ({exc.strerror})") from None


def discard_entry(entry: Path, why: str) -> None:
    """Sets a damaged entry aside (one rename, so no reader sees it half-deleted) and removes it."""
    warnings.warn(f"cache entry {entry} is damaged ({why}); rebuilding it", CacheWarning, stacklevel=3)
    aside = entry.with_name(f"{_TMP_PREFIX}{os.getpid()}-discarded-{entry.name}")
    try:
        os.replace(entry, aside)
    except OSError:
        aside = entry
    shutil.rmtree(aside, ignore_errors=True)


def _writer_gone(path: Path) -> bool:
    """True when the process that named a temporary file or folder is no longer running, or when
    it is a day old and its writer cannot be told (an older naming)."""
    pid = path.name[len(_TMP_PREFIX):].split("-", 1)[0]
    if pid.isdigit():
        return process_gone(int(pid))
    try:
        return time.time() - path.lstat().st_mtime > _STALE_SECONDS
    except OSError:
        return False


def sweep_leftovers(root: Path) -> None:
    """Removes the temporary files and folders that killed runs left in `root`."""
    try:
        leftovers = [p for p in root.iterdir() if p.name.startswith(_TMP_PREFIX)]
    except OSError:
        return
    for path in leftovers:
        if _writer_gone(path):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def temporary_folder(root: Path, what: str) -> Path:
    """A fresh private folder in `root`, named after this process so that a later run can tell
    whether it is a leftover."""
    return Path(tempfile.mkdtemp(dir=root, prefix=f"{_TMP_PREFIX}{os.getpid()}-{what}-"))


def cached_entry(root: Path, name: str, build: Callable[[Path], None]) -> tuple[Path, bool]:
    """The verified entry `root/name`, built by `build(folder)` when missing or damaged.

    Returns (entry, True when it came from the cache). `build` writes its files into the folder
    it is given; the manifest and the rename into place follow. An exception from `build` leaves
    the cache as it was.
    """
    entry = Path(root) / name
    if entry.parent not in _swept:
        _swept.add(entry.parent)
        sweep_leftovers(entry.parent)
    if entry.exists():
        try:
            verify_entry(entry)
            return entry, True
        except CacheEntryError as exc:
            discard_entry(entry, str(exc))
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheLocationError(entry.parent, exc) from None
    _check_free_space(entry.parent)
    try:
        tmp = temporary_folder(entry.parent, "build")
    except OSError as exc:
        raise CacheLocationError(entry.parent, exc) from None
    try:
        build(tmp)
        write_manifest(tmp)
        try:
            os.replace(tmp, entry)
        except OSError:
            # Another process built the same entry first: theirs is as good as ours once verified.
            shutil.rmtree(tmp, ignore_errors=True)
            verify_entry(entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return entry, False


# Free space an entry is built in only above: LLVM, writing a kernel's object file onto a full disk,
# ends the whole process (exit 1, "IO failure on output stream") where no error can be caught. The
# largest entries (a multitarget host kernel of a big block, the delegate's runtime objects) stay
# under a few MiB.
MIN_FREE_BYTES = 64 << 20


def _check_free_space(folder: Path) -> None:
    free = shutil.disk_usage(folder).free
    if free < MIN_FREE_BYTES:
        raise CacheLocationError(folder, OSError(errno.ENOSPC, f"{free >> 20} MiB free, under the "
                                                 f"{MIN_FREE_BYTES >> 20} MiB a compile may need"))


class CacheLocationError(OSError):
    """The cache folder cannot be created or written (a file in the way, no permission, a full disk)."""

    def __init__(self, folder: Path, cause: OSError):
        super().__init__(cause.errno, f"the compile cache {folder} is not usable: {cause.strerror or cause}"
                         " (set DNNFUSION_CACHE_DIR to a writable folder)")
        self.folder = folder
