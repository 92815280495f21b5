#include "cpu_caps.h"

#include <cstdint>

#include "HalideRuntime.h"

#if defined(__aarch64__) && (defined(__linux__) || defined(__ANDROID__))
#include <sys/auxv.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace dnnfusion {
namespace {

// Whether the CPU executes ARMv8.2's SDOT / UDOT. Linux and Android report it in the hardware
// capability bits (HWCAP_ASIMDDP, bit 20; spelt out for headers older than the bit).
bool HasDotProduct() {
#if defined(__aarch64__) && (defined(__linux__) || defined(__ANDROID__))
  constexpr unsigned long kAsimdDp = 1UL << 20;
  return (getauxval(AT_HWCAP) & kAsimdDp) != 0;
#else
  return false;  // dot-product bundles are built for aarch64 only
#endif
}

// Whether the CPU computes in half precision (ARMv8.2's FP16: HWCAP_FPHP, bit 9, for scalars and
// HWCAP_ASIMDHP, bit 10, for vectors).
bool HasHalfArithmetic() {
#if defined(__aarch64__) && (defined(__linux__) || defined(__ANDROID__))
  constexpr unsigned long kFpHp = 1UL << 9, kAsimdHp = 1UL << 10;
  return (getauxval(AT_HWCAP) & (kFpHp | kAsimdHp)) == (kFpHp | kAsimdHp);
#else
  return false;  // fp16 bundles are built for aarch64 only
#endif
}

bool HasFeature(int count, const uint64_t* features, int feature) {
  return feature / 64 < count && (features[feature / 64] >> (feature % 64)) & 1;
}

// Whether CPUID leaf `leaf` (sub-leaf `subleaf`) sets `bit` of register `reg` (0..3: EAX..EDX).
bool CpuidBit(unsigned leaf, unsigned subleaf, int reg, int bit) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned r[4];
  return __get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3]) && (r[reg] >> bit & 1);
#else
  (void)leaf, (void)subleaf, (void)reg, (void)bit;
  return false;
#endif
}

bool HasSse4a() { return CpuidBit(0x80000001, 0, 2, 6); }  // AMD's insertq, extrq: ECX bit 6
bool HasAvx512Fp16() { return CpuidBit(7, 0, 3, 23); }  // Intel's AVX512-FP16: EDX bit 23

// Halide's check, narrowed: its avx512_zen4 and avx512_sapphirerapids feature sets also pick LLVM's
// -mcpu (znver4, sapphirerapids), whose code may use one vendor's instructions (SSE4a's insertq in
// an int8 kernel; AVX512-FP16), while its runtime takes the Zen 4 build on any CPU with the same
// AVX-512 set: on a Sapphire Rapids Xeon the host library's int8 kernels died of SIGILL.
int CanUseTargetFeatures(int count, const uint64_t* features) {
  if (HasFeature(count, features, halide_target_feature_avx512_zen4) && !HasSse4a()) return 0;
  if (HasFeature(count, features, halide_target_feature_avx512_sapphirerapids) && !HasAvx512Fp16()) return 0;
  return halide_default_can_use_target_features(count, features);
}

}  // namespace

void InstallCpuFeatureCheck() {
  static const bool installed = (halide_set_custom_can_use_target_features(CanUseTargetFeatures), true);
  (void)installed;
}

std::string CpuProblem(const Bundle& bundle) {
  if (bundle.needs_half_arithmetic && !HasHalfArithmetic()) {
    return std::string("the kernels of target ") + bundle.target +
           " compute in ARMv8.2 half precision, which this CPU lacks (build without --cpu-precision fp16)";
  }
  if (bundle.n_cpu_feature_words > 0 && !CanUseTargetFeatures(bundle.n_cpu_feature_words, bundle.cpu_features)) {
    return std::string("the kernels of target ") + bundle.target +
           " were built for the CPU that fused the model, and this CPU lacks some of its features "
           "(build --target host for any x86-64 CPU)";
  }
  if (bundle.needs_dot_product && !HasDotProduct()) {
    return std::string("the kernels of target ") + bundle.target +
           " use ARMv8.2 dot-product instructions this CPU lacks (build the -nodot target for it)";
  }
  return "";
}

}  // namespace dnnfusion
