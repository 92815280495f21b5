"""The delegate runtime in C++, under a fake TFLite host (delegate/tests/fake_host_test.cc):
profiler events per block, the partition arena, idempotent prepare, failing kernels, options with
a NULL reporter, claims against a changed graph, and the memory planner."""

from __future__ import annotations

import subprocess

from halide_gen.aot import compile_runtime
from halide_gen.bundle import DELEGATE_DIR, HALIDE_INCLUDE, compiler_for, runtime_sources


def test_fake_host(tmp_path):
    exe = tmp_path / "fake_host"
    cmd = [compiler_for("host"), "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{DELEGATE_DIR / 'include'}",
           f"-I{DELEGATE_DIR / 'src'}", f"-I{HALIDE_INCLUDE}", str(DELEGATE_DIR / "tests" / "fake_host_test.cc"),
           *map(str, runtime_sources()), str(compile_runtime("host", tmp_path)), "-lpthread", "-ldl", "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "all checks passed" in proc.stdout
    # Without a reporter, a bad option still says why (on stderr) instead of failing silently.
    assert "unknown option 'colour'" in proc.stderr


def test_library_exports_only_the_plugin_entry_points(tmp_path):
    from tflite_tools.fuse import fuse
    from conftest import MODELS

    result = fuse(MODELS / "add_relu.tflite", tmp_path / "out", cache_dir=tmp_path / "kernels")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(result.library)], capture_output=True, text=True)
    names = {line.split()[-1] for line in symbols.stdout.splitlines() if line.strip()}
    assert names == {"tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"}
