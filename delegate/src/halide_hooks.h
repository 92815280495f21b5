// Halide runtime hooks: errors are captured (so a failing kernel becomes a kTfLiteError with
// Halide's message, not a line on stderr), Halide's prints go through our log, and what kernels
// allocate comes from the kernel heap (kernel_heap.h).
#pragma once

#include <string>

namespace dnnfusion {

// Routes the Halide runtime linked into this library to the hooks below (once).
void InstallHalideHooks();

void ClearHalideError();

// The last error Halide reported on this thread ("" if none).
std::string LastHalideError();

}  // namespace dnnfusion
