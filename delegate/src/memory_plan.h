// Memory for tensors internal to a delegated partition: TFLite gives them none (their data
// pointer is NULL at Invoke), so the partition lays them out in one arena of its own, reusing
// bytes between tensors whose lifetimes do not overlap.
#pragma once

#include <cstddef>
#include <vector>

namespace dnnfusion {

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
size_t PlanArena(const std::vector<Lifetime>& tensors, std::vector<size_t>* offsets, size_t alignment = 64);

}  // namespace dnnfusion
