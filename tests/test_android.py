"""The Android package: `fuse --target arm64-android` writes a self-contained CMake project. No NDK
here, so the same project is built with Debian's aarch64 cross compiler — directly, and through
fuse's $ANDROID_NDK path with a stand-in toolchain file — so it never rots."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import MODELS
from halide_gen.bundle import build_cmake_project
from tflite_tools.fuse import fuse

CROSS = "aarch64-linux-gnu-g++"
CROSS_TOOLCHAIN = f"""set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER {CROSS})
"""


@pytest.fixture
def cross():
    if shutil.which(CROSS) is None or shutil.which("cmake") is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CROSS} and cmake are required in CI (scripts/install-system-deps.sh)")
        pytest.skip(f"needs {CROSS} and cmake")


def exported(library) -> set[str]:
    nm = shutil.which("aarch64-linux-gnu-nm") or "nm"
    out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def elf_machine(library) -> int:
    return int.from_bytes(library.read_bytes()[18:20], "little")  # e_machine: 183 = AArch64


def test_android_project_builds_with_the_cross_compiler(cross, tmp_path, monkeypatch):
    monkeypatch.delenv("ANDROID_NDK", raising=False)
    result = fuse(MODELS / "depthwise_residual.tflite", tmp_path / "out", target="arm64-android",
                  cache_dir=tmp_path / "k")
    project = result.android_project
    assert result.library is None and project == tmp_path / "out" / "android" / "arm64-v8a"
    assert {p.name for p in project.iterdir()} >= {"CMakeLists.txt", "bundle.cc", "kernels", "halide_runtime.o",
                                                  "include", "runtime"}
    assert (project / "runtime" / "android" / "DnnFusionDelegate.java").exists()
    assert json.loads(result.plan_json.read_text())["android_project"] == "android/arm64-v8a"
    toolchain = tmp_path / "aarch64.cmake"
    toolchain.write_text(CROSS_TOOLCHAIN)
    build_cmake_project(project, tmp_path / "build", [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"])
    library = tmp_path / "build" / "libdepthwise_residual_dnnfusion.so"
    assert elf_machine(library) == 183
    assert exported(library) == {"tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"}


def test_fuse_builds_with_android_ndk_when_set(cross, tmp_path, monkeypatch):
    # A stand-in NDK whose toolchain file points CMake at the Linux cross compiler: the path fuse
    # takes with a real $ANDROID_NDK, end to end.
    ndk = tmp_path / "ndk"
    (ndk / "build" / "cmake").mkdir(parents=True)
    (ndk / "build" / "cmake" / "android.toolchain.cmake").write_text(CROSS_TOOLCHAIN)
    monkeypatch.setenv("ANDROID_NDK", str(ndk))
    result = fuse(MODELS / "fc_softmax.tflite", tmp_path / "out", target="arm64-android", cache_dir=tmp_path / "k")
    assert result.library == result.android_project / "libfc_softmax_dnnfusion.so"
    assert elf_machine(result.library) == 183
    assert not (tmp_path / "out" / ".build").exists()


def test_android_ndk_without_toolchain_is_a_clear_error(tmp_path, monkeypatch):
    from tflite_tools import cli

    monkeypatch.setenv("ANDROID_NDK", str(tmp_path / "nowhere"))
    assert cli.main(["fuse", str(MODELS / "add_relu.tflite"), "-o", str(tmp_path / "out"),
                     "--target", "arm64-android"]) == 2
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
