#include "cpu_caps.h"

#if defined(__aarch64__) && (defined(__linux__) || defined(__ANDROID__))
#include <sys/auxv.h>
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

}  // namespace

std::string CpuProblem(const Bundle& bundle) {
  if (bundle.needs_dot_product && !HasDotProduct()) {
    return std::string("the kernels of target ") + bundle.target +
           " use ARMv8.2 dot-product instructions this CPU lacks (build the -nodot target for it)";
  }
  return "";
}

}  // namespace dnnfusion
