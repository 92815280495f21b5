#include "memory_plan.h"

#include <algorithm>
#include <numeric>

namespace dnnfusion {

size_t PlanArena(const std::vector<Lifetime>& tensors, std::vector<size_t>* offsets, size_t alignment) {
  const size_t n = tensors.size();
  offsets->assign(n, 0);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].bytes > tensors[b].bytes; });

  std::vector<size_t> placed;  // indices already given an offset
  size_t arena = 0;
  for (size_t i : order) {
    const Lifetime& t = tensors[i];
    // The placed tensors alive while `t` is, by offset: `t` goes into the first gap that fits.
    std::vector<size_t> live;
    for (size_t j : placed) {
      if (tensors[j].first <= t.last && t.first <= tensors[j].last) live.push_back(j);
    }
    std::sort(live.begin(), live.end(), [&](size_t a, size_t b) { return (*offsets)[a] < (*offsets)[b]; });
    size_t offset = 0;
    for (size_t j : live) {
      if ((*offsets)[j] >= offset + t.bytes) break;
      offset = std::max(offset, (*offsets)[j] + tensors[j].bytes);
      offset = (offset + alignment - 1) / alignment * alignment;
    }
    (*offsets)[i] = offset;
    arena = std::max(arena, offset + t.bytes);
    placed.push_back(i);
  }
  return (arena + alignment - 1) / alignment * alignment;
}

}  // namespace dnnfusion
