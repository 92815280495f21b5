"""AOT kernels outside Python: x86 host (native), ARM64 (qemu-aarch64), OpenCL (PoCL), Vulkan
(Mesa lavapipe). Each representative block is compiled for the target, run by a standalone C++
runner, and compared with LiteRT's reference kernels (tolerance: opcheck.FLOAT_RTOL).

The tools come from Debian packages that .ci/run installs (g++-aarch64-linux-gnu, qemu-user,
pocl-opencl-icd, mesa-vulkan-drivers). Without CI=true a missing tool skips its target; in CI it
fails, so a broken install step cannot hide.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import tflite_tools
from fusion.ecg import build_ecg
from fusion.plan import plan_fusion
from halide_gen.aot import compile_kernel, compile_runtime
from halide_gen.targets import TARGETS, VULKAN_ALLOC_CONFIG, target_spec
from halide_gen.harness import build_runner
from halide_gen.pack import pack
from tflite_tools import runtime
from opcheck import FLOAT_RTOL

# Representative blocks: (model, which block by its ops) — one per block kind.
BLOCKS = {
    "elementwise chain": ("swish_chain", ("MUL", "ADD", "LOGISTIC", "MUL")),
    "depthwise + residual": ("depthwise_residual", ("DEPTHWISE_CONV_2D", "ADD")),
    "fully connected": ("fc_softmax", ("FULLY_CONNECTED",)),
    "softmax": ("fc_softmax", ("SOFTMAX",)),
    "data movement": ("reshape_transpose", ("RESHAPE", "TRANSPOSE")),
    "conv + relu6": ("conv_relu6", ("CONV_2D",)),
    "int8 inverted residual": ("mobilenet_v2_035_96_int8", ("CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D")),
}

LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
POCL_ICD = Path("/etc/OpenCL/vendors/pocl.icd")


def require(ok: bool, what: str) -> None:
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing in CI: .ci/run should install it")
        pytest.skip(f"{what} not installed")


def target_ready(target: str) -> dict[str, str]:
    """Checks the tools a target needs; returns the environment its runner needs."""
    if target.startswith("arm64"):
        require(shutil.which("aarch64-linux-gnu-g++") is not None, "aarch64-linux-gnu-g++")
        require(shutil.which("qemu-aarch64") is not None, "qemu-aarch64")
    if target == "host-opencl":
        require(POCL_ICD.exists(), "PoCL (pocl-opencl-icd)")
        return {"OCL_ICD_VENDORS": str(POCL_ICD.parent)}
    if target == "host-vulkan":
        require(LAVAPIPE_ICD.exists(), "lavapipe (mesa-vulkan-drivers)")
        return {"VK_ICD_FILENAMES": str(LAVAPIPE_ICD), "HL_VK_ALLOC_CONFIG": VULKAN_ALLOC_CONFIG}
    return {}


def run_block(kind: str, target: str, model_path, tmp_path, features=None) -> float:
    stem, ops = BLOCKS[kind]
    env = target_ready(target)
    model = tflite_tools.load(model_path(stem))
    plan = plan_fusion(build_ecg(model.main))
    block = next(b for b in plan.blocks if tuple(plan.ecg.nodes[i].name for i in b.ops) == ops)  # the first such
    # (Int8 on Vulkan, which has no 64-bit integers here, requantizes in 32-bit pieces: lower.quantized.)
    artifact = compile_kernel([plan.ecg.nodes[i].op for i in block.ops], block.outputs, target,
                              cache_dir=tmp_path / "cache")
    runner = build_runner(artifact, target, tmp_path / "build", features)
    # LiteRT computes every tensor of the model; the block's inputs and outputs are read from it.
    index = {id(t): k for k, t in enumerate(model.main.tensors)}
    quantized = stem.endswith("_int8")  # LiteRT's reference int8 SOFTMAX aborts: builtin kernels, 1 LSB
    interp = runtime.make_interpreter(model_path(stem), resolver="builtin" if quantized else "reference",
                                      preserve_all_tensors=True)
    runtime.run(interp, runtime.random_inputs(interp, 11))
    by_name = {t.name: t for t in model.main.tensors}
    args = [pack(d["pack"], by_name[d["name"]].data) if by_name[d["name"]].is_constant
            else interp.get_tensor(index[id(by_name[d["name"]])]) for d in artifact.arguments]
    expected = [interp.get_tensor(index[id(t)]) for t in block.outputs]
    got = runner(args, env=env)
    worst = 0.0
    for ref, out in zip(expected, got):
        if quantized:
            steps = int(np.abs(ref.astype(np.int32) - out).max())
            assert steps <= 1, f"{kind} on {target}: {steps} quantization steps off"
            continue
        err = float(np.abs(ref.astype(np.float64) - out).max()) / max(float(np.abs(ref).max()), 1e-30)
        worst = max(worst, err)
    assert worst <= FLOAT_RTOL, f"{kind} on {target}: relative error {worst:.3g}"
    return worst


# Where each target runs here: natively, under qemu-aarch64, on PoCL, on Mesa lavapipe. On Vulkan,
# with Halide's default allocator settings a buffer whose byte size is not a multiple of 64 lost its
# last partial 64-byte block in host<->device copies (a [200] float output came back with its last 8
# values unwritten); aot.VULKAN_ALLOC_CONFIG fixes that, and these cases (several with buffers of odd
# sizes) hold it.
RUNS_ON = {"host": "host", "arm64-linux": "arm64_under_qemu", "host-opencl": "opencl_on_pocl",
           "host-vulkan": "vulkan_on_lavapipe"}


@pytest.mark.parametrize("target", sorted(RUNS_ON), ids=RUNS_ON.get)
@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_block_runs_on(kind, target, model_path, tmp_path):
    run_block(kind, target, model_path, tmp_path)


def _host_runs(build: str) -> bool:
    """Whether this CPU runs a host build: its features, and the vendor's instructions the delegate
    checks besides (delegate/src/cpu_caps.cc: AMD's SSE4a for Zen 4's, AVX512-FP16 for Sapphire Rapids')."""
    import halide as hl

    from halide_gen.targets import features_of

    host = hl.get_host_target()
    flags = set(next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
                     "").split())
    vendor = {"avx512_zen4": "sse4a", "avx512_sapphirerapids": "avx512_fp16"}
    return (all(host.has_feature(f) for f in features_of(build))
            and all(flag in flags for feature, flag in vendor.items() if feature in build.split("-")))


@pytest.mark.parametrize("kind", ["fully connected", "conv + relu6", "depthwise + residual", "int8 inverted residual"])
def test_every_build_of_the_host_library_that_this_cpu_runs_is_right(kind, model_path, tmp_path):
    # Each x86 build is compiled from a kernel scheduled for its own registers (AVX-512's tiles, AVX2's,
    # SSE's): every build this CPU can run, taken by the library's own dispatch, against LiteRT.
    from halide_gen.targets import features_of

    builds = [b for b in target_spec("host").halide if _host_runs(b)]
    assert len(builds) >= 2  # at least AVX2 (or better) and the baseline
    for build in builds:
        run_block(kind, "host", model_path, tmp_path, features=[int(f) for f in features_of(build)])


def swish_block(model_path):
    """The one block of the swish_chain test model: its ops and its plan entry."""
    model = tflite_tools.load(model_path("swish_chain"))
    plan = plan_fusion(build_ecg(model.main))
    (block,) = plan.blocks
    return [plan.ecg.nodes[i].op for i in block.ops], block


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_target_compiles(target, model_path, tmp_path):
    ops, block = swish_block(model_path)
    art = compile_kernel(ops, block.outputs, target, cache_dir=tmp_path, emit_asm=True)
    assert art.library.stat().st_size > 0 and art.header.read_text().count(f"int {art.function}_argv(") == 1
    assert any(p.suffix == ".s" for p in art.extra) and any(p.suffix == ".stmt" for p in art.extra)
    assert compile_runtime(target, tmp_path).stat().st_size > 0
    if len(target_spec(target).halide) > 1:  # the host library carries every sub-target
        assert len([p for p in art.extra if p.suffix == ".s"]) == len(target_spec(target).halide)


def test_compile_cache_hits(model_path, tmp_path):
    ops, block = swish_block(model_path)
    first = compile_kernel(ops, block.outputs, "arm64-linux", cache_dir=tmp_path)
    again = compile_kernel(ops, block.outputs, "arm64-linux", cache_dir=tmp_path)
    assert not first.cached and again.cached and again.library == first.library
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


def test_unknown_target_is_named():
    with pytest.raises(ValueError, match="unknown target 'riscv'"):
        target_spec("riscv")


def test_autoscheduled_kernel_is_cached_apart(model_path, tmp_path):
    ops, block = swish_block(model_path)
    template = compile_kernel(ops, block.outputs, "host", cache_dir=tmp_path)
    auto = compile_kernel(ops, block.outputs, "host", cache_dir=tmp_path, schedule="Mullapudi2016")
    assert template.library.parent != auto.library.parent and not auto.cached
