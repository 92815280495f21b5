// Subnormal floats read and written as zero while this thread runs the delegate's kernels.
//
// A subnormal operand or result costs a microcode assist per instruction on many x86 cores (over
// a hundred cycles on Intel's): a causal attention whose masked probabilities are tiny took 50x its
// time in the matrix product they enter. XNNPACK runs its kernels the same way
// (pthreadpool's PTHREADPOOL_FLAG_DISABLE_DENORMALS); values that small are below what any model's
// tolerance can see.
#pragma once

#include <cstdint>

namespace dnnfusion {

// Sets flush-to-zero and denormals-are-zero (x86 MXCSR; FPCR.FZ on ARM64) for its lifetime, then
// restores the caller's floating-point mode.
class ScopedDenormalsAsZero {
 public:
  ScopedDenormalsAsZero();
  ~ScopedDenormalsAsZero();
  ScopedDenormalsAsZero(const ScopedDenormalsAsZero&) = delete;
  ScopedDenormalsAsZero& operator=(const ScopedDenormalsAsZero&) = delete;

 private:
  uint64_t saved_ = 0;
};

}  // namespace dnnfusion
