#include "page_scan.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>

namespace dnnfusion {
namespace {

// Constants under two chunks are read plainly: their pages are few, and the checks cost more.
constexpr size_t kScanChunk = size_t{1} << 20;

// Whether [begin, end) lies in one read-only mapping of a file (a model mapped from disk): only there
// is a page handed back free to read again, from the page cache, and dropping it loses nothing. A
// model given as a buffer (heap memory) is never dropped.
bool InReadOnlyFileMapping(uintptr_t begin, uintptr_t end) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return false;
  char line[1024];
  bool file_backed = false;
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long low = 0, high = 0, inode = 0;
    char perms[8] = {0};
    if (std::sscanf(line, "%lx-%lx %7s %*x %*s %lu", &low, &high, perms, &inode) != 4) continue;
    if (begin >= low && end <= high) {
      file_backed = inode != 0 && perms[1] == '-';
      break;
    }
  }
  std::fclose(maps);
  return file_backed;
}

}  // namespace

bool ScanWithoutKeeping(const uint8_t* data, size_t bytes,
                        const std::function<bool(const uint8_t* chunk, size_t chunk_bytes)>& visit) {
  const long page_size = sysconf(_SC_PAGESIZE);
  const auto begin = reinterpret_cast<uintptr_t>(data);
  if (bytes < 2 * kScanChunk || page_size <= 0 || !InReadOnlyFileMapping(begin, begin + bytes)) {
    return visit(data, bytes);
  }
  const auto page = static_cast<uintptr_t>(page_size);
  for (size_t offset = 0; offset < bytes; offset += kScanChunk) {
    const size_t length = bytes - offset < kScanChunk ? bytes - offset : kScanChunk;
    if (!visit(data + offset, length)) return false;
    // The whole pages of this chunk (a partial page at either end of the tensor may hold others' data).
    const uintptr_t first = (begin + offset + page - 1) / page * page;
    const uintptr_t last = (begin + offset + length) / page * page;
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
  return true;
}

}  // namespace dnnfusion
