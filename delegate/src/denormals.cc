#include "denormals.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace dnnfusion {
namespace {

#if defined(__x86_64__) || defined(__i386__)
constexpr uint64_t kFlushBits = 0x8000 | 0x0040;  // MXCSR: FTZ | DAZ
uint64_t ReadMode() { return _mm_getcsr(); }
void WriteMode(uint64_t mode) { _mm_setcsr(static_cast<unsigned>(mode)); }
#elif defined(__aarch64__)
constexpr uint64_t kFlushBits = uint64_t{1} << 24;  // FPCR.FZ: subnormal inputs and results are zero
uint64_t ReadMode() {
  uint64_t mode;
  asm volatile("mrs %0, fpcr" : "=r"(mode));
  return mode;
}
void WriteMode(uint64_t mode) { asm volatile("msr fpcr, %0" : : "r"(mode)); }
#else
constexpr uint64_t kFlushBits = 0;
uint64_t ReadMode() { return 0; }
void WriteMode(uint64_t) {}
#endif

}  // namespace

ScopedDenormalsAsZero::ScopedDenormalsAsZero() : saved_(ReadMode()) {
  if ((saved_ & kFlushBits) != kFlushBits) WriteMode(saved_ | kFlushBits);
}

ScopedDenormalsAsZero::~ScopedDenormalsAsZero() {
  if ((saved_ & kFlushBits) != kFlushBits) WriteMode(saved_);
}

}  // namespace dnnfusion
