#include "kernel_heap.h"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "HalideRuntime.h"

namespace dnnfusion {
namespace {

// A header before each block holds its capacity; its size keeps the block as aligned as
// halide_default_malloc's (64 bytes on x86, 32 on ARM).
constexpr size_t kHeader = 128;
// What one thread keeps cached at most, and the largest block it keeps: a bound on what the
// delegate holds between invokes beyond what it held during one.
constexpr size_t kCacheBytes = size_t{64} << 20;
constexpr size_t kCacheBlocks = 64;
// Smaller blocks come from malloc's own heap, which keeps their pages.
constexpr size_t kSmallest = size_t{64} << 10;

struct Block {
  size_t capacity;
  void* base;
};

// One thread's freed blocks. Halide frees a block on the thread that allocated it (allocations are
// scoped to a loop body), so no lock is needed. What the thread holds, in use and cached, stays
// within the most it ever had in use: a miss first frees cached blocks that would pass it.
struct Cache {
  std::vector<Block> blocks;  // oldest first
  size_t bytes = 0;           // cached
  size_t live = 0;            // handed out, by capacity
  size_t peak = 0;            // the most ever live

  ~Cache() { Clear(); }

  void Clear() {
    for (const Block& b : blocks) halide_default_free(nullptr, b.base);
    blocks.clear();
    bytes = 0;
  }
};

thread_local Cache t_cache;

// The block's capacity written before it: what halide_free finds there.
void* Header(void* base, size_t capacity) {
  if (base == nullptr) return nullptr;
  *static_cast<size_t*>(base) = capacity;
  return static_cast<char*>(base) + kHeader;
}

}  // namespace

// A small block from malloc; else the smallest cached block that holds `size` bytes without wasting
// more than half of itself; else a new one, once the cached blocks that would take the thread past
// its peak are freed.
void* KernelHeapMalloc(void* user_context, size_t size) {
  if (size < kSmallest) return Header(halide_default_malloc(user_context, size + kHeader), size);
  Cache& cache = t_cache;
  size_t best = cache.blocks.size();
  for (size_t i = 0; i < cache.blocks.size(); ++i) {
    const size_t capacity = cache.blocks[i].capacity;
    if (capacity >= size && capacity / 2 <= size &&
        (best == cache.blocks.size() || capacity < cache.blocks[best].capacity)) {
      best = i;
    }
  }
  if (best < cache.blocks.size()) {
    const Block b = cache.blocks[best];
    cache.blocks.erase(cache.blocks.begin() + static_cast<std::ptrdiff_t>(best));
    cache.bytes -= b.capacity;
    cache.live += b.capacity;
    return static_cast<char*>(b.base) + kHeader;
  }
  while (!cache.blocks.empty() && cache.live + cache.bytes + size > cache.peak) {
    halide_default_free(user_context, cache.blocks.front().base);
    cache.bytes -= cache.blocks.front().capacity;
    cache.blocks.erase(cache.blocks.begin());
  }
  void* ptr = Header(halide_default_malloc(user_context, size + kHeader), size);
  if (ptr == nullptr) return nullptr;
  cache.live += size;
  if (cache.live > cache.peak) cache.peak = cache.live;
  return ptr;
}

void KernelHeapFree(void* user_context, void* ptr) {
  if (ptr == nullptr) return;
  void* base = static_cast<char*>(ptr) - kHeader;
  const size_t capacity = *static_cast<size_t*>(base);
  if (capacity < kSmallest) {
    halide_default_free(user_context, base);
    return;
  }
  Cache& cache = t_cache;
  cache.live -= capacity < cache.live ? capacity : cache.live;  // a block of another thread's
  if (cache.bytes + capacity > kCacheBytes || cache.blocks.size() >= kCacheBlocks) {
    halide_default_free(user_context, base);
    return;
  }
  cache.blocks.push_back({capacity, base});
  cache.bytes += capacity;
}

void TrimKernelHeap() { t_cache.Clear(); }

size_t KernelHeapCachedBytes() { return t_cache.bytes; }

}  // namespace dnnfusion
