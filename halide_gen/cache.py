"""The compile cache: folders of build products that are verified before they are used.

Every compiled artifact (a kernel's static library and its description, the Halide runtime, the
delegate runtime's objects) lives in one entry folder under the cache root:

    <root>/<name>/            the files the builder wrote
    <root>/<name>/MANIFEST    SHA-256 of every other file, written last

An entry is built in a private `.tmp-<pid>-*` folder and renamed into place in one step, so a
reader sees a complete entry or none. A reader trusts an entry only if its manifest lists exactly
the files present and every hash matches: a truncated, overwritten or half-deleted entry (a full
disk, a killed copy, a hand edit) is set aside with a warning and rebuilt, never linked into a
delegate. Temporary folders that a killed process left behind are removed on a later visit. The
recording, staging and sweeping are tflite_tools.model.verified's, which `fuse -o` shares.
"""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable

from tflite_tools.model.verified import (TMP_PREFIX, mismatch, staging_folder, sweep_leftovers, write_record)

MANIFEST = "MANIFEST"
_swept: set[Path] = set()  # cache folders tidied by this process (once is enough)


class CacheWarning(UserWarning):
    """A cache entry was damaged (and is rebuilt) or the cache could not be tidied."""


class CacheEntryError(Exception):
    """Why an entry cannot be trusted (one line)."""


def verify_entry(entry: Path) -> None:
    """Raises CacheEntryError unless every file in `entry` is exactly what its manifest says."""
    why = mismatch(entry, MANIFEST)
    if why is not None:
        raise CacheEntryError(why)


def discard_entry(entry: Path, why: str) -> None:
    """Sets a damaged entry aside (one rename, so no reader sees it half-deleted) and removes it."""
    warnings.warn(f"cache entry {entry} is damaged ({why}); rebuilding it", CacheWarning, stacklevel=3)
    aside = entry.with_name(f"{TMP_PREFIX}{os.getpid()}-discarded-{entry.name}")
    try:
        os.replace(entry, aside)
    except OSError:
        aside = entry
    shutil.rmtree(aside, ignore_errors=True)


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
        tmp = staging_folder(entry.parent, "build")
    except OSError as exc:
        raise CacheLocationError(entry.parent, exc) from None
    try:
        build(tmp)
        write_record(tmp, MANIFEST)
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
