// Memory for tensors internal to a delegated partition: TFLite gives them none (their data
// pointer is NULL at Invoke), so the partition lays them out in one arena of its own, reusing
// bytes between tensors whose lifetimes do not overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dnnfusion {

// Every buffer a kernel writes starts at a multiple of this many bytes (an AVX-512 vector, a cache
// line). Halide compiles a block's reads of its own output (a HARD_SWISH that the block's MEAN
// also reads) as aligned vector loads, as it does reads of memory it allocated itself: a
// LayerNorm block faulted on a 16-byte-aligned arena.
constexpr size_t kBufferAlignment = 64;

// `p` rounded up to the next multiple of kBufferAlignment.
inline uint8_t* Aligned(uint8_t* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  return p + ((kBufferAlignment - address % kBufferAlignment) % kBufferAlignment);
}

// Memory the partition owns (its arena, packed weights, shadows of unaligned outputs): `size()`
// bytes from a multiple of kBufferAlignment. Allocated as a std::vector alone it would start where
// malloc puts it, 16 bytes past a page for large sizes: every AVX-512 load of a packed weight
// would then span two cache lines.
class AlignedBytes {
 public:
  // `size` zeroed bytes, aligned; the same memory, its content kept, when the size is unchanged.
  uint8_t* Allocate(size_t size) {
    if (storage_.empty() || size != size_) {
      storage_.assign(size + kBufferAlignment, 0);
      size_ = size;
    }
    return data();
  }
  uint8_t* data() { return storage_.empty() ? nullptr : Aligned(storage_.data()); }
  size_t size() const { return size_; }
  bool empty() const { return storage_.empty(); }  // never allocated

 private:
  std::vector<uint8_t> storage_;
  size_t size_ = 0;
};

// A tensor's size and the steps (block positions in the partition) from its producer to its
// last consumer, inclusive.
struct Lifetime {
  size_t bytes;
  int first;
  int last;
};

// Greedy by size (TFLite's own arena strategy): the largest tensor first, each at the lowest
// offset that no tensor alive at the same time overlaps. Writes one offset per tensor, aligned to
// `alignment`, and returns the arena size.
size_t PlanArena(const std::vector<Lifetime>& tensors, std::vector<size_t>* offsets,
                 size_t alignment = kBufferAlignment);

}  // namespace dnnfusion
