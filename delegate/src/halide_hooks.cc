#include "halide_hooks.h"

#include <mutex>

#include "HalideRuntime.h"
#include "kernel_heap.h"
#include "log.h"

namespace dnnfusion {
namespace {

thread_local std::string t_last_error;

void OnError(void* /*user_context*/, const char* message) {
  t_last_error = message ? message : "unknown Halide error";
  Log(LogLevel::kVerbose, "halide: %s", t_last_error.c_str());
}

void OnPrint(void* /*user_context*/, const char* message) { Log(LogLevel::kVerbose, "halide: %s", message); }

}  // namespace

void InstallHalideHooks() {
  static std::once_flag once;
  std::call_once(once, [] {
    halide_set_error_handler(OnError);
    halide_set_custom_print(OnPrint);
    halide_set_custom_malloc(KernelHeapMalloc);
    halide_set_custom_free(KernelHeapFree);
  });
}

void ClearHalideError() { t_last_error.clear(); }

std::string LastHalideError() { return t_last_error.empty() ? "no message" : t_last_error; }

}  // namespace dnnfusion
