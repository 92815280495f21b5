#include "log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#if defined(__ANDROID__)
#include <android/log.h>
#endif

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
#if defined(__ANDROID__)
  // An app's stderr goes nowhere: logcat is where Android developers look (`adb logcat -s dnnfusion`).
  static const int kPriorities[] = {ANDROID_LOG_SILENT, ANDROID_LOG_ERROR, ANDROID_LOG_WARN, ANDROID_LOG_INFO,
                                    ANDROID_LOG_VERBOSE};
  __android_log_print(kPriorities[static_cast<int>(level)], "dnnfusion", "%s", line);
#else
  std::fprintf(stderr, "dnnfusion: %s: %s\n", kNames[static_cast<int>(level)], line);
#endif
}

}  // namespace dnnfusion
