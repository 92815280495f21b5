"""An aarch64 Python with LiteRT, run under qemu-aarch64: the closest thing to an ARM64 phone or
board that this x86 machine has.

    root = prepare(cache_dir)            # minutes the first time, then cached
    proc = run_python(root, "script.py", "arg")

The folder is a rootfs made of Debian's arm64 packages (fetched by apt with its own state
directory, so the host's dpkg stays untouched, and unpacked with `dpkg-deb -x`) plus the aarch64
wheels of ai-edge-litert and its imports (pip download for a manylinux aarch64 platform), unzipped
into its dist-packages. `qemu-aarch64 -L ROOT ROOT/usr/bin/python3.11` runs it; qemu looks for
every absolute path under ROOT first, so the fake `proc/cpuinfo` written there keeps XNNPACK's CPU
detection from reading the host's x86 one (which crashes it). It names the core the features come
from: XNNPACK picks its micro-kernels by the core's part number (cortex-a53: its in-order ones), so a
run on qemu's `-cpu C` goes through `core_view(root, C)`, the same folder with C's cpuinfo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PYTHON = "python3.11"
DEBS = ["python3.11-minimal", "libpython3.11-stdlib", "libstdc++6"]
WHEELS = ["ai-edge-litert", "numpy"]
PLATFORMS = ["manylinux_2_27_aarch64", "manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"]
VERSION = "1"  # bump to rebuild cached folders when the recipe changes


def _cpuinfo(features: str, variant: int, part: int, revision: int) -> str:
    return (f"processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
            f"CPU architecture: 8\nCPU variant\t: {variant:#x}\nCPU part\t: {part:#05x}\n"
            f"CPU revision\t: {revision}\n\n")


_ARMV82 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
# What Linux shows on each core qemu emulates here (the part numbers are Arm's MIDR values); qemu's
# default core, "max", has every feature: it is shown as a Neoverse N1, an ARMv8.2 big core.
CPUINFO = _cpuinfo(_ARMV82, 3, 0xD0C, 1)
CORE_CPUINFO = {"cortex-a76": _cpuinfo(_ARMV82, 4, 0xD0B, 0),
                "cortex-a53": _cpuinfo("fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid", 0, 0xD03, 4)}


class Unavailable(RuntimeError):
    """A piece of the emulated stack cannot be had here (no qemu, no network to the registries)."""


def _run(cmd: list[str], what: str, **kwargs) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise Unavailable(f"{what} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-1500:]}")


def _fetch_debs(work: Path) -> list[Path]:
    """The arm64 .debs of DEBS and their dependencies, resolved against an empty dpkg status."""
    state, cache = work / "apt-state", work / "apt-cache"
    (state / "lists" / "partial").mkdir(parents=True)
    (cache / "archives" / "partial").mkdir(parents=True)
    status = work / "status"
    status.write_text("")
    options = ["-o", f"Dir::State={state}", "-o", f"Dir::State::status={status}", "-o", f"Dir::Cache={cache}",
               "-o", "APT::Architectures::=arm64", "-o", "APT::Architecture=arm64", "-o", "Debug::NoLocking=1",
               "-o", "APT::Get::AllowUnauthenticated=false", "-qq"]
    _run(["apt-get", *options, "update"], "apt-get update (arm64 lists)")
    _run(["apt-get", *options, "install", "--download-only", "--no-install-recommends", "-y", *DEBS],
         "apt-get download of the arm64 packages")
    return sorted((cache / "archives").glob("*.deb"))


def _fetch_wheels(work: Path) -> list[Path]:
    wheels = work / "wheels"
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *platforms, "--python-version",
          "3.11", "--implementation", "cp", "--abi", "cp311", "-d", str(wheels), *WHEELS], "pip download (aarch64)")
    return sorted(wheels.glob("*.whl"))


def prepare(cache_dir: Path) -> Path:
    """The prepared rootfs in `cache_dir` (built once; an interrupted build leaves nothing)."""
    if shutil.which("qemu-aarch64") is None:
        raise Unavailable("qemu-aarch64 not found (apt-get install qemu-user)")
    root = Path(cache_dir) / f"arm64-python-{VERSION}"
    if (root / "ready").exists():
        return root
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".tmp-arm64-"))
    try:
        rootfs = work / "rootfs"
        rootfs.mkdir()
        for deb in _fetch_debs(work):
            _run(["dpkg-deb", "-x", str(deb), str(rootfs)], f"unpacking {deb.name}")
        site = rootfs / "usr" / "lib" / "python3" / "dist-packages"
        site.mkdir(parents=True, exist_ok=True)
        for wheel in _fetch_wheels(work):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(site)
        (rootfs / "proc").mkdir(exist_ok=True)
        (rootfs / "proc" / "cpuinfo").write_text(CPUINFO)
        (rootfs / "ready").write_text("ok\n")
        try:
            os.replace(rootfs, root)
        except OSError:  # prepared meanwhile by another process
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return root


def core_view(root: Path, cpu: str) -> Path:
    """`root` as seen on qemu's core `cpu` (one of CORE_CPUINFO): a folder beside it of links to its
    top-level folders and a `proc/cpuinfo` naming that core."""
    view = root.with_name(f"{root.name}-{cpu}")
    if (view / "proc" / "cpuinfo").exists() and (view / "proc" / "cpuinfo").read_text() == CORE_CPUINFO[cpu]:
        return view
    work = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".tmp-{cpu}-"))
    for entry in root.iterdir():
        if entry.name != "proc":
            (work / entry.name).symlink_to(entry)
    (work / "proc").mkdir()
    (work / "proc" / "cpuinfo").write_text(CORE_CPUINFO[cpu])
    shutil.rmtree(view, ignore_errors=True)
    try:
        os.replace(work, view)
    except OSError:  # made meanwhile by another process
        shutil.rmtree(work, ignore_errors=True)
    return view


def run_python(root: Path, *args: str, timeout: float = 600, cpu: str | None = None) -> subprocess.CompletedProcess:
    """Runs the emulated aarch64 Python with `args`, on qemu's `cpu` model (its default, "max", when
    None: every feature qemu has, dot product included), with that core's cpuinfo."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    cpu_args = ["-cpu", cpu] if cpu else []
    root = core_view(root, cpu) if cpu in CORE_CPUINFO else root
    return subprocess.run(["qemu-aarch64", *cpu_args, "-L", str(root), str(root / "usr" / "bin" / PYTHON), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
