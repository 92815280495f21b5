// The threads behind the kernels' parallel loops: a pool whose workers spin between the blocks of
// a partition instead of sleeping.
//
// Halide's own pool puts an idle worker to sleep on a condition variable at once, so every
// parallel loop pays a wake-up (and the caller a sleep until the last task ends): tens of
// microseconds each on a busy or virtual machine, and a partition runs one or more parallel loops
// per block, dozens per invoke. XNNPACK's pthreadpool spins its workers instead. This pool does the
// same while a partition runs. ParkThreadPool at the end of each Invoke puts them to sleep, so the
// cores are free for TFLite's own kernels (XNNPACK's threads) that run next; after the partition that
// ends the invoke they linger instead, yielding their cores for up to 200 us (as pthreadpool's
// workers spin after XNNPACK's last operator), so that the next invoke finds them awake. A loop's
// tasks are split into one contiguous share per thread, the same rows to the same thread loop after loop (their data
// stays in that core's cache), and a thread that runs out takes tasks from the others' shares.
//
// Every Halide kernel in this library reaches it through halide_do_par_for (InstallThreadPool).
// One parallel loop runs at a time; a nested loop, or one from a second interpreter invoking on
// another thread meanwhile, runs serially on its caller's thread.
#pragma once

namespace dnnfusion {

// Routes halide_do_par_for of the Halide runtime linked into this library to the pool (once).
void InstallThreadPool();

// A live delegate holds the pool; when the last one lets go, its workers are joined (so none runs
// this library's code once the host has destroyed every delegate and may unload it).
void AcquireThreadPool();
void ReleaseThreadPool();

// Threads a parallel loop uses from now on, the calling thread included (TFLite's num_threads).
void SetThreadPoolSize(int threads);

// Workers stop spinning: they sleep until the next parallel loop, or, with `linger`, yield their
// cores until it comes or 200 us have passed since their last loop, then sleep.
void ParkThreadPool(bool linger);

}  // namespace dnnfusion
