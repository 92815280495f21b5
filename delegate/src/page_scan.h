#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace dnnfusion {

// The read-only mappings of files in this process (a model TFLite mapped from disk), as
// /proc/self/maps listed them when read: only in such a mapping is a page handed back free to read
// again from the page cache, dropping it losing nothing. A model given as a buffer (heap memory)
// lies in none.
class ReadOnlyFileMappings {
 public:
  ReadOnlyFileMappings();
  // Whether [data, data + bytes) lies in one of them.
  bool Contain(const void* data, size_t bytes) const;

 private:
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges_;
};

// Drops the whole pages of [data, data + bytes) from this process (MADV_DONTNEED) when they lie in
// one of `mappings`; does nothing anywhere else. A partial page at either end may hold another
// tensor's data and stays. Whatever reads the pages later maps them again from the page cache.
void DropPages(const ReadOnlyFileMappings& mappings, const void* data, size_t bytes);

// Reads [data, data + bytes) through `visit`, a chunk at a time, stopping where `visit` returns
// false (the result). A scan of a large constant at claim (is every weight finite?) would otherwise
// leave all of it resident, where the kernel reads only part of it (an embedding table a GATHER
// indexes row by row): in a read-only file mapping each chunk's pages are dropped once read
// (DropPages). Anywhere else the scan is a plain read.
bool ScanWithoutKeeping(const uint8_t* data, size_t bytes,
                        const std::function<bool(const uint8_t* chunk, size_t chunk_bytes)>& visit);

}  // namespace dnnfusion
