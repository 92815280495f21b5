// What a bundle's CPU kernels need of the processor they run on, checked before anything is
// claimed: code built for ARMv8.2's dot-product instructions would stop the app with SIGILL on an
// ARMv8.0 core (Cortex-A53), so there the delegate declines every node instead. On x86, Halide's
// runtime picks among the host library's builds per CPU; InstallCpuFeatureCheck keeps each build to
// the vendor its code is for.
#pragma once

#include <string>

#include "dnnfusion/bundle.h"

namespace dnnfusion {

// Routes the choice among a multitarget library's x86 builds to a check that also knows which
// vendor's CPU each build's code is for (once, before any kernel runs).
void InstallCpuFeatureCheck();

// Empty when this CPU runs the bundle's kernels; else why not, in one line.
std::string CpuProblem(const Bundle& bundle);

}  // namespace dnnfusion
