// What a bundle's CPU kernels need of the processor they run on, checked before anything is
// claimed: code built for ARMv8.2's dot-product instructions would stop the app with SIGILL on an
// ARMv8.0 core (Cortex-A53), so there the delegate declines every node instead.
#pragma once

#include <string>

#include "dnnfusion/bundle.h"

namespace dnnfusion {

// Empty when this CPU runs the bundle's kernels; else why not, in one line.
std::string CpuProblem(const Bundle& bundle);

}  // namespace dnnfusion
