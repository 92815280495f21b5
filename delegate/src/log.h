// Delegate logging: one line per message, filtered by the log_level option — on stderr prefixed
// "dnnfusion: <level>:", on Android in logcat with tag "dnnfusion" and the level as its priority.
// Messages about a failing Invoke also go to TFLite's error reporter (context->ReportError).
#pragma once

namespace dnnfusion {

enum class LogLevel { kSilent = 0, kError = 1, kWarning = 2, kInfo = 3, kVerbose = 4 };

bool ParseLogLevel(const char* text, LogLevel* out);

// The process-wide level: the most verbose of the live delegates' levels.
void SetLogLevel(LogLevel level);

void Log(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace dnnfusion
