// The external-delegate plugin: the two symbols this library exports (everything else is
// hidden by exports.map), the delegate's Prepare that claims blocks, and the registration of
// the kernel that runs a partition.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "HalideRuntime.h"
#include "claim.h"
#include "cpu_caps.h"
#include "delegate_state.h"
#include "dnnfusion/bundle.h"
#include "dnnfusion/tflite_abi.h"
#include "gpu_caps.h"
#include "halide_hooks.h"
#include "kernel_heap.h"
#include "log.h"
#include "options.h"
#include "partition.h"
#include "report.h"
#include "thread_pool.h"

namespace dnnfusion {
namespace {

DelegateState* StateOf(TfLiteDelegate* delegate) { return static_cast<DelegateState*>(delegate->data_); }

void* PartitionInit(TfLiteContext* context, const char* buffer, size_t /*length*/) {
  const auto* params = reinterpret_cast<const TfLiteDelegateParams*>(buffer);
  return new (std::nothrow) Partition(context, *StateOf(params->delegate), *params);
}

void PartitionFree(TfLiteContext* /*context*/, void* buffer) { delete static_cast<Partition*>(buffer); }

TfLiteStatus PartitionPrepare(TfLiteContext* context, TfLiteNode* node) {
  if (node->user_data == nullptr) {
    context->ReportError(context, "dnnfusion: out of memory creating a partition");
    return kTfLiteError;
  }
  return static_cast<Partition*>(node->user_data)->Prepare(context);
}

TfLiteStatus PartitionInvoke(TfLiteContext* context, TfLiteNode* node) {
  return static_cast<Partition*>(node->user_data)->Invoke(context);
}

TfLiteRegistration PartitionRegistration() {
  TfLiteRegistration reg;
  // Zero every byte, padding and fields newer than we know included: the registration is passed
  // by value and the interpreter reads fields such as inplace_operator.
  std::memset(&reg, 0, sizeof(reg));
  reg.init = PartitionInit;
  reg.free = PartitionFree;
  reg.prepare = PartitionPrepare;
  reg.invoke = PartitionInvoke;
  reg.builtin_code = kBuiltinCustom;  // what every delegate kernel reports
  reg.custom_name = "DnnFusion";
  reg.version = 1;
  return reg;
}

// TFLite undoes a delegation (a resize of a graph that delegates made immutable) without clearing
// the tensors it marked as each delegate's. When the delegates then claim other nodes than before
// (a block declined at the new shapes goes to XNNPACK, or comes back from it), a claim of a node
// writing a tensor marked for another delegate is refused and the model cannot be prepared at all.
// With no delegated node left in the plan every mark is stale; cleared, claims set them again.
void ClearStaleMarks(TfLiteContext* context) {
  TfLiteIntArray* plan = nullptr;
  if (context->GetExecutionPlan == nullptr || context->GetExecutionPlan(context, &plan) != kTfLiteOk) return;
  for (int i = 0; i < plan->size; ++i) {
    TfLiteNode* node = nullptr;
    TfLiteRegistration* reg = nullptr;
    if (context->GetNodeAndRegistration(context, plan->data[i], &node, &reg) != kTfLiteOk) return;
    if (node->delegate != nullptr) return;
  }
  for (size_t t = 0; t < context->tensors_size; ++t) context->tensors[t].delegate = nullptr;
}

TfLiteStatus DelegatePrepare(TfLiteContext* context, TfLiteDelegate* delegate) {
  DelegateState& state = *StateOf(delegate);
  ClearStaleMarks(context);
  if (!state.options.claim_given) {
    state.options.claim = DefaultClaim(*state.bundle, KernelThreads(state.options, context->recommended_num_threads),
                                       state.options.claim);
  }
  Claim claim = ClaimBlocks(context, *state.bundle, state.options);
  KeepBlocksWhole(context, &claim);
  LogClaim(claim, state.options.claim);
  RecordReport(state, claim);
  if (claim.nodes.empty()) return kTfLiteOk;
  state.SetGraph(context, claim.graph);
  TfLiteIntArray* plan = nullptr;  // the partitions made next read it: does one end the invoke?
  const bool planned = context->GetExecutionPlan != nullptr && context->GetExecutionPlan(context, &plan) == kTfLiteOk;
  state.last_node = planned && plan != nullptr && plan->size > 0 ? plan->data[plan->size - 1] : -1;
  TfLiteIntArray* nodes = static_cast<TfLiteIntArray*>(std::malloc(sizeof(int) * (1 + claim.nodes.size())));
  if (nodes == nullptr) return kTfLiteOk;  // decline everything rather than fail the interpreter
  nodes->size = static_cast<int>(claim.nodes.size());
  std::copy(claim.nodes.begin(), claim.nodes.end(), nodes->data);
  const TfLiteStatus status =
      context->ReplaceNodeSubsetsWithDelegateKernels(context, PartitionRegistration(), nodes, delegate);
  std::free(nodes);
  return status;
}

// blocks=NAME,...: a name this bundle does not have would silently claim nothing.
bool KnownBlocks(const Bundle& bundle, const std::vector<std::string>& names, std::string* error) {
  for (const std::string& name : names) {
    bool found = false;
    std::string known;
    for (int g = 0; g < bundle.n_graphs; ++g) {
      for (int b = 0; b < bundle.graphs[g].n_blocks; ++b) {
        found = found || name == bundle.graphs[g].blocks[b].name;
        known += std::string(known.empty() ? "" : ", ") + bundle.graphs[g].blocks[b].name;
      }
    }
    if (found) continue;
    *error = "blocks: no block '" + name + "' in this bundle (its blocks: " + (known.empty() ? "none" : known) + ")";
    return false;
  }
  return true;
}

// Why creation fails, to the caller's reporter; benchmark_model's external_delegate.cc may pass
// none: then to the log (stderr, or logcat on Android).
void ReportCreationError(void (*report_error)(const char*), const std::string& error) {
  const std::string message = "dnnfusion: " + error;
  if (report_error != nullptr) {
    report_error(message.c_str());
  } else {
    Log(LogLevel::kError, "%s", error.c_str());
  }
}

}  // namespace
}  // namespace dnnfusion

extern "C" {

__attribute__((visibility("default"))) TfLiteDelegate* tflite_plugin_create_delegate(
    char** options_keys, char** options_values, size_t num_options, void (*report_error)(const char*)) {
  using namespace dnnfusion;
  auto* state = new (std::nothrow) DelegateState();
  auto* delegate = static_cast<TfLiteDelegate*>(std::calloc(1, sizeof(TfLiteDelegate)));
  std::string error;
  if (state == nullptr || delegate == nullptr) {
    error = "out of memory";
  } else if (!ParseOptions(options_keys, options_values, num_options, &state->options, &error) ||
             !KnownBlocks(bundle(), state->options.blocks, &error)) {
    error = "bad delegate option: " + error;
  }
  if (!error.empty()) {
    ReportCreationError(report_error, error);
    delete state;
    std::free(delegate);
    return nullptr;
  }
  SetLogLevel(state->options.log_level);
  InstallHalideHooks();
  InstallCpuFeatureCheck();
  InstallThreadPool();
  AcquireThreadPool();
  state->bundle = &bundle();
  if (!state->options.claim_given) {
    // One thread's default until Prepare knows the interpreter's thread count.
    state->options.claim = DefaultClaim(*state->bundle, 1, state->options.claim);
  }
  const bool vulkan = state->bundle->gpu_api == kVulkan;
  if (vulkan) {
    // Halide's Vulkan allocator rounds regions to 32 bytes by default; where nonCoherentAtomSize is 64
    // (Mesa lavapipe) copies then lose a buffer's last partial block. The bundle carries the settings
    // that fix it (halide_gen/aot.py: VULKAN_ALLOC_CONFIG), unless the environment says otherwise; read
    // when the first kernel creates the Vulkan context.
    setenv("HL_VK_ALLOC_CONFIG", state->bundle->vulkan_alloc_config, /*overwrite=*/0);
  }
  if (state->options.require_device) {  // after the Halide hooks: a failing device must not abort
    std::string problem = CpuProblem(*state->bundle);
    if (problem.empty()) problem = GpuDeviceProblem(*state->bundle);
    if (!problem.empty()) {
      ReportCreationError(report_error, "this device cannot run the kernels (require_device): " + problem);
      delete state;
      std::free(delegate);
      ReleaseThreadPool();
      return nullptr;
    }
  }
  if (state->bundle->gpu_api != kNoGpu) {
    // Template kernels take their scratch from the partition (ScratchSpec), allocated once. What
    // a kernel still allocates itself (an autoscheduled one's intermediates; on Vulkan, staging
    // buffers and scratch under 64 bytes) is then handed back to the API runtime's cache where it
    // keeps one (Vulkan's block allocator), released with the partition; Halide's OpenCL runtime has
    // no such cache.
    halide_reuse_device_allocations(nullptr, true);
  }
  delegate->data_ = state;
  delegate->Prepare = DelegatePrepare;
  // Without AllowDynamicTensors TFLite prepares every node before it lets this delegate claim any,
  // and refuses the delegate outright where a tensor is sized only as the model runs (a RANGE to a
  // computed limit), or where a custom op that only a delegate applied after user delegates can
  // run (XNNPACK claims MediaPipe's Convolution2DTransposeBias) is "unresolved": a model that ran in
  // stock LiteRT would no longer load. The flag skips that early preparation (the bundle holds no
  // kernel for an op touching such a tensor: fusion/ecg.py). It also keeps the graph mutable, so a
  // later resize_tensor_input re-prepares our kernels instead of re-running the claim: a partition
  // then runs the kernels compiled for the new shapes, or TFLite's own for its nodes (partition.h).
  // Models without run-time shapes keep TFLite's re-claim on resize, which picks the graph compiled
  // for the new shapes, or declines and leaves the nodes to TFLite.
  delegate->flags =
      state->bundle->allow_dynamic_tensors ? kTfLiteDelegateFlagsAllowDynamicTensors : kTfLiteDelegateFlagsNone;
  int blocks = 0;
  for (int g = 0; g < state->bundle->n_graphs; ++g) blocks += state->bundle->graphs[g].n_blocks;
  Log(LogLevel::kInfo, "loaded the kernel bundle for %s (%s, %d blocks in %d subgraphs), claim:%s",
      state->bundle->model, state->bundle->target, blocks, state->bundle->n_graphs,
      ClaimPolicyName(state->options.claim));
  return delegate;
}

__attribute__((visibility("default"))) void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) {
  if (delegate == nullptr) return;
  dnnfusion::Release(static_cast<dnnfusion::DelegateState*>(delegate->data_));  // partitions may outlive it
  std::free(delegate);
  dnnfusion::ReleaseThreadPool();
  dnnfusion::TrimKernelHeap();
}

}  // extern "C"
