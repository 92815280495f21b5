"""The delegate runtime in C++, under a fake TFLite host (delegate/tests/fake_host_test.cc):
profiler events per block, the partition arena, idempotent prepare, failing kernels, options with
a NULL reporter, claims against a changed graph, and the memory planner; and the thread pool behind
the kernels' parallel loops and the heap they allocate from (delegate/tests/thread_pool_test.cc,
kernel_heap_test.cc)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

from halide_gen.aot import compile_runtime
from halide_gen.bundle import DELEGATE_DIR, HALIDE_INCLUDE, runtime_sources
from halide_gen.toolchain import compiler_for


def _build_host_program(sources, exe: Path, tmp_path: Path, flags=("-Wall", "-Werror")) -> subprocess.CompletedProcess:
    """Compiles a test program against the delegate's sources and the host Halide runtime."""
    cmd = [compiler_for("host"), "-std=c++17", "-O1", *flags, f"-I{DELEGATE_DIR / 'include'}", f"-I{DELEGATE_DIR / 'src'}",
           f"-I{HALIDE_INCLUDE}", *map(str, sources), str(compile_runtime("host", tmp_path)), "-lpthread", "-ldl",
           "-o", str(exe)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_fake_host(tmp_path):
    exe = tmp_path / "fake_host"
    build = _build_host_program([DELEGATE_DIR / "tests" / "fake_host_test.cc", *runtime_sources()], exe, tmp_path)
    assert build.returncode == 0, build.stderr[-3000:]
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "all checks passed" in proc.stdout
    # Without a reporter, a bad option still says why (on stderr) instead of failing silently.
    assert "unknown option 'colour'" in proc.stderr


@pytest.mark.parametrize("test, sources", [
    ("thread_pool_test.cc", ("thread_pool.cc", "denormals.cc", "log.cc")),
    ("kernel_heap_test.cc", ("kernel_heap.cc", "halide_hooks.cc", "log.cc")),
])
def test_runtime_parts_under_thread_sanitizer(tmp_path, test, sources):
    """delegate/tests/thread_pool_test.cc: the pool behind the kernels' parallel loops;
    kernel_heap_test.cc: the heap their allocations come from. Under ThreadSanitizer where the
    toolchain has it (it reports any data race it sees as a failure)."""
    paths = [DELEGATE_DIR / "tests" / test] + [DELEGATE_DIR / "src" / name for name in sources]
    for sanitizer in (["-fsanitize=thread"], []):
        exe = tmp_path / f"{Path(test).stem}{len(sanitizer)}"
        if _build_host_program(paths, exe, tmp_path, flags=(*sanitizer, "-Wall", "-Werror")).returncode == 0:
            break
    else:
        pytest.fail(f"{test} did not build")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "all checks passed" in proc.stdout


def test_library_exports_only_the_plugin_entry_points(tmp_path, private_cache):
    from tflite_tools.fuse import fuse
    from conftest import MODELS

    result = fuse(MODELS / "add_relu.tflite", tmp_path / "out", cache_dir=private_cache)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(result.library)], capture_output=True, text=True)
    names = {line.split()[-1] for line in symbols.stdout.splitlines() if line.strip()}
    assert names == {"tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate"}


PACK_WRAPPER = """
#include "pack.h"
extern "C" void floats_to_halves(const float* src, size_t count, uint16_t* dst) {
  dnnfusion::FloatsToHalves(src, count, dst);
}
extern "C" int pack_constant(int pack, const void* src, const int32_t* src_dims, int src_rank, void* dst,
                             const int32_t* dst_dims, int dst_rank, size_t element_bytes) {
  return dnnfusion::PackConstant(static_cast<dnnfusion::Pack>(pack), src, src_dims, src_rank, dst, dst_dims,
                                 dst_rank, element_bytes) ? 1 : 0;
}
"""


def test_runtime_packs_constants_exactly_as_python(tmp_path):
    # delegate/src/pack.cc repacks the weights TFLite holds at Prepare; halide_gen/pack.py packed them
    # for every test that ran a kernel from Python. The two must agree byte for byte, on any shape.
    import ctypes

    import numpy as np

    from halide_gen.bundle_abi import PACK
    from halide_gen.pack import PACKERS, WEIGHT_BLOCKS, block_sums_packer, pack

    (tmp_path / "wrapper.cc").write_text(PACK_WRAPPER)
    lib = tmp_path / "libpack.so"
    build = subprocess.run([compiler_for("host"), "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{DELEGATE_DIR / 'include'}",
                            f"-I{DELEGATE_DIR / 'src'}", str(tmp_path / "wrapper.cc"), str(DELEGATE_DIR / "src" / "pack.cc"),
                            "-o", str(lib)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    native = ctypes.CDLL(str(lib)).pack_constant
    rng = np.random.default_rng(0)
    ranks = {"pad_channels": None, "o_blocked": None, "dot4": None, "dot4_blocked": None,
             "channel_sums": None, "dot4_rows": 4, "tap_sums": None, "o_last_blocked": None,
             "o_before_last_blocked": None, "o_blocked_widened": None,
             **{block_sums_packer(b): 2 for b in WEIGHT_BLOCKS}}
    for name in PACKERS:
        for _ in range(25):
            dot = name in ("dot4", "dot4_blocked")
            rank = ranks[name] or int(rng.integers(2 if dot or name == "o_before_last_blocked" else 1, 5))
            shape = tuple(int(d) for d in rng.integers(1, 40, rank))
            if dot:
                shape = shape[:-1] + (4 * -(-shape[-1] // 4),)  # whole groups of 4 input channels
            block = next((b for b in WEIGHT_BLOCKS if name == block_sums_packer(b)), 0)
            if block:
                shape = (shape[0], block * (1 + shape[1] % 3))  # whole blocks
            widened = PACKERS[name].dtype == "FLOAT32"
            for dtype in (np.int8,) if PACKERS[name].dtype == "INT32" else (np.float16,) if widened else (
                    np.float32, np.int8, np.int32):
                src = np.clip(rng.standard_normal(shape) * 50, -127, 127).astype(dtype)
                if widened:  # every class of half: subnormals, zeros, infinities
                    src.flat[: 6] = np.array([6e-8, -3e-6, -0.0, np.inf, -np.inf, 65504], np.float16)[: src.size]
                expected = pack(name, src)
                dst = np.full(expected.shape, 77, expected.dtype)  # padding must be written as zeros
                dims = lambda a: (ctypes.c_int32 * a.ndim)(*a.shape)  # noqa: E731
                ok = native(PACK.value(name), src.ctypes.data_as(ctypes.c_void_p), dims(src), src.ndim,
                            dst.ctypes.data_as(ctypes.c_void_p), dims(expected), expected.ndim,
                            ctypes.c_size_t(src.itemsize))
                assert ok == 1, (name, shape)
                np.testing.assert_array_equal(dst, expected, err_msg=f"{name} {shape} {dtype.__name__}")
    # Weights of kernels that compute in fp16: converted as Python converts them, a finite value past
    # 65504 (an attention mask's -3.4e38) saturating, on every class of float.
    from halide_gen.pack import half_saturated

    edges = np.array([np.inf, -np.inf, np.nan, -np.nan, 3.4e38, -3.4e38, 65504, 65519.996, 65520, 6e-8, 2.9e-8,
                      3.0e-8, -0.0, 1e-45, np.finfo(np.float32).max], np.float32)
    floats = np.concatenate([edges, rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
                             .view(np.float32)])
    halves = np.zeros(floats.size, np.uint16)
    ctypes.CDLL(str(lib)).floats_to_halves(floats.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(floats.size),
                                           halves.ctypes.data_as(ctypes.c_void_p))
    expected = half_saturated(floats)
    same = (halves == expected.view(np.uint16)) | (np.isnan(expected) & np.isnan(halves.view(np.float16)))
    assert same.all(), floats[~same][:5]
    assert list(halves.view(np.float16)[[0, 4, 5]]) == [np.inf, 65504, -65504] and np.isnan(halves.view(np.float16)[2])
    # Depthwise tap sums go with kernels that add two int8 products in int16: -128 is refused.
    weights = np.full((1, 3, 3, 5), -128, np.int8)
    with pytest.raises(ValueError, match="-128"):
        pack("tap_sums", weights)
    out = np.zeros(32, np.int32)
    assert native(PACK.value("tap_sums"), weights.ctypes.data_as(ctypes.c_void_p), (ctypes.c_int32 * 4)(1, 3, 3, 5), 4,
                  out.ctypes.data_as(ctypes.c_void_p), (ctypes.c_int32 * 1)(32), 1, ctypes.c_size_t(1)) == 0


def test_bundle_abi_header_is_generated_from_its_python_definition():
    # The table's structs and enums are written once, in halide_gen/bundle_abi.py; the committed
    # header must be what that module writes (python -m halide_gen.bundle_abi regenerates it).
    from halide_gen import bundle_abi

    from halide_gen.pack import PACKERS

    assert bundle_abi.HEADER.read_text() == bundle_abi.header(), "run: python -m halide_gen.bundle_abi"
    assert {m.key for m in bundle_abi.PACK.members} == {None, *PACKERS}  # a code for every packing



def test_runtime_build_flags_for_cmake_are_generated_from_their_python_description():
    # The runtime's compile and link options are described once (halide_gen/runtime_build.py):
    # fuse's g++ links use them directly, the CMake builds (the package's, the Android project's)
    # through the committed delegate/runtime_flags.cmake, which must be what that module writes.
    from halide_gen import runtime_build

    assert runtime_build.CMAKE_FILE.read_text() == runtime_build.cmake_text(), "run: python -m halide_gen.runtime_build"
    assert "-Wall" in runtime_build.compile_flags()  # warnings on in every build

def test_initializer_refuses_a_missing_or_unknown_field():
    from halide_gen.bundle_abi import NODE_SPEC, initializer

    assert initializer(NODE_SPEC, n_outputs=5, index=1, builtin_code=2, first_io=3, n_inputs=4) == "{1, 2, 3, 4, 5}"
    with pytest.raises(KeyError, match="missing \\['n_outputs'\\], unknown \\['outputs'\\]"):
        initializer(NODE_SPEC, index=1, builtin_code=2, first_io=3, n_inputs=4, outputs=5)


FEATURE_CHECK = """
#include <cstdio>
#include "HalideRuntime.h"
#include "cpu_caps.h"
static int CanUse(int feature) {
  constexpr int kWords = (halide_target_feature_end + 63) / 64;  // the size Halide insists on
  uint64_t bits[kWords] = {};
  for (int f : {halide_target_feature_avx512, halide_target_feature_avx512_skylake,
                halide_target_feature_avx512_cannonlake, static_cast<halide_target_feature_t>(feature)}) bits[f / 64] |= uint64_t{1} << (f % 64);
  return halide_can_use_target_features(kWords, bits);
}
int main() {
  dnnfusion::InstallCpuFeatureCheck();
  std::printf("zen4 %d sapphirerapids %d\\n", CanUse(halide_target_feature_avx512_zen4),
              CanUse(halide_target_feature_avx512_sapphirerapids));
}
"""


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file() or platform.machine() != "x86_64", reason="reads x86 /proc/cpuinfo")
def test_each_vnni_build_runs_only_on_its_vendors_cpus(tmp_path):
    """The host library's Zen 4 build may hold AMD's SSE4a, its Sapphire Rapids build Intel's
    AVX512-FP16 (LLVM's -mcpu follows Halide's feature set); Halide's own check ran the Zen 4 build
    on a Xeon (SIGILL). With the delegate's check, a build is taken only where its instructions exist."""
    (tmp_path / "check.cc").write_text(FEATURE_CHECK)
    exe = tmp_path / "check"
    build = _build_host_program([tmp_path / "check.cc", DELEGATE_DIR / "src" / "cpu_caps.cc"], exe, tmp_path, flags=())
    assert build.returncode == 0, build.stderr[-3000:]
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split())
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout.split()
    zen4, sapphirerapids = int(out[1]), int(out[3])
    assert not zen4 or "sse4a" in flags
    assert not sapphirerapids or "avx512_fp16" in flags
    # ...and VNNI is not lost where a build fits: an Intel CPU with Sapphire Rapids' set takes its build.
    intel_vnni = {"avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512ifma", "avx512_vnni", "avx512_bf16", "avx_vnni",
                  "avx512_fp16"}
    if intel_vnni <= flags:
        assert sapphirerapids
