// The heap the kernels allocate from (src/kernel_heap.cc), through halide_malloc / halide_free as
// the kernels call them: blocks aligned as Halide needs, a freed block handed out again for the same
// size (and for a smaller one down to half of it), small blocks left to malloc, what a thread holds
// kept within the most it had in use, the cache bounded, blocks of many threads at once (parallel
// loops' tiles), and the cache emptied by a trim. Built with
// ThreadSanitizer where the compiler has it.
//
// Built and run by tests/test_delegate_runtime.py; exits non-zero if any check failed.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "HalideRuntime.h"
#include "check.h"
#include "halide_hooks.h"
#include "kernel_heap.h"

namespace {

bool Aligned(void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

// Allocates, writes every byte and frees blocks of a few sizes, `rounds` times: true when each
// block was aligned and, after the first round, every one the cache takes came from it.
bool Churn(int rounds) {
  const size_t sizes[] = {300000, 1 << 20, 70000, 2 << 20};
  std::vector<void*> first;
  bool ok = true;
  for (int round = 0; round < rounds; ++round) {
    std::vector<void*> blocks;
    for (size_t size : sizes) {
      void* p = halide_malloc(nullptr, size);
      ok = ok && p != nullptr && Aligned(p);
      if (p != nullptr) std::memset(p, round, size);
      blocks.push_back(p);
    }
    if (round == 0) {
      first = blocks;
    } else {
      for (void* p : blocks) {
        bool reused = false;
        for (void* q : first) reused = reused || p == q;
        ok = ok && reused;
      }
    }
    for (void* p : blocks) halide_free(nullptr, p);
  }
  return ok;
}

}  // namespace

int main() {
  using namespace dnnfusion;
  constexpr size_t kMiB = size_t{1} << 20;
  InstallHalideHooks();
  CHECK(KernelHeapCachedBytes() == 0);
  void* a = halide_malloc(nullptr, kMiB);
  CHECK(a != nullptr && Aligned(a));
  halide_free(nullptr, a);
  CHECK(KernelHeapCachedBytes() == kMiB);
  CHECK(halide_malloc(nullptr, kMiB) == a);  // the same block for the same size
  halide_free(nullptr, a);
  CHECK(halide_malloc(nullptr, 600 << 10) == a);  // and for one over half its size
  halide_free(nullptr, a);
  void* small = halide_malloc(nullptr, 1000);  // small blocks are malloc's: the cache keeps its own
  CHECK(small != nullptr && Aligned(small) && KernelHeapCachedBytes() == kMiB);
  halide_free(nullptr, small);
  CHECK(KernelHeapCachedBytes() == kMiB);
  // A larger block than any cached: the cached one is freed first (held bytes stay within the
  // most ever in use), and the larger one is cached in turn.
  void* b = halide_malloc(nullptr, 3 * kMiB);
  CHECK(b != nullptr && KernelHeapCachedBytes() == 0);
  std::memset(b, 1, 3 * kMiB);
  halide_free(nullptr, b);
  CHECK(KernelHeapCachedBytes() == 3 * kMiB);
  void* c = halide_malloc(nullptr, kMiB);  // under half of it: a block of its own, within the peak
  CHECK(c != nullptr && KernelHeapCachedBytes() == 0);
  halide_free(nullptr, c);
  // The cache is bounded: freeing far more than it keeps leaves it under its bound.
  std::vector<void*> many;
  for (int k = 0; k < 200; ++k) many.push_back(halide_malloc(nullptr, kMiB));
  for (void* p : many) halide_free(nullptr, p);
  CHECK(KernelHeapCachedBytes() <= 64 * kMiB);
  TrimKernelHeap();
  CHECK(KernelHeapCachedBytes() == 0);
  // Threads allocate and free at once, each from its own cache.
  std::vector<std::thread> threads;
  std::vector<char> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&ok, t] { ok[t] = Churn(200); });
  }
  for (std::thread& t : threads) t.join();
  for (char each : ok) CHECK(each);
  CHECK(Churn(3));
  if (g_failures == 0) std::printf("all checks passed\n");
  return g_failures == 0 ? 0 : 1;
}
