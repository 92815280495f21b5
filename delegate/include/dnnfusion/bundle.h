// The kernel bundle: a table, generated per model and target by `tflite_tools fuse`
// (halide_gen/bundle.py), describing every fused block the library can run — which graph nodes
// it replaces, which tensors its Halide kernel reads and writes (with their types and shapes),
// and the kernel's entry point through Halide's argv interface.
//
// The runtime never trusts the table: at Prepare it checks each block against the graph TFLite
// hands it and claims only the blocks that match (claim.cc).
#pragma once

#include <cstdint>

#include "dnnfusion/bundle_abi.h"  // the table's enums and structs, generated from halide_gen/bundle_abi.py

namespace dnnfusion {

// Defined by the generated bundle source linked into each delegate library.
const Bundle& bundle();

// The metadata entry of a fused model that carries Bundle::fingerprint.
constexpr const char* kFingerprintMetadata = "dnnfusion.fingerprint";

}  // namespace dnnfusion
