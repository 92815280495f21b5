#include "thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "HalideRuntime.h"
#include "denormals.h"
#include "log.h"

namespace dnnfusion {
namespace {

using Clock = std::chrono::steady_clock;

// How long an unparked worker spins for the next loop before it sleeps: far longer than the gap
// between two parallel loops of a partition (a serial stage or the delegate's bookkeeping, a few
// microseconds), and short enough that a worker left unparked (a partition that failed midway)
// gives its core back soon.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield");
#endif
}

int RunSerially(void* user_context, halide_task_t task, int min, int size, uint8_t* closure) {
  for (int i = min; i < min + size; ++i) {
    if (int result = task(user_context, i, closure)) return result;
  }
  return 0;
}

// A thread's share of a loop: tasks [begin, end) in one word, so that its owner (from the front) and
// a thread that has run out (from the back) each claim a task with one compare-and-swap, on a cache
// line of its own.
struct alignas(64) Share {
  std::atomic<uint64_t> bounds{0};
};

inline uint64_t Bounds(uint32_t begin, uint32_t end) { return uint64_t{end} << 32 | begin; }

// One parallel loop: tasks [min, min + size), split into one contiguous share per thread, as
// pthreadpool splits XNNPACK's. The same rows then go to the same thread in loop after loop, so a block
// mostly reads what its own core wrote in the block before (claimed from one shared counter, a small
// 2-thread block read half its input from the other core's cache and ran slower than on one), and a
// thread that finishes early takes tasks from the backs of the others' shares.
struct Loop {
  halide_task_t task;
  void* user_context;
  uint8_t* closure;
  int min, size;
  Share* shares;
  int threads;
  alignas(64) std::atomic<int> finished{0};
  std::atomic<int> error{0};

  void Run(int self) {
    int done = 0;
    for (int k = 0; k < threads; ++k) {
      const bool own = k == 0;
      std::atomic<uint64_t>& bounds = shares[(self + k) % threads].bounds;
      for (uint64_t b = bounds.load(std::memory_order_relaxed);;) {
        const uint32_t begin = static_cast<uint32_t>(b), end = static_cast<uint32_t>(b >> 32);
        if (begin >= end) break;
        const uint32_t claimed = own ? begin : end - 1;
        if (!bounds.compare_exchange_weak(b, own ? Bounds(begin + 1, end) : Bounds(begin, end - 1),
                                          std::memory_order_relaxed)) {
          continue;  // b reloaded
        }
        RunTask(static_cast<int>(claimed));
        ++done;
        b = bounds.load(std::memory_order_relaxed);
      }
    }
    if (done > 0) finished.fetch_add(done, std::memory_order_release);  // publishes the tasks' writes
  }

  void RunTask(int i) {
    if (error.load(std::memory_order_relaxed) != 0) return;  // skip the rest once a task failed
    if (int result = task(user_context, min + i, closure)) {
      int none = 0;
      error.compare_exchange_strong(none, result);  // the first failure is the one reported
    }
  }
};

class Pool {
 public:
  ~Pool() { Resize(1); }

  int ParallelFor(void* user_context, halide_task_t task, int min, int size, uint8_t* closure) {
    // Nested loops (a task's own parallel loop) and a second caller meanwhile run serially.
    if (size <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
      return RunSerially(user_context, task, min, size, closure);
    }
    if (workers_.empty()) {
      busy_.store(false, std::memory_order_release);
      return RunSerially(user_context, task, min, size, closure);
    }
    const int threads = static_cast<int>(workers_.size()) + 1;
    for (int t = 0; t < threads; ++t) {
      shares_[t].bounds.store(Bounds(static_cast<uint32_t>(int64_t{size} * t / threads),
                                     static_cast<uint32_t>(int64_t{size} * (t + 1) / threads)),
                              std::memory_order_relaxed);
    }
    Loop loop{task, user_context, closure, min, size, shares_.get(), threads};
    parked_.store(false, std::memory_order_relaxed);
    loop_.store(&loop, std::memory_order_seq_cst);  // publishes the shares too
    Wake();
    loop.Run(0);
    for (int spins = 0; loop.finished.load(std::memory_order_acquire) < size; ++spins) {
      // A worker's task is still running; yield if it was descheduled rather than spin on its core.
      if (spins < (1 << 14)) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
    }
    // A worker may still hold `loop` (it found no task left): it lives on this stack until none does.
    loop_.store(nullptr, std::memory_order_seq_cst);
    while (visiting_.load(std::memory_order_seq_cst) != 0) CpuRelax();
    busy_.store(false, std::memory_order_release);
    return loop.error.load(std::memory_order_relaxed);
  }

  // Sets the workers to `threads` - 1 (the caller of a loop is the last thread).
  void Resize(int threads) {
    while (busy_.exchange(true, std::memory_order_acquire)) std::this_thread::yield();
    const size_t want = threads > 1 ? static_cast<size_t>(threads - 1) : 0;
    if (want != workers_.size()) {
      StopWorkers();
      shares_.reset(new Share[want + 1]);
      try {
        const uint64_t now = generation_.load(std::memory_order_acquire);
        while (workers_.size() < want) {
          const int self = static_cast<int>(workers_.size()) + 1;  // the loop's caller is thread 0
          workers_.emplace_back([this, now, self] { Work(now, self); });
        }
      } catch (const std::system_error& e) {
        Log(LogLevel::kWarning, "started %zu of %zu worker threads (%s): parallel loops use fewer", workers_.size(),
            want, e.what());
      }
    }
    busy_.store(false, std::memory_order_release);
  }

  void Park(bool linger) {
    lingering_.store(linger, std::memory_order_relaxed);
    parked_.store(true, std::memory_order_relaxed);
  }

 private:
  // Starts waiting workers on a new generation: the spinning ones see it, the sleeping ones are woken.
  void Wake() {
    generation_.fetch_add(1, std::memory_order_seq_cst);
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    if (sleepers_ > 0) wake_.notify_all();
  }

  void StopWorkers() {
    stop_.store(true, std::memory_order_seq_cst);
    Wake();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    stop_.store(false, std::memory_order_seq_cst);
  }

  // `seen`: the generation when the worker was started (one it reads itself may already be a stop's);
  // `self`: its share of every loop.
  void Work(uint64_t seen, int self) {
    const ScopedDenormalsAsZero denormals_as_zero;  // as the partition's own thread runs its kernels
    for (;;) {
      if (!SpinFor(seen)) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        ++sleepers_;
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(); });
        --sleepers_;
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_seq_cst)) return;
      // Announce the visit before looking: the loop's owner then waits for it before it returns
      // (both seq_cst, so either the owner sees this count or this thread sees no loop).
      visiting_.fetch_add(1, std::memory_order_seq_cst);
      if (Loop* loop = loop_.load(std::memory_order_seq_cst)) loop->Run(self);
      visiting_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // Waits for the generation to move past `seen` (true) until kSpin has passed since this worker's
  // last loop (false): spinning while a partition runs. Once the pool is parked it sleeps at once,
  // or, parked lingering, yields its core between two checks: what runs next (the app, or TFLite
  // between two invokes) gets the core, and the next invoke still finds the worker awake.
  bool SpinFor(uint64_t seen) {
    const Clock::time_point deadline = Clock::now() + kSpin;
    for (unsigned i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen) return true;
      const bool parked = parked_.load(std::memory_order_relaxed);
      if (parked && !lingering_.load(std::memory_order_relaxed)) return false;
      if ((parked || i % 256 == 0) && Clock::now() > deadline) return false;
      if (parked) {
        std::this_thread::yield();
      } else {
        CpuRelax();
      }
    }
  }

  std::atomic<bool> busy_{false};  // a loop (or a resize) is in progress; guards workers_
  std::vector<std::thread> workers_;
  std::unique_ptr<Share[]> shares_{new Share[1]};  // one per thread, the caller's first
  std::atomic<Loop*> loop_{nullptr};
  std::atomic<int> visiting_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> parked_{true};
  std::atomic<bool> lingering_{false};  // parked, but yielding until kSpin passes instead of sleeping
  std::atomic<bool> stop_{false};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  int sleepers_ = 0;  // guarded by sleep_mutex_
};

Pool& ThePool() {
  static Pool pool;  // destroyed (workers joined) when the library unloads or the process exits
  return pool;
}

int DoParFor(void* user_context, halide_task_t task, int min, int size, uint8_t* closure) {
  return ThePool().ParallelFor(user_context, task, min, size, closure);
}

std::mutex g_users_mutex;
int g_users = 0;      // live delegates
int g_threads = -1;   // the size last asked for (-1: none yet)

}  // namespace

void InstallThreadPool() {
  static std::once_flag once;
  std::call_once(once, [] { halide_set_custom_do_par_for(DoParFor); });
}

void AcquireThreadPool() {
  std::lock_guard<std::mutex> lock(g_users_mutex);
  ++g_users;
}

void ReleaseThreadPool() {
  std::lock_guard<std::mutex> lock(g_users_mutex);
  if (--g_users == 0) {
    ThePool().Resize(1);
    g_threads = -1;
  }
}

void SetThreadPoolSize(int threads) {
  std::lock_guard<std::mutex> lock(g_users_mutex);
  if (threads == g_threads) return;
  g_threads = threads;
  ThePool().Resize(threads);
  // Halide's own pool stays behind halide_do_parallel_tasks (kernels with async stages).
  halide_set_num_threads(threads);
}

void ParkThreadPool(bool linger) { ThePool().Park(linger); }

}  // namespace dnnfusion
