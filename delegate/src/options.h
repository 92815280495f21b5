// Delegate options: what `load_delegate(path, options={...})` and benchmark_model's
// `--external_delegate_options=key:value;key:value` pass to tflite_plugin_create_delegate.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "dnnfusion/bundle_abi.h"  // ClaimPolicy
#include "log.h"

namespace dnnfusion {

struct Options {
  int num_threads = 0;  // Halide's thread pool size; 0 = the interpreter's recommendation
  LogLevel log_level = LogLevel::kWarning;
  ClaimPolicy claim = ClaimPolicy::kProfitable;
  bool claim_given = false;  // false: the bundle's default policy applies
  std::string report;   // when set, each Prepare writes its claims and declines here as JSON
  std::string profile;  // when set, each partition appends its blocks' invoke times here as JSON
  std::vector<std::string> blocks;  // when set, claim only these blocks (by name): for bisecting
  // Creation fails when this device cannot run the kernels (CPU features, the GPU API): an app asks
  // before it adds the delegate (DnnFusionDelegate.deviceProblem) instead of learning at Prepare.
  bool require_device = false;
};

// Parses key/value pairs into `out`. Unknown keys and bad values fail with a message that names
// the key and lists what is accepted.
bool ParseOptions(const char* const* keys, const char* const* values, size_t count, Options* out,
                  std::string* error);

const char* ClaimPolicyName(ClaimPolicy policy);

// Threads the kernels run on: the num_threads option, else the interpreter's `recommended` count
// (TfLiteContext::recommended_num_threads), else one.
int KernelThreads(const Options& options, int recommended);

// The bundle's default claim policy at `threads` threads (`fuse --measure` times the policies at
// one thread and at two: a block faster alone at one thread may split the partitions two threads
// share), or `fallback` where the bundle holds no valid one.
ClaimPolicy DefaultClaim(const Bundle& bundle, int threads, ClaimPolicy fallback);

}  // namespace dnnfusion
