"""`fuse -o OUT`: a folder that switches from the old results to the new ones in one step.

    staging = OutputFolder.prepare("out/")   # checked before anything is compiled
    ...write files into staging.path...
    staging.commit()                          # OUT now holds exactly the new set

Everything is written into a private staging folder beside OUT; `commit` records what was
written (`.dnnfusion-out.json`: every file's SHA-256) and exchanges the staging folder with OUT in
one rename (Linux renameat2 RENAME_EXCHANGE), so a reader, or a crash at any instant, sees the
whole old set or the whole new one, never a new plan.json beside an old library. A failed run
leaves OUT as it was (or absent, if it was).

OUT is ours to replace only if everything in it was written by an earlier `fuse`: a folder with
anything else in it (a user's file in OUT/asm or OUT/android, or a folder that was never a fuse
output) is refused with the file named, before any work is done and again just before the
switch. Nothing that `fuse` did not write is ever deleted. The record, the staging folder and the
sweep of a killed run's leftovers are tflite_tools.model.verified's, which the compile cache shares.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
from pathlib import Path

from .model.atomic import file_digest
from .model.errors import ModelError
from .model.verified import files_below, recorded_files, staging_folder, sweep_leftovers, write_record

OWNER_FILE = ".dnnfusion-out.json"


def written_files(folder: Path) -> dict[str, str] | None:
    """What an earlier `fuse` recorded writing into `folder` (relative path -> SHA-256), or None
    when the folder has no readable record."""
    return recorded_files(folder, OWNER_FILE)


def foreign_files(folder: Path) -> list[str]:
    """The files in an existing `folder` that `fuse` did not write there (all of them when the
    folder has no record)."""
    ours = written_files(folder) or {}
    return [f for f in files_below(folder) if f != OWNER_FILE and f not in ours]


def check_unchanged(*paths: str | os.PathLike) -> None:
    """Raises ModelError for a file that an earlier `fuse` recorded writing (its folder's
    OWNER_FILE lists it) and that has changed since: a damaged delegate library would otherwise be
    loaded and run, and garbage in its code or tables can crash the host. Files outside a fuse
    output, or in one whose record is unreadable, are not judged."""
    for path in map(Path, paths):
        recorded = (written_files(path.parent) or {}).get(path.name)
        if recorded is None:
            continue
        try:
            same = file_digest(path) == recorded
        except OSError:
            same = False
        if not same:
            raise ModelError(f"{path}: changed since fuse wrote it (it no longer matches {path.parent / OWNER_FILE}); "
                             "run fuse again")


def _refuse_foreign(out: Path) -> None:
    foreign = foreign_files(out)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ModelError(f"-o {out}: the folder holds files fuse did not write ({shown}); fuse replaces the whole "
                         "folder, so give it a new or empty one")


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swaps two paths atomically (renameat2 RENAME_EXCHANGE); False where the C library or the
    filesystem cannot."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


class OutputFolder:
    """A staging folder for OUT's next contents; see the module docstring."""

    def __init__(self, out: Path, path: Path):
        self.out = out
        self.path = path

    @classmethod
    def prepare(cls, out_dir: str | os.PathLike) -> "OutputFolder":
        """Checks that OUT can be written and replaced (ModelError, one line, if not) and creates
        the staging folder beside it."""
        out = Path(out_dir)
        if out.is_symlink() and out.is_dir():
            out = out.resolve()  # write where the link points; the link stays
        elif out.is_symlink():
            raise ModelError(f"-o {out_dir}: a symbolic link to no folder (dangling, or a loop)")
        out = Path(os.path.abspath(out))
        if out.exists() and not out.is_dir():
            raise ModelError(f"-o {out_dir}: a file is in the way (OUT must be a folder)")
        if os.path.ismount(out):
            # A Docker volume or a tmpfs: the rename that swaps OUT's contents in one step cannot
            # move a mount point (EBUSY), and would fail only after every kernel compiled.
            raise ModelError(f"-o {out_dir}: a mount point, which fuse cannot replace in one step; "
                             f"name a folder inside it (-o {Path(out_dir) / 'out'})")
        parent = out.parent
        for ancestor in [parent, *parent.parents]:
            if ancestor.exists():
                if not ancestor.is_dir():
                    raise ModelError(f"-o {out_dir}: {ancestor} is a file, not a folder")
                break
        if out.exists():
            _refuse_foreign(out)
        try:
            parent.mkdir(parents=True, exist_ok=True)
            sweep_leftovers(parent, f".tmp-*-fuse-{out.name}-*")
            path = staging_folder(parent, f"fuse-{out.name}")
        except OSError as exc:
            raise ModelError(f"-o {out_dir}: cannot write there ({exc.strerror or exc})") from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(path, 0o777 & ~umask)  # what mkdir would have given OUT, not mkdtemp's 0700
        return cls(out, path)

    def commit(self) -> None:
        """Records the staged files and makes them OUT's contents in one step."""
        write_record(self.path, OWNER_FILE, written_by="tflite_tools fuse")
        if not self.out.exists():
            os.rename(self.path, self.out)
            return
        _refuse_foreign(self.out)  # a file the user added while the kernels compiled
        if _rename_exchange(self.path, self.out):
            shutil.rmtree(self.path, ignore_errors=True)  # now OUT's previous contents, all ours
            return
        # No atomic exchange here (an old kernel, some network filesystems): two renames, with a
        # moment in between in which OUT is absent, never mixed.
        old = staging_folder(self.out.parent, "fuse-old")
        os.replace(self.out, old)
        os.rename(self.path, self.out)
        shutil.rmtree(old, ignore_errors=True)

    def discard(self) -> None:
        """Removes the staging folder (after a failure)."""
        shutil.rmtree(self.path, ignore_errors=True)
