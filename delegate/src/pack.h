// Packing of constant kernel arguments, done once per partition at Prepare from the weights
// TFLite holds (mirror of halide_gen/pack.py: the two must agree, and the end-to-end tests
// compare every packed kernel's outputs with LiteRT).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "dnnfusion/bundle.h"

namespace dnnfusion {

// Whether `pack` turns a constant into int32 values (kChannelSums, kTapSums, kBlockSums*) instead of
// keeping its type.
bool PacksToInt32(Pack pack);

// Whether `pack` turns a half-precision constant into float32 values (kOBlockedWidened).
bool PacksToFloat32(Pack pack);

// Why the values of a constant (`count` elements of `element_bytes` each) cannot be packed as
// `pack` for the kernels that read it, or "" when they can: kTapSums' kernels add two int8 products
// in int16, which a weight of -128 can overflow.
std::string PackValueProblem(Pack pack, const void* src, size_t count, size_t element_bytes);

// `count` INT4 elements as TFLite stores them (two a byte, the first in the low nibble) into int8.
void UnpackInt4(const uint8_t* packed, size_t count, int8_t* out);

// `count` floats into IEEE half precision, rounded to nearest even as a float -> _Float16 cast
// rounds (and NumPy's astype(float16)), except that a finite value past 65504 saturates at +-65504:
// an attention mask's -3.4e38 times 0 stays 0, not -inf * 0 = NaN. Infinities and NaN stay.
void FloatsToHalves(const float* src, size_t count, uint16_t* dst);

// Writes `src` (TFLite layout, `src_dims`) packed as `pack` into `dst` (`dst_dims`, zero-filled
// padding); `element_bytes` is the size of one element of `src`. Returns false for an unknown
// packing or shapes that do not fit together.
bool PackConstant(Pack pack, const void* src, const int32_t* src_dims, int src_rank, void* dst,
                  const int32_t* dst_dims, int dst_rank, size_t element_bytes);

}  // namespace dnnfusion
