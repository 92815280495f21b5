"""The compile cache (halide_gen.cache) trusts only verified entries: a damaged one is rebuilt with a
warning, an interrupted build leaves nothing, and leftovers of killed runs are swept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings

import pytest

from halide_gen.cache import MANIFEST, CacheLocationError, CacheWarning, cached_entry, sweep_leftovers, verify_entry


def writer(calls: list):
    """A builder that writes two files and counts how often it ran."""

    def build(folder):
        calls.append(folder)
        (folder / "kernel.a").write_bytes(b"\x7fELF" + bytes(range(256)) * 8)
        (folder / "kernel.json").write_text('{"function": "f"}')

    return build


def test_second_lookup_is_a_verified_hit(tmp_path):
    calls = []
    entry, cached = cached_entry(tmp_path, "k1", writer(calls))
    assert not cached and (entry / MANIFEST).exists()
    again, cached = cached_entry(tmp_path, "k1", writer(calls))
    assert cached and again == entry and len(calls) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["k1"]  # no temporary left


DAMAGE = {
    "code bytes overwritten": lambda e: _patch(e / "kernel.a", 100, b"\xff\xff\xff\xff"),
    "truncated library": lambda e: (e / "kernel.a").write_bytes((e / "kernel.a").read_bytes()[:10]),
    "empty library": lambda e: (e / "kernel.a").write_bytes(b""),
    "garbage json": lambda e: (e / "kernel.json").write_text("{not json"),
    "wrong function name": lambda e: (e / "kernel.json").write_text('{"function": "g"}'),
    "file deleted": lambda e: (e / "kernel.a").unlink(),
    "file added": lambda e: (e / "stray.o").write_bytes(b"x"),
    "manifest deleted": lambda e: (e / MANIFEST).unlink(),
    "manifest garbage": lambda e: (e / MANIFEST).write_bytes(b"\x00\x01"),
    "manifest wrong shape": lambda e: (e / MANIFEST).write_text('{"files": []}'),
}


def _patch(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_entry_is_rebuilt_with_a_warning(tmp_path, damage):
    calls = []
    entry, _ = cached_entry(tmp_path, "k1", writer(calls))
    good = {p.name: p.read_bytes() for p in entry.iterdir()}
    DAMAGE[damage](entry)
    with pytest.warns(CacheWarning, match="damaged"):
        again, cached = cached_entry(tmp_path, "k1", writer(calls))
    assert not cached and len(calls) == 2
    verify_entry(again)
    assert {p.name: p.read_bytes() for p in again.iterdir()} == good
    assert [p.name for p in tmp_path.iterdir()] == ["k1"]


def test_failed_build_leaves_nothing(tmp_path):
    def build(folder):
        (folder / "half.a").write_bytes(b"half")
        raise RuntimeError("compiler died")

    with pytest.raises(RuntimeError):
        cached_entry(tmp_path, "k1", build)
    assert list(tmp_path.iterdir()) == []


def test_leftovers_of_dead_processes_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".tmp-{dead}-build-abc").mkdir()
    (tmp_path / f".tmp-{dead}-build-abc" / "x.a").write_bytes(b"x")
    (tmp_path / f".tmp-{os.getpid()}-build-mine").mkdir()  # this process: still being written
    old = tmp_path / ".tmp-unnamed-old"
    old.mkdir()
    os.utime(old, (time.time() - 3 * 86400,) * 2)
    (tmp_path / ".tmp-unnamed-new").mkdir()  # could be anyone's, and recent: kept
    (tmp_path / "runtime-host-x").mkdir()  # an entry, not a temporary
    sweep_leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".tmp-{os.getpid()}-build-mine", ".tmp-unnamed-new", "runtime-host-x"])


def test_unusable_cache_location_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(CacheLocationError, match="DNNFUSION_CACHE_DIR"):
        cached_entry(tmp_path / "file" / "kernels", "k1", writer([]))


def test_a_relative_cache_location_is_made_absolute(tmp_path, monkeypatch):
    # The archiver and linker that read cached kernels run in other folders: a relative path
    # from the environment would name nothing there.
    from fusion.cost import default_cache_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DNNFUSION_CACHE_DIR", "relative/cache")
    assert default_cache_dir() == tmp_path / "relative" / "cache"


def test_fuse_takes_a_relative_kernel_cache(tmp_path, private_cache, monkeypatch):
    # The same for fuse's own argument: a multitarget library's kernels are taken apart by an
    # archiver working in a folder of its own, where a relative cache_dir named no library.
    from conftest import MODELS
    from tflite_tools.fuse import fuse
    from tflite_tools.run import run

    monkeypatch.chdir(tmp_path)
    result = fuse(MODELS / "add_relu.tflite", tmp_path / "out", target="host",
                  cache_dir=private_cache.relative_to(tmp_path))
    assert result.kernels and all(k.kernel for k in result.kernels)
    assert run(result.model, result.library).ok


def test_untouched_entry_raises_no_warning(tmp_path):
    cached_entry(tmp_path, "k1", writer([]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cached_entry(tmp_path, "k1", writer([]))
