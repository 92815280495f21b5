#include "page_scan.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>

namespace dnnfusion {
namespace {

// Constants under two chunks are scanned plainly: their pages are few, and reading the mappings
// costs more.
constexpr size_t kScanChunk = size_t{1} << 20;

}  // namespace

ReadOnlyFileMappings::ReadOnlyFileMappings() {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return;
  char line[1024];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long low = 0, high = 0, inode = 0;
    char perms[8] = {0};
    if (std::sscanf(line, "%lx-%lx %7s %*x %*s %lu", &low, &high, perms, &inode) != 4) continue;
    if (inode != 0 && perms[1] == '-') ranges_.emplace_back(low, high);
  }
  std::fclose(maps);
}

bool ReadOnlyFileMappings::Contain(const void* data, size_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  for (const auto& range : ranges_) {
    if (begin >= range.first && begin + bytes <= range.second) return true;
  }
  return false;
}

void DropPages(const ReadOnlyFileMappings& mappings, const void* data, size_t bytes) {
  const long page_size = sysconf(_SC_PAGESIZE);
  if (page_size <= 0 || bytes == 0 || !mappings.Contain(data, bytes)) return;
  const auto page = static_cast<uintptr_t>(page_size);
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + bytes) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

bool ScanWithoutKeeping(const uint8_t* data, size_t bytes,
                        const std::function<bool(const uint8_t* chunk, size_t chunk_bytes)>& visit) {
  if (bytes < 2 * kScanChunk) return visit(data, bytes);
  const ReadOnlyFileMappings mappings;
  if (!mappings.Contain(data, bytes)) return visit(data, bytes);
  for (size_t offset = 0; offset < bytes; offset += kScanChunk) {
    const size_t length = bytes - offset < kScanChunk ? bytes - offset : kScanChunk;
    if (!visit(data + offset, length)) return false;
    DropPages(mappings, data + offset, length);
  }
  return true;
}

}  // namespace dnnfusion
