// Packing of constant kernel arguments, done once per partition at Prepare from the weights
// TFLite holds (mirror of halide_gen/pack.py: the two must agree, and the end-to-end tests
// compare every packed kernel's outputs with LiteRT).
#pragma once

#include <cstddef>
#include <cstdint>

#include "dnnfusion/bundle.h"

namespace dnnfusion {

// Writes `src` (TFLite layout, `src_dims`) packed as `pack` into `dst` (`dst_dims`, zero-filled
// padding). Returns false for an unknown packing or shapes that do not fit together.
bool PackConstant(Pack pack, const void* src, const int32_t* src_dims, int src_rank, void* dst,
                  const int32_t* dst_dims, int dst_rank, size_t element_bytes);

}  // namespace dnnfusion
