// What a GPU bundle needs of the device it lands on, checked before anything is claimed: a device
// of its API that opens (no driver, no ICD: every kernel would fail), and for a bundle built with
// `--gpu-precision fp16`, half-precision storage, which an OpenCL device without cl_khr_fp16 (or a
// Vulkan device without shaderFloat16 and 16-bit storage buffers) cannot compile. Declining up
// front keeps those nodes with TFLite instead of failing the first invoke.
#pragma once

#include <string>

#include "dnnfusion/bundle.h"

namespace dnnfusion {

// "" when the device can run the bundle's kernels (or the bundle needs nothing special), else why
// not. Creates the GPU context through the Halide runtime, as the first kernel would.
std::string GpuDeviceProblem(const Bundle& bundle);

}  // namespace dnnfusion
