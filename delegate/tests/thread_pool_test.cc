// The delegate's thread pool (src/thread_pool.cc) under stress, through halide_do_par_for as the
// kernels call it: every task runs exactly once per loop, at every pool size, parked or spinning,
// with nested loops (run serially), a failing task's error returned, loops from two threads at
// once (one of them serially), and resizes between loops. Built with ThreadSanitizer where the
// compiler has it.
//
// Built and run by tests/test_delegate_runtime.py; exits non-zero if any check failed.
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "HalideRuntime.h"
#include "check.h"
#include "thread_pool.h"

namespace {

struct Counts {
  std::vector<std::atomic<int>> hits;
  int fail_at = -1;  // a task index that returns an error
  bool nest = false;  // each task runs a parallel loop of its own
  explicit Counts(int n) : hits(n) {}
};

int Inner(void*, int i, uint8_t* closure) {
  reinterpret_cast<Counts*>(closure)->hits[i]++;
  return 0;
}

int Task(void* user_context, int i, uint8_t* closure) {
  auto* counts = reinterpret_cast<Counts*>(closure);
  counts->hits[i]++;
  if (counts->nest) {
    Counts inner(4);
    if (halide_do_par_for(user_context, Inner, 0, 4, reinterpret_cast<uint8_t*>(&inner)) != 0) return -2;
    for (auto& h : inner.hits) {
      if (h.load() != 1) return -3;
    }
  }
  return i == counts->fail_at ? -1 : 0;
}

// One loop of `size` tasks from `min`: true when each ran once and the result is as expected.
bool RunLoop(int min, int size, bool nest = false, int fail_at = -1) {
  Counts counts(min + size);
  counts.nest = nest;
  counts.fail_at = fail_at;
  const int result = halide_do_par_for(nullptr, Task, min, size, reinterpret_cast<uint8_t*>(&counts));
  if (fail_at >= 0) return result == -1;  // later tasks may be skipped once one failed
  bool ok = result == 0;
  for (int i = 0; i < min + size; ++i) ok = ok && counts.hits[i].load() == (i >= min ? 1 : 0);
  return ok;
}

}  // namespace

int main() {
  using namespace dnnfusion;
  InstallThreadPool();
  AcquireThreadPool();
  for (int threads : {1, 2, 3, 4, 8}) {
    SetThreadPoolSize(threads);
    for (int round = 0; round < 2000; ++round) {
      CHECK(RunLoop(round % 3, 1 + round % 37));
      // The next loop wakes sleeping workers, or finds lingering ones awake (some lingering ones
      // will have given up and slept by then: both ways in one run).
      if (round % 7 == 0) ParkThreadPool(/*linger=*/round % 2 == 0);
    }
    CHECK(RunLoop(0, 16, /*nest=*/true));
    CHECK(RunLoop(0, 64, false, /*fail_at=*/5));
    CHECK(RunLoop(0, 64));  // a failure leaves the pool usable
    ParkThreadPool(/*linger=*/true);
  }
  // Two threads start loops at once: one gets the pool, the other runs its loop serially.
  SetThreadPoolSize(3);
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t) {
    callers.emplace_back([&bad] {
      for (int round = 0; round < 1000; ++round) {
        if (!RunLoop(0, 1 + round % 23)) bad++;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(bad.load() == 0);
  ParkThreadPool(/*linger=*/true);
  ReleaseThreadPool();  // joins the workers, lingering ones too
  CHECK(RunLoop(0, 8));  // with no workers, loops still run (serially)
  if (g_failures == 0) std::printf("all checks passed\n");
  return g_failures == 0 ? 0 : 1;
}
