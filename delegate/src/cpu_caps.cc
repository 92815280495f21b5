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

bool HasFeature(int count, const uint64_t* features, int feature) {
  return feature / 64 < count && (features[feature / 64] >> (feature % 64)) & 1;
}

// AMD's SSE4a (insertq, extrq): CPUID 0x80000001, ECX bit 6.
bool HasSse4a() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  return __get_cpuid(0x80000001, &a, &b, &c, &d) && (c & (1u << 6));
#else
  return false;
#endif
}

// Intel's AVX512-FP16: CPUID 7.0, EDX bit 23.
bool HasAvx512Fp16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23));
#else
  return false;
#endif
}

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
  if (bundle.needs_dot_product && !HasDotProduct()) {
    return std::string("the kernels of target ") + bundle.target +
           " use ARMv8.2 dot-product instructions this CPU lacks (build the -nodot target for it)";
  }
  return "";
}

}  // namespace dnnfusion
