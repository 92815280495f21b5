// The heap Halide's kernels allocate from (a stage computed at the root, a tile's buffer too large
// for the stack): freed blocks are kept per thread and handed out again, so a kernel invoked again
// reuses the pages it touched before. Through malloc, blocks past its mmap/trim thresholds went back
// to the kernel at each free and were faulted in anew at each invoke, and at two threads the page
// faults serialize on the process's page-table lock: an attention block ran no faster than at one.
#pragma once

#include <cstddef>

namespace dnnfusion {

// halide_malloc and halide_free through the cache (InstallHalideHooks routes Halide to them).
void* KernelHeapMalloc(void* user_context, size_t size);
void KernelHeapFree(void* user_context, void* ptr);

// Frees the calling thread's cached blocks (the last delegate is gone).
void TrimKernelHeap();

// Bytes the calling thread holds cached (tests).
size_t KernelHeapCachedBytes();

}  // namespace dnnfusion
