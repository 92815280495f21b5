// The delegate runtime driven by a fake TFLite host: a hand-built context with a three-node
// graph (t0 -> n0 -> t1 -> n1 -> t2 -> n2 -> t3), a hand-written bundle of three one-node
// blocks whose "kernels" add a constant, and a profiler that records events. It checks what the
// Python end-to-end tests cannot see: one profiler event per block, the arena for tensors
// internal to a partition (one for all of a delegate's partitions), 64-byte-aligned buffers for
// every kernel output and for all memory the partition owns, idempotent prepare, a failing kernel
// reported (not aborting), option parsing with a NULL error reporter, and the memory planner.
//
// Built and run by tests/test_delegate_runtime.py; exits non-zero if any check failed.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "HalideRuntime.h"
#include "check.h"
#include "dnnfusion/bundle.h"
#include "dnnfusion/tflite_abi.h"
#include "memory_plan.h"

extern "C" TfLiteDelegate* tflite_plugin_create_delegate(char**, char**, size_t, void (*)(const char*));
extern "C" void tflite_plugin_destroy_delegate(TfLiteDelegate*);

// ---- the bundle: three blocks, each "t_out = t_in + k" over 4 floats ---------------------------

static std::vector<const void*> g_seen_hosts;  // every host pointer a kernel saw, in order
static bool g_fail_next = false;
static std::function<void()> g_after_next_kernel;  // run (once) inside the next kernel, after it wrote

static int AddKernel(void** args, float k) {
  auto* in = static_cast<halide_buffer_t*>(args[0]);
  auto* out = static_cast<halide_buffer_t*>(args[1]);
  if (g_fail_next) {
    halide_error(nullptr, "simulated kernel failure");
    return -3;
  }
  if (in->dimensions != 2 || in->dim[0].extent != 4 || in->dim[1].extent != 1) return -1;
  g_seen_hosts.push_back(in->host);
  g_seen_hosts.push_back(out->host);
  for (int i = 0; i < 4; ++i) reinterpret_cast<float*>(out->host)[i] = reinterpret_cast<float*>(in->host)[i] + k;
  if (g_after_next_kernel) {
    const std::function<void()> then = std::move(g_after_next_kernel);
    g_after_next_kernel = nullptr;
    then();
  }
  return 0;
}
static int Add1(void** args) { return AddKernel(args, 1.0f); }
static int Add10(void** args) { return AddKernel(args, 10.0f); }
static int Add100(void** args) { return AddKernel(args, 100.0f); }
// The third block's in-place form: the same sum (on one buffer, element by element), counted.
static int g_in_place_runs = 0;
static int Add100InPlace(void** args) {
  ++g_in_place_runs;
  return AddKernel(args, 100.0f);
}

namespace dnnfusion {
namespace {
const int32_t kCodes[] = {0, 0, 0};
const TensorSpec kTensorSpecs[] = {
    {0, kTfLiteFloat32, 2, {1, 4}}, {1, kTfLiteFloat32, 2, {1, 4}},
    {2, kTfLiteFloat32, 2, {1, 4}}, {3, kTfLiteFloat32, 2, {1, 4}}};
const NodeSpec kNodes[] = {{0, 0, 0, 1, 1}, {1, 0, 2, 1, 1}, {2, 0, 4, 1, 1}};
const int32_t kNodeTensors[] = {0, 1, 1, 2, 2, 3};
const ArgSpec kArgs[] = {{0, ArgSource::kComputed, -1, Pack::kNone, 0, 2, {1, 4}},
                         {1, ArgSource::kComputed, -1, Pack::kNone, 0, 2, {1, 4}},
                         {2, ArgSource::kComputed, -1, Pack::kNone, 0, 2, {1, 4}}};
const int32_t kOutputs[] = {1, 2, 3};
const int32_t kInPlace[] = {0, 0};  // the third block's argument 0 may share output 0's memory
const BlockSpec kBlocks[] = {{"first", "s0", Add1, 1, 0, 1, 0, 1, 0, 1},
                             {"second", "s1", Add10, 1, 1, 1, 1, 1, 1, 1},
                             {"third", "s2", Add100, 0, 2, 1, 2, 1, 2, 1, 0, 0, 0, Add100InPlace, 0, 1}};
const GraphSpec kGraphs[] = {{0, "main", 4, 3, kCodes, kTensorSpecs, 4, kNodes, kNodeTensors, kArgs, kOutputs,
                               kBlocks, 3, nullptr, nullptr, kInPlace}};
}  // namespace

const Bundle& bundle() {
  static const Bundle b = {"fake.tflite", "host", "f1ngerprint", 32, kGraphs, 1};
  return b;
}
}  // namespace dnnfusion

// ---- the fake host ----------------------------------------------------------------------------

struct Profiler : tflite::Profiler {
  std::vector<std::string> begun;
  int ended = 0;
  uint32_t BeginEvent(const char* tag, EventType type, int64_t, int64_t) override {
    CHECK(type == EventType::DELEGATE_OPERATOR_INVOKE_EVENT);
    begun.push_back(tag);
    return static_cast<uint32_t>(begun.size());
  }
  void EndEvent(uint32_t, int64_t, int64_t) override { ++ended; }
  void EndEvent(uint32_t) override { ++ended; }
};

TfLiteIntArray* IntArray(std::vector<int> values) {
  auto* a = static_cast<TfLiteIntArray*>(std::malloc(sizeof(int) * (1 + values.size())));
  a->size = static_cast<int>(values.size());
  for (size_t i = 0; i < values.size(); ++i) a->data[i] = values[i];
  return a;
}

struct Host {
  TfLiteContext context{};
  TfLiteTensor tensors[4]{};
  // One 64-byte row per tensor (4 floats used), every row aligned as TFLite's arena aligns tensors.
  alignas(64) float data[4][16] = {{1, 2, 3, 4}, {}, {}, {}};
  TfLiteNode nodes[3]{};
  TfLiteRegistration regs[3]{};
  TfLiteIntArray* plan = IntArray({0, 1, 2});
  TfLiteIntArray* dims = IntArray({1, 4});
  std::string fingerprint = "f1ngerprint";
  // What the delegate asked for.
  TfLiteRegistration kernel{};
  std::vector<int> replaced;
  std::string last_error;
  Profiler profiler;
};
static Host* g_host = nullptr;

static TfLiteStatus GetExecutionPlan(TfLiteContext*, TfLiteIntArray** plan) {
  *plan = g_host->plan;
  return kTfLiteOk;
}
static TfLiteStatus GetNodeAndRegistration(TfLiteContext*, int i, TfLiteNode** node, TfLiteRegistration** reg) {
  if (i < 0 || i > 2) return kTfLiteError;
  *node = &g_host->nodes[i];
  *reg = &g_host->regs[i];
  return kTfLiteOk;
}
static TfLiteStatus Replace(TfLiteContext*, TfLiteRegistration reg, const TfLiteIntArray* nodes, TfLiteDelegate*) {
  g_host->kernel = reg;
  g_host->replaced.assign(nodes->data, nodes->data + nodes->size);
  return kTfLiteOk;
}
static TfLiteStatus GetModelMetadata(const TfLiteContext*, const char* name, const char** ptr, size_t* bytes) {
  if (std::strcmp(name, dnnfusion::kFingerprintMetadata) != 0) return kTfLiteError;
  *ptr = g_host->fingerprint.data();
  *bytes = g_host->fingerprint.size();
  return kTfLiteOk;
}
static void ReportError(TfLiteContext*, const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  g_host->last_error = text;
}

// TFLite's own kernel for every node of the fake graph: its output is its input plus one, at
// the input's shape (what the partition runs after a resize, tflite_fallback.h).
static TfLiteStatus HostPrepare(TfLiteContext* context, TfLiteNode* node) {
  const TfLiteTensor& in = context->tensors[node->inputs->data[0]];
  TfLiteTensor& out = context->tensors[node->outputs->data[0]];
  out.dims = in.dims;
  out.bytes = in.bytes;
  return kTfLiteOk;
}
static TfLiteStatus HostInvoke(TfLiteContext* context, TfLiteNode* node) {
  const TfLiteTensor& in = context->tensors[node->inputs->data[0]];
  TfLiteTensor& out = context->tensors[node->outputs->data[0]];
  if (in.data.raw == nullptr || out.data.raw == nullptr) return kTfLiteError;
  for (size_t i = 0; i < in.bytes / sizeof(float); ++i) out.data.f[i] = in.data.f[i] + 1.0f;
  return kTfLiteOk;
}

static void SetUp(Host& h) {
  g_host = &h;
  for (int t = 0; t < 4; ++t) {
    h.tensors[t].type = kTfLiteFloat32;
    h.tensors[t].dims = h.dims;
    h.tensors[t].bytes = 16;
    h.tensors[t].allocation_type = kTfLiteArenaRw;
    h.tensors[t].name = "t";
  }
  // Tensors 0 and 3 are partition edges (TFLite gives them memory); the others stay NULL, as
  // TFLite leaves tensors internal to a delegated partition.
  h.tensors[0].data.raw = reinterpret_cast<char*>(h.data[0]);
  h.tensors[3].data.raw = reinterpret_cast<char*>(h.data[3]);
  const int io[3][2] = {{0, 1}, {1, 2}, {2, 3}};
  for (int n = 0; n < 3; ++n) {
    h.nodes[n].inputs = IntArray({io[n][0]});
    h.nodes[n].outputs = IntArray({io[n][1]});
    h.regs[n].builtin_code = 0;
    h.regs[n].prepare = HostPrepare;
    h.regs[n].invoke = HostInvoke;
  }
  h.context.tensors_size = 4;
  h.context.tensors = h.tensors;
  h.context.GetExecutionPlan = GetExecutionPlan;
  h.context.GetNodeAndRegistration = GetNodeAndRegistration;
  h.context.ReplaceNodeSubsetsWithDelegateKernels = Replace;
  h.context.GetModelMetadata = GetModelMetadata;
  h.context.ReportError = ReportError;
  h.context.recommended_num_threads = 1;
  h.context.profiler = &h.profiler;
}

static TfLiteDelegate* Create(std::vector<std::pair<const char*, const char*>> options,
                              void (*report)(const char*) = nullptr) {
  std::vector<char*> keys, values;
  for (auto& kv : options) {
    keys.push_back(const_cast<char*>(kv.first));
    values.push_back(const_cast<char*>(kv.second));
  }
  return tflite_plugin_create_delegate(keys.data(), values.data(), options.size(), report);
}

static std::string g_reported;
static void Reporter(const char* message) { g_reported = message; }

int main() {
  // Options: bad ones are refused with a message, through the reporter or, without one, stderr.
  CHECK(Create({{"num_threads", "x"}}, Reporter) == nullptr);
  CHECK(g_reported.find("num_threads") != std::string::npos);
  CHECK(Create({{"colour", "blue"}}) == nullptr);  // NULL report_error: no crash
  CHECK(Create({{"log_level", "loud"}}, Reporter) == nullptr && g_reported.find("log_level") != std::string::npos);

  // claim:all takes the three blocks as one partition; the middle tensors live in its arena.
  {
    Host h;
    SetUp(h);
    TfLiteDelegate* d = Create({{"claim", "all"}, {"num_threads", "2"}, {"log_level", "silent"}});
    CHECK(d != nullptr && d->opaque_delegate_builder == nullptr);
    CHECK(d->Prepare(&h.context, d) == kTfLiteOk);
    CHECK((h.replaced == std::vector<int>{0, 1, 2}));
    CHECK(h.kernel.custom_name != nullptr && std::strcmp(h.kernel.custom_name, "DnnFusion") == 0);
    CHECK(h.kernel.inplace_operator == 0 && h.kernel.async_kernel == nullptr);
    TfLiteDelegateParams params{d, IntArray({0, 1, 2}), IntArray({0}), IntArray({3})};
    TfLiteNode node{};
    node.user_data = h.kernel.init(&h.context, reinterpret_cast<const char*>(&params), 0);
    CHECK(h.kernel.prepare(&h.context, &node) == kTfLiteOk);
    CHECK(h.kernel.prepare(&h.context, &node) == kTfLiteOk);  // TFLite prepares more than once
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    for (int i = 0; i < 4; ++i) CHECK(h.data[3][i] == h.data[0][i] + 111.0f);
    CHECK((h.profiler.begun == std::vector<std::string>{"first", "second", "third"}) && h.profiler.ended == 3);
    // Internal tensors 1 and 2 are in the partition's arena (TFLite gave them none), at
    // different offsets: 1 is read by the block that writes 2.
    CHECK(g_seen_hosts.size() == 6 && g_seen_hosts[0] == h.data[0] && g_seen_hosts[5] == h.data[3]);
    CHECK(g_seen_hosts[1] == g_seen_hosts[2] && g_seen_hosts[3] == g_seen_hosts[4]);
    CHECK(g_seen_hosts[1] != nullptr && g_seen_hosts[1] != g_seen_hosts[3]);
    // Every buffer a kernel writes is 64-byte aligned (Halide reads a block's own outputs with
    // aligned loads): the arena's tensors, and an output whose TFLite memory is not aligned, which
    // the kernel writes to an aligned shadow that is copied over after it.
    for (int i : {1, 3, 5}) CHECK(reinterpret_cast<uintptr_t>(g_seen_hosts[i]) % dnnfusion::kBufferAlignment == 0);
    float* unaligned = h.data[3] + 1;
    h.tensors[3].data.raw = reinterpret_cast<char*>(unaligned);
    g_seen_hosts.clear();
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    for (int i = 0; i < 4; ++i) CHECK(unaligned[i] == h.data[0][i] + 111.0f);
    CHECK(g_seen_hosts.size() == 6 && g_seen_hosts[5] != unaligned);
    CHECK(reinterpret_cast<uintptr_t>(g_seen_hosts[5]) % dnnfusion::kBufferAlignment == 0);
    h.tensors[3].data.raw = reinterpret_cast<char*>(h.data[3]);
    // A failing kernel: kTfLiteError with Halide's message, and the process goes on.
    g_fail_next = true;
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteError);
    CHECK(h.last_error.find("block first failed") != std::string::npos);
    CHECK(h.last_error.find("simulated kernel failure") != std::string::npos);
    g_fail_next = false;
    // A resized input after claiming: the partition runs TFLite's kernels for its nodes (each adds
    // one) at the new shape, with memory of its own for the internal tensors; its blocks again
    // once the shape is back.
    TfLiteIntArray* bigger = IntArray({2, 4});
    h.tensors[0].dims = bigger;
    h.tensors[0].bytes = 32;
    for (int i = 4; i < 8; ++i) h.data[0][i] = static_cast<float>(i);
    CHECK(h.kernel.prepare(&h.context, &node) == kTfLiteOk);
    CHECK(h.tensors[3].dims == bigger && h.tensors[1].data.raw != nullptr && h.tensors[2].data.raw != nullptr);
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    for (int i = 0; i < 8; ++i) CHECK(h.data[3][i] == h.data[0][i] + 3.0f);
    for (int t : {0, 1, 2, 3}) {
      h.tensors[t].dims = h.dims;
      h.tensors[t].bytes = 16;
    }
    CHECK(h.kernel.prepare(&h.context, &node) == kTfLiteOk);
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    for (int i = 0; i < 4; ++i) CHECK(h.data[3][i] == h.data[0][i] + 111.0f);
    h.kernel.free(&h.context, node.user_data);
    tflite_plugin_destroy_delegate(d);
  }

  // Two partitions of one delegate share one arena for their internal tensors (an interpreter runs
  // them one at a time): A = nodes 0-1 keeps t1 inside, B = nodes 1-2 keeps t2. A partition invoked
  // while another holds the arena (interpreters sharing the delegate) uses memory of its own and
  // leaves the holder's tensors intact.
  {
    Host h;
    SetUp(h);
    TfLiteDelegate* d = Create({{"claim", "all"}, {"log_level", "silent"}});
    CHECK(d->Prepare(&h.context, d) == kTfLiteOk);
    h.tensors[1].data.raw = reinterpret_cast<char*>(h.data[1]);  // B's input
    h.tensors[2].data.raw = reinterpret_cast<char*>(h.data[2]);  // A's output
    for (int i = 0; i < 4; ++i) h.data[1][i] = 1000.0f * i;
    TfLiteDelegateParams params_a{d, IntArray({0, 1}), IntArray({0}), IntArray({2})};
    TfLiteDelegateParams params_b{d, IntArray({1, 2}), IntArray({1}), IntArray({3})};
    TfLiteNode a{}, b{};
    a.user_data = h.kernel.init(&h.context, reinterpret_cast<const char*>(&params_a), 0);
    b.user_data = h.kernel.init(&h.context, reinterpret_cast<const char*>(&params_b), 0);
    CHECK(h.kernel.prepare(&h.context, &a) == kTfLiteOk && h.kernel.prepare(&h.context, &b) == kTfLiteOk);
    g_seen_hosts.clear();
    CHECK(h.kernel.invoke(&h.context, &a) == kTfLiteOk && h.kernel.invoke(&h.context, &b) == kTfLiteOk);
    for (int i = 0; i < 4; ++i) CHECK(h.data[2][i] == h.data[0][i] + 11.0f && h.data[3][i] == h.data[1][i] + 110.0f);
    // A's t1 (written by its first kernel) and B's t2 (written by its first) are the same bytes.
    CHECK(g_seen_hosts.size() == 8 && g_seen_hosts[1] == g_seen_hosts[5] && g_seen_hosts[1] != nullptr);
    const void* shared = g_seen_hosts[1];
    // B invoked inside A's first kernel, with t1 in the shared arena: B runs in its own memory.
    std::fill(h.data[2], h.data[2] + 4, 0.0f);
    std::fill(h.data[3], h.data[3] + 4, 0.0f);
    g_seen_hosts.clear();
    g_after_next_kernel = [&] { CHECK(h.kernel.invoke(&h.context, &b) == kTfLiteOk); };
    CHECK(h.kernel.invoke(&h.context, &a) == kTfLiteOk);
    for (int i = 0; i < 4; ++i) CHECK(h.data[2][i] == h.data[0][i] + 11.0f && h.data[3][i] == h.data[1][i] + 110.0f);
    CHECK(g_seen_hosts.size() == 8 && g_seen_hosts[1] == shared && g_seen_hosts[3] != shared);
    CHECK(reinterpret_cast<uintptr_t>(g_seen_hosts[3]) % dnnfusion::kBufferAlignment == 0);
    // ...and takes the shared arena again once it is free.
    g_seen_hosts.clear();
    CHECK(h.kernel.invoke(&h.context, &b) == kTfLiteOk && g_seen_hosts.size() == 4 && g_seen_hosts[1] == shared);
    h.kernel.free(&h.context, a.user_data);
    h.kernel.free(&h.context, b.user_data);
    tflite_plugin_destroy_delegate(d);
  }

  // The default policy leaves the unprofitable block to TFLite; a block list narrows further.
  {
    Host h;
    SetUp(h);
    TfLiteDelegate* d = Create({{"log_level", "silent"}});
    CHECK(d->Prepare(&h.context, d) == kTfLiteOk && (h.replaced == std::vector<int>{0, 1}));
    tflite_plugin_destroy_delegate(d);
    Host h2;
    SetUp(h2);
    d = Create({{"claim", "all"}, {"blocks", "third,first"}, {"log_level", "silent"}});
    CHECK(d->Prepare(&h2.context, d) == kTfLiteOk && (h2.replaced == std::vector<int>{0, 2}));
    tflite_plugin_destroy_delegate(d);
  }

  // A block's in-place form runs where its pair shares memory, bound anew at every invoke; the
  // plain kernel where it does not, and where the input is internal to the partition.
  {
    Host h;
    SetUp(h);
    TfLiteDelegate* d = Create({{"claim", "all"}, {"blocks", "third"}, {"log_level", "silent"}});
    CHECK(d->Prepare(&h.context, d) == kTfLiteOk && (h.replaced == std::vector<int>{2}));
    h.tensors[2].data.raw = reinterpret_cast<char*>(h.data[2]);  // a partition input now
    TfLiteDelegateParams params{d, IntArray({2}), IntArray({2}), IntArray({3})};
    TfLiteNode node{};
    node.user_data = h.kernel.init(&h.context, reinterpret_cast<const char*>(&params), 0);
    CHECK(h.kernel.prepare(&h.context, &node) == kTfLiteOk);
    g_in_place_runs = 0;
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    CHECK(g_in_place_runs == 0 && h.data[3][0] == 100.0f);
    h.tensors[3].data.raw = h.tensors[2].data.raw;  // the caller passes one buffer in and out
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    CHECK(g_in_place_runs == 1 && h.data[2][0] == 100.0f);
    h.tensors[3].data.raw = reinterpret_cast<char*>(h.data[3]);
    CHECK(h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    CHECK(g_in_place_runs == 1 && h.data[3][0] == 200.0f);
    h.kernel.free(&h.context, node.user_data);
    tflite_plugin_destroy_delegate(d);
    Host h2;
    SetUp(h2);
    d = Create({{"claim", "all"}, {"log_level", "silent"}});
    CHECK(d->Prepare(&h2.context, d) == kTfLiteOk && (h2.replaced == std::vector<int>{0, 1, 2}));
    TfLiteDelegateParams all{d, IntArray({0, 1, 2}), IntArray({0}), IntArray({3})};
    TfLiteNode whole{};
    whole.user_data = h2.kernel.init(&h2.context, reinterpret_cast<const char*>(&all), 0);
    CHECK(h2.kernel.prepare(&h2.context, &whole) == kTfLiteOk);
    CHECK(h2.kernel.invoke(&h2.context, &whole) == kTfLiteOk && g_in_place_runs == 1);
    h2.kernel.free(&h2.context, whole.user_data);
    tflite_plugin_destroy_delegate(d);
  }

  // Another model (fingerprint), another graph (node codes), another shape: nothing claimed.
  {
    Host h;
    SetUp(h);
    h.fingerprint = "0ther";
    TfLiteDelegate* d = Create({{"claim", "all"}, {"log_level", "silent"}});
    CHECK(d->Prepare(&h.context, d) == kTfLiteOk && h.replaced.empty());
    Host h2;
    SetUp(h2);
    h2.regs[1].builtin_code = 3;
    CHECK(d->Prepare(&h2.context, d) == kTfLiteOk && h2.replaced.empty());
    Host h3;
    SetUp(h3);
    TfLiteIntArray* other = IntArray({1, 5});
    h3.tensors[2].dims = other;  // blocks "second" (reads 2... writes 2) and "third" decline
    CHECK(d->Prepare(&h3.context, d) == kTfLiteOk && (h3.replaced == std::vector<int>{0}));
    tflite_plugin_destroy_delegate(d);
  }

  // The memory planner: lifetimes that overlap never share bytes; those that do not, reuse.
  {
    using dnnfusion::Lifetime;
    std::vector<Lifetime> t = {{100, 0, 1}, {200, 1, 2}, {100, 2, 3}, {50, 3, 3}, {300, 0, 0}};
    std::vector<size_t> off;
    size_t arena = dnnfusion::PlanArena(t, &off);
    for (size_t i = 0; i < t.size(); ++i) {
      CHECK(off[i] % 64 == 0 && off[i] + t[i].bytes <= arena);
      for (size_t j = 0; j < i; ++j) {
        const bool live_together = t[i].first <= t[j].last && t[j].first <= t[i].last;
        const bool overlap = off[i] < off[j] + t[j].bytes && off[j] < off[i] + t[i].bytes;
        CHECK(!(live_together && overlap));
      }
    }
    size_t sum = 0;
    for (auto& x : t) sum += x.bytes;
    CHECK(arena < sum);  // something was reused
  }

  // Memory the partition owns starts on kBufferAlignment whatever its size (malloc's large
  // blocks start 16 bytes past a page), and keeps its place while its size does not change.
  for (size_t bytes : {size_t{0}, size_t{4}, size_t{100}, size_t{4096}, size_t{1} << 20, size_t{9} << 20}) {
    dnnfusion::AlignedBytes memory;
    CHECK(memory.empty() && memory.data() == nullptr);
    uint8_t* data = memory.Allocate(bytes);
    CHECK(data == memory.data() && memory.size() == bytes && !memory.empty());
    CHECK(reinterpret_cast<uintptr_t>(data) % dnnfusion::kBufferAlignment == 0);
    if (bytes > 0) CHECK(data[0] == 0 && data[bytes - 1] == 0);
    if (bytes > 0) data[0] = 7;
    CHECK(memory.Allocate(bytes) == data && (bytes == 0 || data[0] == 7));
  }

  // A host that destroys the delegate before freeing its partition (a Python process's teardown
  // finalizes the delegate and the interpreter in no fixed order): the partition still writes its
  // profile, to the path it was given, when it is freed.
  {
    char path[] = "/tmp/dnnfusion-profile-XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    Host h;
    SetUp(h);
    TfLiteDelegate* d = Create({{"claim", "all"}, {"log_level", "silent"}, {"profile", path}});
    CHECK(d->Prepare(&h.context, d) == kTfLiteOk);
    TfLiteDelegateParams params{d, IntArray({0, 1, 2}), IntArray({0}), IntArray({3})};
    TfLiteNode node{};
    node.user_data = h.kernel.init(&h.context, reinterpret_cast<const char*>(&params), 0);
    CHECK(h.kernel.prepare(&h.context, &node) == kTfLiteOk && h.kernel.invoke(&h.context, &node) == kTfLiteOk);
    tflite_plugin_destroy_delegate(d);
    h.kernel.free(&h.context, node.user_data);
    std::ifstream written(path);
    std::stringstream text;
    text << written.rdbuf();
    CHECK(text.str().find("{\"block\": \"first\"") != std::string::npos);
    std::remove(path);
  }

  if (g_failures == 0) std::printf("fake host: all checks passed\n");
  return g_failures == 0 ? 0 : 1;
}
