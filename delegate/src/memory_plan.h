// Memory for tensors internal to a delegated partition: TFLite gives them none (their data
// pointer is NULL at Invoke), so the partition lays them out in an arena, reusing bytes between
// tensors whose lifetimes do not overlap; the partitions of a delegate share one arena.
#pragma once

#include <atomic>
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

// The arena every partition of one delegate instance uses for its internal tensors. An interpreter
// runs its partitions one after another and their internal tensors live only while one runs, so the
// largest partition's arena serves them all, where arenas of their own would add up across the
// partitions a model splits into (XNNPACK's partitions share one workspace alike). Interpreters that
// share the delegate may invoke at once: a partition that finds the arena taken uses its own memory.
class SharedArena {
 public:
  // A partition's arena needs `bytes`: the arena is sized for the largest when next acquired.
  void Require(size_t bytes) {
    size_t seen = required_.load(std::memory_order_relaxed);
    while (seen < bytes && !required_.compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
    }
  }
  // The arena, at least `bytes` long, until Release; null when another partition holds it.
  uint8_t* TryAcquire(size_t bytes) {
    bool taken = false;
    if (!busy_.compare_exchange_strong(taken, true, std::memory_order_acquire)) return nullptr;
    Require(bytes);
    const size_t size = required_.load(std::memory_order_relaxed);
    if (memory_.size() < size) {
      memory_ = AlignedBytes();  // the old memory goes before the new comes: no peak of both
      memory_.Allocate(size);
    }
    return memory_.data();
  }
  void Release() { busy_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> busy_{false};
  std::atomic<size_t> required_{0};
  AlignedBytes memory_;
};

// A partition's hold on its arena for one invoke: the shared arena when free, else `own`.
class ArenaLease {
 public:
  ArenaLease(SharedArena& shared, size_t bytes, AlignedBytes& own) : shared_(shared) {
    if (bytes == 0) return;  // no internal tensors: the shared arena stays free for others
    data_ = shared.TryAcquire(bytes);
    held_ = data_ != nullptr;
    if (!held_) data_ = own.Allocate(bytes);
  }
  ~ArenaLease() {
    if (held_) shared_.Release();
  }
  ArenaLease(const ArenaLease&) = delete;
  ArenaLease& operator=(const ArenaLease&) = delete;
  uint8_t* data() const { return data_; }

 private:
  SharedArena& shared_;
  uint8_t* data_ = nullptr;
  bool held_ = false;
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
