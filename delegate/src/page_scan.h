#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace dnnfusion {

// Reads [data, data + bytes) through `visit`, a chunk at a time, stopping where `visit` returns
// false (the result). A scan of a large constant at claim (is every weight finite?) would otherwise
// leave all of it resident, where the kernel reads only part of it (an embedding table a GATHER
// indexes row by row). Where the data lies in a read-only mapping of a file (a model mapped from
// disk), each chunk's pages are dropped from this process once read (MADV_DONTNEED): the page cache
// keeps them, and whatever reads them later maps them again. Anywhere else the scan is a plain read.
bool ScanWithoutKeeping(const uint8_t* data, size_t bytes,
                        const std::function<bool(const uint8_t* chunk, size_t chunk_bytes)>& visit);

}  // namespace dnnfusion
