#include "pack.h"

#include <cstring>
#include <vector>

namespace dnnfusion {
namespace {

size_t Product(const int32_t* dims, int rank) {
  size_t n = 1;
  for (int i = 0; i < rank; ++i) n *= static_cast<size_t>(dims[i]);
  return n;
}

// [O, mid, depth] -> [O_padded / tile, mid, groups, tile, 4]: each output channel's 4 consecutive
// inputs together, as one dot-product lane sums them (zeros past `depth`, up to groups * 4). One
// tile of all the output channels (tile = O_padded) is the unblocked [mid, groups, O_padded, 4].
bool PackDot4(const uint8_t* src, size_t o_count, size_t mid, size_t depth, uint8_t* dst, const int32_t* dst_dims,
              int dst_rank, size_t bytes, bool blocked) {
  if (dst_rank < 3 || dst_dims[dst_rank - 1] != 4) return false;
  const size_t groups = dst_dims[dst_rank - 3], tile = dst_dims[dst_rank - 2];
  const size_t tiles = blocked ? dst_dims[0] : 1;
  const size_t mid_dims = Product(dst_dims + (blocked ? 1 : 0), dst_rank - 3 - (blocked ? 1 : 0));
  if (tile == 0 || tiles * tile < o_count || groups * 4 < depth || mid_dims != mid) return false;
  for (size_t o = 0; o < o_count; ++o) {
    for (size_t m = 0; m < mid; ++m) {
      for (size_t i = 0; i < depth; ++i) {
        const size_t at = ((((o / tile) * mid + m) * groups + i / 4) * tile + o % tile) * 4 + i % 4;
        std::memcpy(dst + at * bytes, src + ((o * mid + m) * depth + i) * bytes, bytes);
      }
    }
  }
  return true;
}

// [pre, O, post] -> [O_padded / tile, pre, post, tile]: each tile of output channels' weights in one
// run, from a filter whose output channel is not its outermost axis.
bool PackOBlocked(const uint8_t* src, const int32_t* src_dims, int src_rank, int o_axis, uint8_t* dst,
                  const int32_t* dst_dims, int dst_rank, size_t bytes) {
  if (dst_rank != src_rank + 1 || o_axis < 0 || o_axis >= src_rank) return false;
  const size_t tile = dst_dims[dst_rank - 1], o_count = src_dims[o_axis];
  const size_t pre = Product(src_dims, o_axis), post = Product(src_dims + o_axis + 1, src_rank - o_axis - 1);
  if (tile == 0 || static_cast<size_t>(dst_dims[0]) * tile < o_count) return false;
  for (size_t a = 0; a < pre; ++a) {
    for (size_t o = 0; o < o_count; ++o) {
      for (size_t b = 0; b < post; ++b) {
        const size_t at = (((o / tile) * pre + a) * post + b) * tile + o % tile;
        std::memcpy(dst + at * bytes, src + ((a * o_count + o) * post + b) * bytes, bytes);
      }
    }
  }
  return true;
}

}  // namespace

void UnpackInt4(const uint8_t* packed, size_t count, int8_t* out) {
  for (size_t i = 0; i < count; ++i) {
    const int nibble = (packed[i / 2] >> (i % 2 ? 4 : 0)) & 0x0F;
    out[i] = static_cast<int8_t>(nibble > 7 ? nibble - 16 : nibble);
  }
}

namespace {

uint16_t HalfOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u) {  // inf, or NaN kept quiet with its top payload bits
    return sign | 0x7C00u | (magnitude > 0x7F800000u ? 0x200u | ((magnitude >> 13) & 0x3FFu) : 0u);
  }
  if (magnitude >= 0x477FF000u) return sign | 0x7BFFu;  // a finite value that rounds past 65504: saturates
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), rounded to nearest even
    const uint32_t shift = 126u - (magnitude >> 23);  // significand >> shift counts units of 2^-24
    if (shift > 24u) return sign;
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t kept = significand >> shift, rest = significand & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    return sign | static_cast<uint16_t>(kept + (rest > half || (rest == half && (kept & 1u))));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a carry
  // into the exponent is the correct rounding up.
  const uint32_t rebased = magnitude - (112u << 23);
  const uint32_t kept = rebased >> 13, rest = rebased & 0x1FFFu;
  return sign | static_cast<uint16_t>(kept + (rest > 0x1000u || (rest == 0x1000u && (kept & 1u))));
}

}  // namespace

void FloatsToHalves(const float* src, size_t count, uint16_t* dst) {
  for (size_t i = 0; i < count; ++i) dst[i] = HalfOf(src[i]);
}

// The block size of a kBlockSums packing, else 0.
size_t SummedBlock(Pack pack) {
  switch (pack) {
    case Pack::kBlockSums32: return 32;
    case Pack::kBlockSums64: return 64;
    case Pack::kBlockSums128: return 128;
    case Pack::kBlockSums256: return 256;
    default: return 0;
  }
}

bool PacksToInt32(Pack pack) { return pack == Pack::kChannelSums || pack == Pack::kTapSums || SummedBlock(pack) != 0; }

bool PacksToFloat32(Pack pack) { return pack == Pack::kOBlockedWidened; }

namespace {

float FloatOfHalf(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1Fu, significand = half & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (significand << 13);  // inf, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (significand << 13);
  } else if (significand == 0) {
    bits = sign;
  } else {  // subnormal: normalized into float's range
    int shift = 0;
    uint32_t s = significand;
    while (!(s & 0x400u)) {
      s <<= 1;
      ++shift;
    }
    bits = sign | ((113u - shift) << 23) | ((s & 0x3FFu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

std::string PackValueProblem(Pack pack, const void* src, size_t count, size_t element_bytes) {
  if (pack != Pack::kTapSums) return "";
  if (element_bytes != 1) return "depthwise tap sums need int8 weights";
  const auto* weights = static_cast<const int8_t*>(src);
  for (size_t i = 0; i < count; ++i) {
    if (weights[i] == -128) return "int8 depthwise weights hold -128 (the kernel sums two products in int16)";
  }
  return "";
}

bool PackConstant(Pack pack, const void* src, const int32_t* src_dims, int src_rank, void* dst,
                  const int32_t* dst_dims, int dst_rank, size_t bytes) {
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  const size_t out_bytes = PacksToInt32(pack) || PacksToFloat32(pack) ? sizeof(int32_t) : bytes;
  std::memset(out, 0, Product(dst_dims, dst_rank) * out_bytes);
  switch (pack) {
    case Pack::kPadChannels: {  // [..., C] -> [..., C_padded]
      if (src_rank != dst_rank || src_rank == 0 || dst_dims[dst_rank - 1] < src_dims[src_rank - 1]) return false;
      const size_t c = src_dims[src_rank - 1], cp = dst_dims[dst_rank - 1];
      const size_t rows = Product(src_dims, src_rank - 1);
      for (size_t r = 0; r < rows; ++r) std::memcpy(out + r * cp * bytes, in + r * c * bytes, c * bytes);
      return true;
    }
    case Pack::kOBlocked:  // [O, rest...] -> [O_padded / T, rest..., T]
      return PackOBlocked(in, src_dims, src_rank, 0, out, dst_dims, dst_rank, bytes);
    case Pack::kOLastBlocked:  // [rest..., O] -> [O_padded / T, rest..., T]
      return PackOBlocked(in, src_dims, src_rank, src_rank - 1, out, dst_dims, dst_rank, bytes);
    case Pack::kOBeforeLastBlocked:  // [rest..., O, I] -> [O_padded / T, rest..., I, T]
      return PackOBlocked(in, src_dims, src_rank, src_rank - 2, out, dst_dims, dst_rank, bytes);
    case Pack::kDot4:  // [O, mid..., I] -> [mid..., I/4, O_padded, 4]
      if (src_rank < 2 || dst_rank != src_rank + 1 || src_dims[src_rank - 1] % 4 != 0) return false;
      return PackDot4(in, src_dims[0], Product(src_dims + 1, src_rank - 2), src_dims[src_rank - 1], out, dst_dims,
                      dst_rank, bytes, false);
    case Pack::kDot4Blocked:  // [O, mid..., I] -> [O_padded / T, mid..., I/4, T, 4]
      if (src_rank < 2 || dst_rank != src_rank + 2 || src_dims[src_rank - 1] % 4 != 0) return false;
      return PackDot4(in, src_dims[0], Product(src_dims + 1, src_rank - 2), src_dims[src_rank - 1], out, dst_dims,
                      dst_rank, bytes, true);
    case Pack::kDot4Rows:  // [O, kh, kw, I] -> [kh, ceil(kw*I/4), O_padded, 4]
      if (src_rank != 4 || dst_rank != 4) return false;
      return PackDot4(in, src_dims[0], src_dims[1], static_cast<size_t>(src_dims[2]) * src_dims[3], out, dst_dims,
                      dst_rank, bytes, false);
    case Pack::kChannelSums: {  // int8 [O, ...] -> int32 [O_padded]
      if (bytes != 1 || dst_rank != 1 || src_rank == 0 || dst_dims[0] < src_dims[0]) return false;
      const size_t per_channel = Product(src_dims + 1, src_rank - 1);
      auto* sums = reinterpret_cast<int32_t*>(out);
      const auto* weights = reinterpret_cast<const int8_t*>(in);
      for (size_t o = 0; o < static_cast<size_t>(src_dims[0]); ++o) {
        int32_t total = 0;
        for (size_t k = 0; k < per_channel; ++k) total += weights[o * per_channel + k];
        sums[o] = total;
      }
      return true;
    }
    case Pack::kTapSums: {  // int8 depthwise [1, kh, kw, C] -> int32 [C_padded]
      if (bytes != 1 || dst_rank != 1 || src_rank == 0 || dst_dims[0] < src_dims[src_rank - 1]) return false;
      const size_t channels = src_dims[src_rank - 1], taps = Product(src_dims, src_rank - 1);
      if (!PackValueProblem(pack, in, channels * taps, bytes).empty()) return false;
      auto* sums = reinterpret_cast<int32_t*>(out);
      const auto* weights = reinterpret_cast<const int8_t*>(in);
      for (size_t t = 0; t < taps; ++t) {
        for (size_t c = 0; c < channels; ++c) sums[c] += weights[t * channels + c];
      }
      return true;
    }
    case Pack::kBlockSums32:
    case Pack::kBlockSums64:
    case Pack::kBlockSums128:
    case Pack::kBlockSums256: {  // int8 [O, I] -> int32 [O_padded / T, I / block, T]
      const size_t block = SummedBlock(pack);
      if (bytes != 1 || src_rank != 2 || dst_rank != 3 || src_dims[1] % block != 0) return false;
      const size_t o_count = src_dims[0], depth = src_dims[1], blocks = depth / block, tile = dst_dims[2];
      if (static_cast<size_t>(dst_dims[1]) != blocks || tile == 0 || dst_dims[0] * tile < o_count) return false;
      auto* sums = reinterpret_cast<int32_t*>(out);
      const auto* weights = reinterpret_cast<const int8_t*>(in);
      for (size_t o = 0; o < o_count; ++o) {
        for (size_t b = 0; b < blocks; ++b) {
          int32_t total = 0;
          for (size_t k = 0; k < block; ++k) total += weights[o * depth + b * block + k];
          sums[((o / tile) * blocks + b) * tile + o % tile] = total;
        }
      }
      return true;
    }
    case Pack::kOBlockedWidened: {  // fp16 [O, rest...] -> float32 [O_padded / T, rest..., T]
      if (bytes != sizeof(uint16_t)) return false;
      const size_t count = Product(src_dims, src_rank);
      std::vector<float> wide(count);
      for (size_t i = 0; i < count; ++i) {
        uint16_t half;
        std::memcpy(&half, in + i * sizeof(half), sizeof(half));
        wide[i] = FloatOfHalf(half);
      }
      return PackOBlocked(reinterpret_cast<const uint8_t*>(wide.data()), src_dims, src_rank, 0, out, dst_dims,
                          dst_rank, sizeof(float));
    }
    case Pack::kNone:
      break;
  }
  return false;
}

}  // namespace dnnfusion
