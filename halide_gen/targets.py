"""The compile targets: one TargetSpec per name the CLI takes, the single description of a target.

    host                  x86-64 Linux, multitarget: AVX-512 with VNNI (Sapphire Rapids and
                          later; Zen 4 and later), AVX-512, AVX2, and a plain x86-64 baseline
                          (each scheduled for its own registers; the library runs the best
                          one the CPU supports: halide_gen.dispatch)
    host-native           x86-64 Linux, the one of host's builds this CPU runs: a fifth of the
                          compile time, for a library that runs where it was built (the
                          delegate declines it on a CPU without that build's features)
    arm64-linux           AArch64 Linux (NEON, ARMv8.2 dot product: int8 sums with SDOT)
    arm64-linux-nodot     AArch64 Linux for ARMv8.0 cores (Cortex-A53): NEON without dot product
    arm64-android         AArch64 Android (NEON, dot product)
    arm64-android-nodot   AArch64 Android for ARMv8.0 cores
    arm64-android-opencl  Android, kernels on the GPU through OpenCL (Adreno, Mali)
    arm64-android-vulkan  Android, kernels on the GPU through Vulkan
    host-opencl           x86-64 Linux with OpenCL (tested here on PoCL)
    host-vulkan           x86-64 Linux with Vulkan (tested here on Mesa lavapipe)

Each GPU target also comes as `<name>-fp16` (the CLI's `--gpu-precision fp16`, `with_precision`):
every tensor a block computes is stored in half precision (halide_gen.lowering_options), with
the device's fp16 feature enabled (`cl_half`: cl_khr_fp16; `vk_float16`: shaderFloat16 + 16-bit
storage). So does each ARMv8.2 CPU target (`arm64-linux-fp16`, `arm64-android-fp16`: the CLI's
`--cpu-precision fp16`), which also computes its convolutions and matrix products in half
precision (`arm_fp16`: 8 lanes an FMA) from weights stored in it.

Each CPU target also comes with its other int8 rounding (the CLI's `--int8-rounding`,
`with_int8_rounding`): `<name>-int8-reference` or `<name>-int8-xnnpack`. x86 targets requantize int8
sums as XNNPACK does by default ("xnnpack": float32, within 1 LSB of LiteRT's reference kernels and
the same integers as its default XNNPACK path); ARM targets as the reference kernels do, bit for bit
("reference": ARM's SQRDMULH makes the fixed point cheap there). halide_gen.lower.quantized says how.

Plain data, importable without Halide (the CLI lists the names before anything is compiled); the
Halide objects are made on demand.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Sequence

_X86_AVX512 = "x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-sse41"
# AVX-512 with VNNI: int8 sums with VPDPBUSD, 4 byte products per 32-bit lane. Two builds, one per
# vendor: Halide's feature set also picks LLVM's -mcpu, and code for znver4 may use AMD's SSE4a
# (insertq), code for sapphirerapids Intel's AVX512-FP16. The delegate keeps each to its vendor's
# CPUs (delegate/src/cpu_caps.cc); Halide's runtime alone would run the Zen 4 build on a Xeon.
_X86_AVX512_VNNI_INTEL = ("x86-64-linux-avx-avx2-avx512-avx512_skylake-avx512_cannonlake-avx512_sapphirerapids-"
                          "f16c-fma-sse41")
_X86_AVX512_VNNI_AMD = "x86-64-linux-avx-avx2-avx512-avx512_skylake-avx512_cannonlake-avx512_zen4-f16c-fma-sse41"
_X86_AVX2 = "x86-64-linux-avx-avx2-f16c-fma-sse41"
_X86_BASE = "x86-64-linux"
_X86_BUILDS = (_X86_AVX512_VNNI_INTEL, _X86_AVX512_VNNI_AMD, _X86_AVX512, _X86_AVX2, _X86_BASE)  # best first
_VULKAN = "vulkan-vk_int8-vk_int16-vk_v13"  # 8/16-bit storage for BOOL and int8 tensors

# Halide's Vulkan memory allocator, as HL_VK_ALLOC_CONFIG reads it (max pool MB : min block MB : max
# block MB : max block count : size multiple in bytes). The defaults round regions to 32 bytes; on a
# device whose nonCoherentAtomSize is 64 (Mesa lavapipe) a copy of a buffer that is not a multiple of
# 64 bytes then lost its last partial block, and 224x224 CNNs could not get their default-sized memory
# blocks. 1 MB blocks and 64-byte multiples fix both (tests/test_aot.py, tests/test_gpu_delegate.py).
# The bundle carries this string to the delegate (Bundle::vulkan_alloc_config), which sets it unless the
# environment has one.
VULKAN_ALLOC_CONFIG = "0:1:0:0:64"


@dataclass(frozen=True)
class Toolchain:
    """How C++ for one CPU is built on this machine and, for tests and measurements, run here."""

    compiler: str  # the C++ compiler used unless `compiler_env` names another
    compiler_env: str  # the environment variable that overrides it
    package: str  # the Debian package that provides the compiler (named in the error when it is missing)
    sysroot: str | None  # the cross compiler's target root, where the target's shared libraries live
    launcher: tuple[str, ...]  # what runs one of its executables here; () = natively


_AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"

# One toolchain per CPU a target runs on (TargetSpec.machine). A target whose machine is not here is
# refused with a clear error (TargetSpec.toolchain), never built with the host's compiler.
TOOLCHAINS: dict[str, Toolchain] = {
    "x86-64": Toolchain("g++", "DNNFUSION_CXX_X86", "g++", None, ()),
    "arm-64": Toolchain("aarch64-linux-gnu-g++", "DNNFUSION_CXX_ARM64", "g++-aarch64-linux-gnu", _AARCH64_SYSROOT,
                        ("qemu-aarch64", "-L", _AARCH64_SYSROOT)),
}

# The oldest Android the arm64-android* builds are for (API level 26, Android 8.0): the NDK builds
# with -DANDROID_PLATFORM=android-26 and the AAR's manifest says minSdkVersion 26. Vulkan builds
# need the platform's libvulkan.so (API 24+); 26 is the one level every build (CPU, OpenCL,
# Vulkan) shares with a margin, and below it nothing has been built or run.
ANDROID_MIN_SDK = 26

# How a target's delegate is delivered in OUT: "library", a shared library linked here; "android-cmake",
# a CMake project for the Android NDK (linked here too when $ANDROID_NDK is set: tflite_tools.fuse).
PACKAGINGS = ("library", "android-cmake")


# How an int8 convolution or matrix product turns its int32 sums into int8 (halide_gen.lower.quantized).
INT8_ROUNDINGS = ("reference", "xnnpack")


@dataclass(frozen=True)
class TargetSpec:
    """A named compilation target: Halide target strings (several = multitarget, baseline last)."""

    name: str
    halide: tuple[str, ...]
    family: str  # "x86", "arm" or "gpu": which schedule family applies
    precision: str = "fp32"  # how float tensors inside a block are stored (halide_gen.lowering_options.PRECISIONS)
    packaging: str = "library"  # one of PACKAGINGS
    int8_rounding: str = "reference"  # how int8 sums are requantized: one of INT8_ROUNDINGS
    # Built for the CPU that builds it: target_spec narrows `halide` to the first of its builds
    # this CPU can run, and the bundle names that build's features for the delegate to check.
    native: bool = False

    def __post_init__(self):
        if self.packaging not in PACKAGINGS:
            raise ValueError(f"{self.name}: packaging {self.packaging!r} is none of {PACKAGINGS}")

    def targets(self) -> list:
        """The Halide targets (hl.Target), each without its own copy of the runtime."""
        import halide as hl

        return [hl.Target(t).with_feature(hl.TargetFeature.NoRuntime) for t in self.halide]

    def jit_target(self):
        """The Halide target that runs this target's kernels in this process (for timing them):
        the host CPU's own features, plus the GPU API and its features for `host-*` GPU targets.
        Raises ValueError for targets whose kernels cannot run here (ARM64, Android)."""
        import halide as hl

        host = hl.get_jit_target_from_environment()
        if self.family == "x86":
            return host
        if self.family == "gpu" and self.halide[0].startswith(_X86_AVX2):
            return hl.Target(f"{host}{self.halide[0][len(_X86_AVX2):]}")
        raise ValueError(f"kernels for {self.name} cannot run on this machine")

    @property
    def machine(self) -> str:
        """The CPU the code runs on, as Halide names it: "x86-64" or "arm-64" (its compiler and,
        for tests here, its launcher follow from it)."""
        return "-".join(self.halide[0].split("-")[:2])

    @property
    def toolchain(self) -> Toolchain:
        """The compiler (and launcher) for this target's CPU; ValueError for a CPU without one."""
        try:
            return TOOLCHAINS[self.machine]
        except KeyError:
            raise ValueError(f"{self.name}: no C++ toolchain known for {self.machine} "
                             "(halide_gen.targets.TOOLCHAINS)") from None

    @property
    def library_suffix(self) -> str:
        """What sets this target's delegate library apart from the CPU one of the same model, so an
        app can ship both: "" for CPUs, "_nodot" for ARMv8.0 builds, "_opencl", "_vulkan",
        "_opencl_fp16", ..."""
        if self.gpu_api is None:
            if self.family == "arm" and not self.dot_product:
                return "_nodot"
            return "_fp16" if self.half_arithmetic else ""
        return f"_{self.gpu_api}" + ("_fp16" if self.precision == "fp16" else "")

    def lowering_options(self):
        """The forms this target's kernels take (halide_gen.lowering_options.LoweringOptions): ARM's
        float min / max give TFLite's NaN and inf answers by themselves (x86's maxps does not); x86
        takes its integer forms (VNNI reads unsigned activations; a 64-bit product requantizes) and
        keeps 4 partials of a float row reduction apart;
        Vulkan targets here ask for no 64-bit integers, which phone GPUs often lack; GPU code
        cannot fail an invoke."""
        from .lowering_options import LoweringOptions

        return LoweringOptions(precision=self.precision, half_arithmetic=self.half_arithmetic,
                               native_minmax=self.family == "arm",
                               x86_integer=self.family == "x86", int8_rounding=self.int8_rounding,
                               wide_integers=self.gpu_api != "vulkan", device_code=self.family == "gpu",
                               row_partials=4 if self.family == "x86" else 1)

    def required_cpu_features(self) -> list[int]:
        """The Halide target features (halide_target_feature_t values) a CPU must have to run a
        native build's kernels; [] where Halide's multitarget dispatch or the target's own checks
        (dot product, fp16) decide."""
        if not self.native:
            return []
        (build,) = self.halide
        return [int(f) for f in features_of(build)]

    @property
    def dot_product(self) -> bool:
        """Whether the CPU kernels may use ARMv8.2's dot-product instructions (SDOT): int8
        convolutions and matrix products sum 4 products per lane with them."""
        return any("arm_dot_prod" in t for t in self.halide)

    @property
    def half_arithmetic(self) -> bool:
        """Whether the CPU kernels compute in half precision (ARMv8.2's FP16 arithmetic: the
        `-fp16` ARM targets); GPU targets in fp16 only store it."""
        return self.family == "arm" and self.precision == "fp16"

    @property
    def int8_claimed_unmeasured(self) -> bool:
        """Whether int8 blocks are claimed by default without `fuse --measure`: where their kernels
        are known to beat XNNPACK's QS8 path: ARMv8.2 with dot product (bench/RESULTS.md, "Benchmarks:
        the whole set") and x86 with XNNPACK's float rounding (bench/RESULTS-history.md, "x86 int8
        rounded as XNNPACK rounds"); not x86 with the reference rounding, nor ARMv8.0 cores (widening
        multiplies instead of SDOT)."""
        if self.family == "x86":
            return self.int8_rounding == "xnnpack"
        return self.family == "arm" and self.dot_product

    @property
    def hybrid_claimed_unmeasured(self) -> bool:
        """Whether blocks holding a dynamic-range op (float inputs quantized as the kernel runs) are
        claimed by default without `fuse --measure`: where their kernels are known to beat XNNPACK's
        own dynamic quantization on whole models (bench/RESULTS.md, "Real-size corpus: speed" for
        x86 time, "ARM64: dynamic-range models" for ARMv8.2 instructions); not on ARMv8.0 cores
        (no dot product: int16 sums), which were not measured."""
        return self.family == "x86" or (self.family == "arm" and self.dot_product)

    def claims_unmeasured(self, ops) -> bool:
        """Whether a block of `ops` that has a kernel is claimed by default when nothing was timed
        (no `fuse --measure`): where kernels of its kind are known to hold their own. Float blocks on
        CPUs; int8 ones where int8_claimed_unmeasured says (16x8 blocks always: XNNPACK has no int16
        kernels); dynamic-range ones where hybrid_claimed_unmeasured says; never a GPU block
        (correct, not yet tuned: claim:all asks for them)."""
        from tflite_tools.model.hybrid import is_hybrid

        if self.family == "gpu":
            return False
        if any(is_hybrid(op) for op in ops):
            return self.hybrid_claimed_unmeasured
        return self.int8_claimed_unmeasured or not computes_on_int8(ops)

    def plan_config(self):
        """The fusion plan's settings for this target (fusion.plan.PlanConfig): the attention core
        in one block on CPUs only (a GPU launches each of its stages either way), and elementwise ops
        in their producer's epilogue except on ARM, where the epilogue's constants do not fit beside
        NEON's register tile (bench/RESULTS-history.md, "Epilogues first")."""
        from fusion.plan import PlanConfig

        return PlanConfig(attention_core=self.family != "gpu", epilogue_first=self.family != "arm")

    @property
    def gpu_api(self) -> str | None:
        """"opencl" or "vulkan" for GPU targets."""
        for api in ("opencl", "vulkan"):
            if api in self.halide[0]:
                return api
        return None


def computes_on_int8(ops) -> bool:
    """True for a block computing on int8 activations (int8 weights dequantized into a float model
    do not count)."""
    return any(t is not None and t.type_name == "INT8" and not t.is_constant
               for op in ops for t in (*op.inputs, *op.outputs))


# The Halide feature that lets each GPU API store and convert half-precision floats.
_FP16_FEATURE = {"opencl": "cl_half", "vulkan": "vk_float16"}


def _with_fp16(spec: TargetSpec) -> TargetSpec:
    """The half-precision variant of a GPU target."""
    feature = _FP16_FEATURE[spec.gpu_api]
    return TargetSpec(f"{spec.name}-fp16", tuple(f"{t}-{feature}" for t in spec.halide), spec.family, "fp16",
                      spec.packaging)


def _with_half_arithmetic(spec: TargetSpec) -> TargetSpec:
    """The half-precision variant of an ARMv8.2 CPU target."""
    return replace(spec, name=f"{spec.name}-fp16", halide=tuple(f"{t}-arm_fp16" for t in spec.halide),
                   precision="fp16")


def _with_other_rounding(spec: TargetSpec) -> TargetSpec:
    """A CPU target with the int8 rounding it does not take by default."""
    rounding = next(r for r in INT8_ROUNDINGS if r != spec.int8_rounding)
    return replace(spec, name=f"{spec.name}-int8-{rounding}", int8_rounding=rounding)


_BASE_TARGETS = [
    TargetSpec("host", _X86_BUILDS, "x86", int8_rounding="xnnpack"),
    TargetSpec("host-native", _X86_BUILDS, "x86", int8_rounding="xnnpack", native=True),
    # ARMv8.2 and later (every big and little phone core since Cortex-A55 / A75) run int8 sums with
    # SDOT; the -nodot builds are for ARMv8.0 cores (Cortex-A53), where the others decline to run.
    TargetSpec("arm64-linux", ("arm-64-linux-arm_dot_prod",), "arm"),
    TargetSpec("arm64-linux-nodot", ("arm-64-linux",), "arm"),
    TargetSpec("arm64-android", ("arm-64-android-arm_dot_prod",), "arm", packaging="android-cmake"),
    TargetSpec("arm64-android-nodot", ("arm-64-android",), "arm", packaging="android-cmake"),
    TargetSpec("arm64-android-opencl", ("arm-64-android-opencl",), "gpu", packaging="android-cmake"),
    TargetSpec("arm64-android-vulkan", (f"arm-64-android-{_VULKAN}",), "gpu", packaging="android-cmake"),
    TargetSpec("host-opencl", (f"{_X86_AVX2}-opencl",), "gpu"),
    TargetSpec("host-vulkan", (f"{_X86_AVX2}-{_VULKAN}",), "gpu"),
]
TARGETS: dict[str, TargetSpec] = {s.name: s for s in _BASE_TARGETS}
TARGETS.update({f.name: f for f in (_with_fp16(s) for s in _BASE_TARGETS if s.family == "gpu")})
# ARMv8.2 cores compute in fp16 (the dot-product builds' cores: Cortex-A55 / A75 and later).
_HALF_BASES = [s for s in _BASE_TARGETS if s.family == "arm" and s.dot_product]
_HALF_TARGETS = [_with_half_arithmetic(s) for s in _HALF_BASES]
TARGETS.update({f.name: f for f in _HALF_TARGETS})
TARGETS.update({r.name: r for r in (_with_other_rounding(s) for s in _BASE_TARGETS + _HALF_TARGETS if s.family != "gpu")})
# The names the CLI's --target takes; the variants come from --gpu-precision, --cpu-precision and
# --int8-rounding.
BASE_TARGETS = tuple(s.name for s in _BASE_TARGETS)


# The target `fuse` builds when none is named (the CLI's --target, fuse()'s target): "host" unless
# the environment names another (DNNFUSION_TARGET=host-native: builds a fifth as long, for here).
DEFAULT_TARGET_ENV = "DNNFUSION_TARGET"


def default_target() -> str:
    """The target fuse builds when none is named: $DNNFUSION_TARGET, or "host"; raises ValueError
    where the variable names no target."""
    name = os.environ.get(DEFAULT_TARGET_ENV) or "host"
    if name not in TARGETS:
        raise ValueError(f"{DEFAULT_TARGET_ENV}={name} names no target; known: {', '.join(TARGETS)}")
    return name


def target_spec(name: str) -> TargetSpec:
    """The spec for a target name (a native one narrowed to this CPU's build); raises ValueError
    listing the known names."""
    try:
        spec = TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None
    return _for_this_cpu(spec) if spec.native else spec


@functools.cache
def _for_this_cpu(spec: TargetSpec) -> TargetSpec:
    """A native spec with `halide` narrowed to the first of its builds whose features this CPU has."""
    import halide as hl

    host = hl.get_host_target()
    for build in spec.halide:
        if all(host.has_feature(f) for f in features_of(build)):
            return replace(spec, halide=(build,))
    raise ValueError(f"{spec.name}: this CPU runs none of its builds ({host})")


def features_of(build: str) -> list:
    """The Halide target features (hl.TargetFeature) a build's target string sets."""
    import halide as hl

    target, end = hl.Target(build), int(hl.TargetFeature.FeatureEnd)
    return [f for f in hl.TargetFeature.__members__.values() if int(f) < end and target.has_feature(f)]


def feature_word_count() -> int:
    """The 64-bit words halide_can_use_target_features takes (its runtime refuses any other count)."""
    import halide as hl

    return (int(hl.TargetFeature.FeatureEnd) + 63) // 64


def feature_words(features: Sequence[int]) -> list[int]:
    """Halide target features as halide_can_use_target_features takes them: bit k of word k / 64,
    feature_word_count() words; [] for none."""
    words = [0] * feature_word_count() if features else []
    for f in features:
        words[f // 64] |= 1 << (f % 64)
    return words


GPU_TARGETS = tuple(name for name, spec in TARGETS.items() if spec.family == "gpu" and spec.precision == "fp32")
# The CPU targets that compute in half precision, by their fp32 names.
HALF_CPU_TARGETS = tuple(s.name for s in _HALF_BASES)


def with_precision(name: str, precision: str) -> str:
    """The GPU target that stores a block's float tensors in `precision` ("fp32" or "fp16"); raises
    ValueError where there is none (the CLI's --gpu-precision: GPU targets only)."""
    if precision == "fp32":
        return target_spec(name).name
    variant = f"{name}-{precision}"
    if target_spec(name).family != "gpu" or variant not in TARGETS:
        raise ValueError(f"--gpu-precision {precision} needs a GPU target ({', '.join(GPU_TARGETS)}), not {name}")
    return variant


def with_cpu_precision(name: str, precision: str) -> str:
    """The CPU target that computes in `precision` ("fp32" or "fp16"); raises ValueError where there
    is none (the CLI's --cpu-precision: fp16 arithmetic needs an ARMv8.2 core; x86 CPUs only convert
    fp16 to float32, so a kernel would compute as it does in fp32 with extra conversions)."""
    if precision == "fp32":
        return target_spec(name).name
    if name not in HALF_CPU_TARGETS:
        family = target_spec(name).family
        why = {"x86": "x86 has no fp16 arithmetic Halide uses (it widens each product to fp32; AVX512-BF16 keeps "
                      "8-bit significands, not fp16's)", "arm": "ARMv8.0 cores have no fp16 arithmetic"}.get(
            family, "it is no CPU target (GPU targets take --gpu-precision)")
        raise ValueError(f"--cpu-precision {precision} needs an ARMv8.2 target ({', '.join(HALF_CPU_TARGETS)}), "
                         f"not {name}: {why}")
    return f"{name}-{precision}"


def with_int8_rounding(name: str, rounding: str | None) -> str:
    """The target that requantizes int8 sums as `rounding` says ("reference" or "xnnpack"; None:
    the target's default); raises ValueError for GPU targets (their int8 kernels round as the
    reference does) and unknown roundings."""
    spec = target_spec(name)
    if rounding is None or rounding == spec.int8_rounding:
        return spec.name
    if spec.family == "gpu":
        raise ValueError(f"--int8-rounding {rounding} needs a CPU target, not {name}")
    variant = f"{name}-int8-{rounding}"
    if variant not in TARGETS:
        raise ValueError(f"no int8 rounding {rounding!r} ({' or '.join(INT8_ROUNDINGS)})")
    return variant
