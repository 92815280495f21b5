#include "log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace dnnfusion {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};

const char* const kNames[] = {"silent", "error", "warning", "info", "verbose"};

}  // namespace

bool ParseLogLevel(const char* text, LogLevel* out) {
  for (int i = 0; i < 5; ++i) {
    if (std::strcmp(text, kNames[i]) == 0) {
      *out = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

void Log(LogLevel level, const char* format, ...) {
  if (static_cast<int>(level) > g_level.load() || level == LogLevel::kSilent) return;
  char line[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  std::fprintf(stderr, "dnnfusion: %s: %s\n", kNames[static_cast<int>(level)], line);
}

}  // namespace dnnfusion
