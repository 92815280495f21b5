// What one delegate instance (one tflite_plugin_create_delegate call) holds: its options and the
// bundle, read-only after creation, so interpreters may share the delegate.
#pragma once

#include <mutex>
#include <string>

#include "dnnfusion/bundle.h"
#include "options.h"

namespace dnnfusion {

struct DelegateState {
  Options options;
  const Bundle* bundle = nullptr;
  std::mutex report_mutex;  // serialises appends to options.report and options.profile, and last_report
  std::string last_report;  // the JSON line of the last claim (report.h)
  bool report_warned = false;   // a failed append to options.report was said (once)
  bool profile_warned = false;  // the same for options.profile
  int last_node = -1;       // the execution plan's last node when the delegate last claimed
};

}  // namespace dnnfusion
