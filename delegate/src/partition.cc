#include "partition.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "claim.h"
#include "denormals.h"
#include "halide_hooks.h"
#include "log.h"
#include "memory_plan.h"
#include "pack.h"
#include "page_scan.h"
#include "report.h"
#include "thread_pool.h"

namespace dnnfusion {
namespace {

bool HalideType(int tflite_type, halide_type_t* out) {
  switch (tflite_type) {
    case kTfLiteFloat32: *out = halide_type_t(halide_type_float, 32); return true;
    case kTfLiteFloat16: *out = halide_type_t(halide_type_float, 16); return true;
    case kTfLiteInt32: *out = halide_type_t(halide_type_int, 32); return true;
    case kTfLiteInt64: *out = halide_type_t(halide_type_int, 64); return true;
    case kTfLiteInt16: *out = halide_type_t(halide_type_int, 16); return true;
    case kTfLiteInt8: *out = halide_type_t(halide_type_int, 8); return true;
    case kTfLiteUInt8: *out = halide_type_t(halide_type_uint, 8); return true;
    case kTfLiteBool: *out = halide_type_t(halide_type_uint, 8); return true;  // kernels store BOOL as u8
    case kTfLiteInt4: *out = halide_type_t(halide_type_int, 8); return true;   // unpacked (PackWeight)
    default: return false;
  }
}

// Halide's innermost dimension first: TFLite [d0, ..., dn-1] is Halide (dn-1, ..., d0), dense.
std::vector<halide_dimension_t> HalideDims(int rank, const int32_t* dims) {
  std::vector<halide_dimension_t> out(rank);
  int32_t stride = 1;
  for (int k = 0; k < rank; ++k) {
    out[k] = halide_dimension_t(0, dims[rank - 1 - k], stride);
    stride *= dims[rank - 1 - k];
  }
  return out;
}

// The first index in `raw` outside its bounds (innermost position k: [0, bounds[k % n_bounds])), as
// "got <index> for a dimension of <bound>"; empty when all are inside. Indices a GPU block wrote
// earlier in the partition are copied back first (the only copy inside a partition, and only where
// indices are computed on the device).
std::string IndexOutOfBounds(halide_buffer_t& raw, const int32_t* bounds, int n_bounds) {
  if (halide_copy_to_host(nullptr, &raw) != 0) return "cannot read the indices on the host";
  const size_t count = raw.size_in_bytes() / raw.type.bytes();
  for (size_t k = 0; k < count; ++k) {
    int64_t index = 0;
    switch (raw.type.bits) {
      case 16: index = reinterpret_cast<const int16_t*>(raw.host)[k]; break;
      case 32: index = reinterpret_cast<const int32_t*>(raw.host)[k]; break;
      default: index = reinterpret_cast<const int64_t*>(raw.host)[k]; break;
    }
    const int32_t bound = bounds[k % n_bounds];
    if (index < 0 || index >= bound) {
      return "got " + std::to_string(index) + " for a dimension of " + std::to_string(bound);
    }
  }
  return "";
}

}  // namespace

Partition::Partition(TfLiteContext* context, DelegateState& state, const TfLiteDelegateParams& params)
    : state_(Hold(state)), graph_(state.GraphOf(context)) {
  if (graph_ == nullptr) {
    error_ = "the delegate claimed no graph in this subgraph";
    return;
  }
  const GraphSpec& graph = *graph_;
  nodes_.assign(params.nodes_to_replace->data, params.nodes_to_replace->data + params.nodes_to_replace->size);
  outputs_.assign(params.output_tensors->data, params.output_tensors->data + params.output_tensors->size);
  const std::set<int> mine(nodes_.begin(), nodes_.end());
  ends_invoke_ = mine.count(state.last_node) > 0;
  // Blocks are claimed whole, so each lies wholly inside one partition; bundle order is an
  // execution order.
  for (int b = 0; b < graph.n_blocks; ++b) {
    const BlockSpec& block = graph.blocks[b];
    int inside = 0;
    for (int k = 0; k < block.n_nodes; ++k) inside += mine.count(graph.nodes[block.first_node + k].index);
    if (inside == block.n_nodes) {
      Step step;
      step.block = b;
      steps_.push_back(std::move(step));
    } else if (inside > 0) {
      error_ = std::string("block ") + block.name + " was split across delegate partitions";
    }
  }
  // The other nodes must decode blocks' stored weights (claim.h): TFLite's kernels run them.
  std::set<int> in_blocks;
  for (const Step& s : steps_) {
    const BlockSpec& block = graph.blocks[s.block];
    for (int k = 0; k < block.n_nodes; ++k) in_blocks.insert(graph.nodes[block.first_node + k].index);
  }
  std::vector<int> decoders;
  for (int n : nodes_) {
    TfLiteNode* node = nullptr;
    TfLiteRegistration* registration = nullptr;
    const bool found = context->GetNodeAndRegistration(context, n, &node, &registration) == kTfLiteOk;
    if (found && registration->builtin_code == kBuiltinCustom && custom_op_.empty()) {
      custom_op_ = registration->custom_name != nullptr ? registration->custom_name : "?";
    }
    if (in_blocks.count(n)) continue;
    if (found && (registration->builtin_code == kBuiltinDensify || registration->builtin_code == kBuiltinDequantize)) {
      decoders.push_back(n);
    } else if (error_.empty()) {
      error_ = "the partition holds node " + std::to_string(n) + ", of no bundle block";
    }
  }
  if (error_.empty()) error_ = decoders_.Capture(context, decoders, outputs_, /*persistent_outputs=*/true);
  if (error_.empty()) error_ = fallback_.Capture(context, nodes_, outputs_);
}

Partition::~Partition() {
  if (!state_.options.profile.empty()) WriteProfile();
  FreeDeviceMemory();
  Release(&state_);
}

void Partition::FreeDeviceMemory() {
  // Device allocations made by GPU kernels belong to the buffers; free them with the partition.
  for (Buffer& b : buffers_) {
    if (b.raw.device != 0 && b.raw.device_interface != nullptr) halide_device_free(nullptr, &b.raw);
  }
  // ...and what the device allocation cache kept of them and of the kernels' scratch (plugin.cc):
  // turning reuse off releases every unused allocation; it is turned back on for the others.
  if (halide_can_reuse_device_allocations(nullptr)) {
    halide_reuse_device_allocations(nullptr, false);
    halide_reuse_device_allocations(nullptr, true);
  }
}

void Partition::WriteProfile() const {
  // One JSON line per block: what `tflite_tools bench` and people read to find the slow blocks
  // in the model's own context (TFLite's op profiler is not reachable from Python).
  std::string text;
  for (const Step& step : steps_) {
    if (step.calls == 0) continue;
    char line[512];
    std::snprintf(line, sizeof(line), "{\"block\": \"%s\", \"calls\": %lld, \"total_us\": %.3f, \"mean_us\": %.3f}\n",
                  graph_->blocks[step.block].name, static_cast<long long>(step.calls), step.seconds * 1e6,
                  step.seconds * 1e6 / step.calls);
    text += line;
  }
  std::lock_guard<std::mutex> lock(state_.report_mutex);
  AppendOrWarn(state_.options.profile, text, "profile", &state_.profile_warned);
}

TfLiteStatus Partition::Fail(TfLiteContext* context, const std::string& message) {
  Log(LogLevel::kError, "%s", message.c_str());
  context->ReportError(context, "dnnfusion: %s", message.c_str());
  return kTfLiteError;
}

Partition::Buffer* Partition::BufferFor(TfLiteContext* context, int tensor, int pack, bool half, int rank,
                                        const int32_t* dims, Role role, const ReadOnlyFileMappings& mappings,
                                        std::string* error) {
  const auto key = std::make_tuple(tensor, pack, half);
  auto found = by_key_.find(key);
  if (found != by_key_.end()) return found->second;
  const TfLiteTensor& t = context->tensors[tensor];
  buffers_.emplace_back();
  Buffer& b = buffers_.back();
  b.tensor = tensor;
  b.role = role;
  b.dims = HalideDims(rank, dims);
  b.raw.dimensions = rank;
  b.raw.dim = b.dims.data();
  if (!HalideType(t.type, &b.raw.type)) {
    *error = std::string("tensor '") + (t.name ? t.name : "?") + "' has a type Halide kernels cannot hold";
    return nullptr;
  }
  const size_t stored_bytes = b.raw.type.bytes();
  if (PacksToInt32(static_cast<Pack>(pack))) b.raw.type = halide_type_t(halide_type_int, 32);
  if (PacksToFloat32(static_cast<Pack>(pack))) b.raw.type = halide_type_t(halide_type_float, 32);
  if (half) {
    if (t.type != kTfLiteFloat32 || (role != Role::kConstant && role != Role::kDecoded)) {
      *error = std::string("tensor '") + (t.name ? t.name : "?") + "' is no float32 constant to pass in fp16";
      return nullptr;
    }
    b.raw.type = halide_type_t(halide_type_float, 16);
  }
  b.pack = pack;
  b.half = half;
  b.stored_bytes = stored_bytes;
  if (role == Role::kInternal) b.arena_offset = arena_offset_.at(tensor);
  // int4 weights: an unpacked copy; fp16 ones: a converted copy.
  if (pack != static_cast<int>(Pack::kNone) || t.type == kTfLiteInt4 || half) {
    b.packed_dims = dims;
    b.raw.host = b.packed.Allocate(b.raw.size_in_bytes());
  }
  if (role == Role::kConstant) {
    if (b.packed.empty()) {
      b.raw.host = reinterpret_cast<uint8_t*>(t.data.raw);
    } else if (!PackWeight(t, b)) {
      *error = std::string("cannot pack constant '") + (t.name ? t.name : "?") + "'";
      return nullptr;
    } else {
      // Kernels read the packed copy: the weight's pages in the model's mapping would otherwise stay
      // resident beside it, every packed weight held twice (as XNNPACK holds its packed weights).
      DropPages(mappings, t.data.raw, t.bytes);
    }
    b.raw.set_host_dirty(true);  // uploaded once, on the first GPU kernel that reads it
  }
  by_key_[key] = &b;
  return &b;
}

Partition::Buffer* Partition::ScratchBuffer(const ScratchSpec& spec, std::string* error) {
  buffers_.emplace_back();
  Buffer& b = buffers_.back();
  b.role = Role::kScratch;
  b.dims = HalideDims(spec.rank, spec.dims);
  b.raw.dimensions = spec.rank;
  b.raw.dim = b.dims.data();
  if (!HalideType(spec.type, &b.raw.type)) {
    *error = "a scratch buffer has a type Halide kernels cannot hold";
    return nullptr;
  }
  // Host memory too, though the kernel never reads it there: a buffer with neither host memory nor
  // a device allocation would make the kernel a bounds query. Its device memory is allocated by the
  // first kernel that writes it and kept until the partition is freed.
  b.raw.host = b.packed.Allocate(b.raw.size_in_bytes());
  return &b;
}

bool Partition::PackWeight(const TfLiteTensor& t, Buffer& b) const {
  const TensorSpec* spec = FindTensorSpec(*graph_, b.tensor);
  if (spec == nullptr || t.data.raw == nullptr) return false;
  const void* values = t.data.raw;
  std::vector<int8_t> unpacked;
  if (t.type == kTfLiteInt4) {  // kernels read int8: unpacked as TFLite's kernels unpack them
    size_t count = 1;
    for (int d = 0; d < spec->rank; ++d) count *= static_cast<size_t>(spec->dims[d]);
    if (t.bytes < (count + 1) / 2) return false;
    const auto* packed = reinterpret_cast<const uint8_t*>(t.data.raw);
    if (b.pack == static_cast<int>(Pack::kNone)) {  // the unpacked values are the copy
      if (b.raw.size_in_bytes() != count) return false;
      UnpackInt4(packed, count, reinterpret_cast<int8_t*>(b.raw.host));
      return true;
    }
    unpacked.resize(count);
    UnpackInt4(packed, count, unpacked.data());
    values = unpacked.data();
  }
  if (!b.half) {
    return PackConstant(static_cast<Pack>(b.pack), values, spec->dims, spec->rank, b.raw.host, b.packed_dims,
                        b.raw.dimensions, b.stored_bytes);
  }
  // Packed as float32, then converted: the packings move elements, whatever their size.
  const size_t count = b.raw.number_of_elements();
  std::vector<float> wide(count);
  if (b.pack == static_cast<int>(Pack::kNone)) {
    if (t.bytes != count * sizeof(float)) return false;
    std::memcpy(wide.data(), values, t.bytes);
  } else if (!PackConstant(static_cast<Pack>(b.pack), values, spec->dims, spec->rank, wide.data(), b.packed_dims,
                           b.raw.dimensions, b.stored_bytes)) {
    return false;
  }
  FloatsToHalves(wide.data(), count, reinterpret_cast<uint16_t*>(b.raw.host));
  return true;
}

TfLiteStatus Partition::TakeDecoded(TfLiteContext* context, Buffer& b) {
  // TFLite's decoder ran before this partition (it precedes it in the execution plan) and keeps
  // its output; a re-allocation may move that output, never change it. Packed weights are packed
  // once; an unpacked one is rebound when it moves and re-uploaded only then.
  const TfLiteTensor& t = context->tensors[b.tensor];
  if (t.data.raw == nullptr) {
    return Fail(context, std::string("decoded weight '") + (t.name ? t.name : "?") + "' has no data");
  }
  if (b.packed.empty()) {
    if (b.taken == t.data.raw) return kTfLiteOk;
    b.raw.host = reinterpret_cast<uint8_t*>(t.data.raw);
  } else {
    if (b.taken != nullptr) return kTfLiteOk;
    if (!PackWeight(t, b)) {
      return Fail(context, std::string("cannot pack decoded weight '") + (t.name ? t.name : "?") + "'");
    }
  }
  b.taken = t.data.raw;
  b.raw.set_host_dirty(true);
  return kTfLiteOk;
}

TfLiteStatus Partition::Build(TfLiteContext* context) {
  const GraphSpec& graph = *graph_;
  const std::set<int> escaping(outputs_.begin(), outputs_.end());

  // Which tensors the partition produces for itself alone, and from which step to which.
  std::map<int, Lifetime> internal;
  std::set<int> produced;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const BlockSpec& block = graph.blocks[steps_[s].block];
    for (int k = 0; k < block.n_outputs; ++k) {
      const int t = graph.outputs[block.first_output + k];
      produced.insert(t);
      if (!escaping.count(t)) internal[t] = {context->tensors[t].bytes, static_cast<int>(s), static_cast<int>(s)};
    }
    for (int k = 0; k < block.n_args; ++k) {
      auto it = internal.find(graph.args[block.first_arg + k].tensor);
      if (it != internal.end()) it->second.last = static_cast<int>(s);
    }
  }
  std::vector<Lifetime> lifetimes;
  for (const auto& kv : internal) lifetimes.push_back(kv.second);
  std::vector<size_t> offsets;
  arena_bytes_ = PlanArena(lifetimes, &offsets, kBufferAlignment);
  // Never empty when there are internal tensors: a buffer with no memory makes a kernel a bounds query.
  if (!internal.empty()) arena_bytes_ = std::max(arena_bytes_, kBufferAlignment);
  state_.arena.Require(arena_bytes_);
  arena_base_ = nullptr;  // bound at each Invoke
  size_t i = 0;
  for (const auto& kv : internal) arena_offset_[kv.first] = offsets[i++];

  std::string error;
  const ReadOnlyFileMappings mappings;  // where the weights lie: packed, their pages are handed back
  for (Step& step : steps_) {
    const BlockSpec& block = graph.blocks[step.block];
    std::vector<Buffer*> bound;  // the kernel's arguments, then its outputs
    for (int k = 0; k < block.n_args; ++k) {
      const ArgSpec& arg = graph.args[block.first_arg + k];
      const Role role = arg.source == ArgSource::kConstant  ? Role::kConstant
                        : arg.source == ArgSource::kDecoded ? Role::kDecoded
                        : internal.count(arg.tensor)         ? Role::kInternal
                        : produced.count(arg.tensor)         ? Role::kOutput
                                                             : Role::kInput;
      Buffer* b = BufferFor(context, arg.tensor, static_cast<int>(arg.pack), arg.half != 0, arg.rank, arg.dims, role,
                            mappings, &error);
      if (b == nullptr) return Fail(context, std::string("block ") + block.name + ": " + error);
      step.argv.push_back(&b->raw);
      bound.push_back(b);
      if (arg.n_index_bounds > 0) {
        step.index_checks.push_back({b, graph.index_bounds + arg.first_index_bound, arg.n_index_bounds, arg.index_op});
      }
    }
    for (int k = 0; k < block.n_outputs; ++k) {
      const int t = graph.outputs[block.first_output + k];
      const TensorSpec* spec = FindTensorSpec(graph, t);
      const Role role = internal.count(t) ? Role::kInternal : Role::kOutput;
      Buffer* b = BufferFor(context, t, static_cast<int>(Pack::kNone), false, spec->rank, spec->dims, role, mappings,
                            &error);
      if (b == nullptr) return Fail(context, std::string("block ") + block.name + ": " + error);
      step.argv.push_back(&b->raw);
      bound.push_back(b);
      if (role == Role::kOutput) step.to_host.push_back(b);
    }
    step.run = RunAt(context, graph, block, nullptr, /*constants=*/false);
    const int direction = step.run.direction;
    for (int k = 0; direction >= 0 && k < block.n_args + block.n_outputs; ++k) {
      const bool output = k >= block.n_args;
      if (!output && !TakesInWindows(graph, graph.args[block.first_arg + k], direction)) continue;
      Step::Cut& cut = step.cut.emplace_back();
      cut.buffer = bound[k];
      cut.output = output;
      cut.step_bytes = bound[k]->raw.size_in_bytes() / step.run.compiled_steps;
      if (step.run.steps < step.run.compiled_steps) cut.padded.Allocate(bound[k]->raw.size_in_bytes());
    }
    for (int k = 0; direction < 0 && block.in_place_kernel != nullptr && k < block.n_in_place; ++k) {
      const int32_t* pair = graph.in_place + block.first_in_place + 2 * k;
      const Buffer* in = bound[pair[0]];
      const Buffer* out = bound[block.n_args + pair[1]];
      if (in->role != Role::kInput || out->role != Role::kOutput) {
        step.in_place.clear();
        break;
      }
      step.in_place.push_back({in, out});
    }
    for (int k = 0; k < block.n_scratch; ++k) {
      Buffer* b = ScratchBuffer(graph.scratch[block.first_scratch + k], &error);
      if (b == nullptr) return Fail(context, std::string("block ") + block.name + ": " + error);
      step.argv.push_back(&b->raw);
    }
  }
  Log(LogLevel::kVerbose, "partition of %zu nodes: %zu blocks, %zu buffers, %zu internal tensors in a %zu-byte arena%s",
      nodes_.size(), steps_.size(), buffers_.size(), internal.size(), arena_bytes_,
      ends_invoke_ ? "; it ends the invoke: the pool's workers linger after it" : "");
  return kTfLiteOk;
}

std::string Partition::ShapeChange(TfLiteContext* context) const {
  const GraphSpec& graph = *graph_;
  std::set<const Buffer*> windowed;  // checked by RunAt here, not against their compiled shapes below
  for (const Step& step : steps_) {
    if (step.run.direction < 0) continue;
    std::string why;
    const BlockRun run = RunAt(context, graph, graph.blocks[step.block], &why, /*constants=*/false);
    if (run.direction != step.run.direction || run.steps != step.run.steps) {
      return why.empty() ? "block " + std::string(graph.blocks[step.block].name) + " now holds " +
                               std::to_string(run.steps) + " steps, not " + std::to_string(step.run.steps)
                         : why;
    }
    for (const Step::Cut& cut : step.cut) windowed.insert(cut.buffer);
  }
  for (const Buffer& b : buffers_) {
    if (windowed.count(&b)) continue;
    if (!b.packed.empty() || b.role == Role::kScratch) continue;  // packed or scratch: shapes of our own
    const TensorSpec* spec = FindTensorSpec(graph, b.tensor);
    const TfLiteIntArray* dims = context->tensors[b.tensor].dims;
    bool same = dims != nullptr && dims->size == spec->rank;
    for (int d = 0; same && d < spec->rank; ++d) same = dims->data[d] == spec->dims[d];
    if (!same) {
      const TfLiteTensor& t = context->tensors[b.tensor];
      return std::string("tensor '") + (t.name ? t.name : "?") + "' is now " + ShapeText(dims);
    }
  }
  return "";
}

const GraphSpec* Partition::GraphForShapes(TfLiteContext* context, std::vector<int>* blocks) const {
  const Bundle& bundle = *state_.bundle;
  const GraphSpec* best = nullptr;  // of those whose blocks all run: as compiled, else the least RunCost
  int64_t best_cost = 0;
  for (int g = 0; g < bundle.n_graphs; ++g) {
    const GraphSpec& other = bundle.graphs[g];
    if (other.subgraph != graph_->subgraph) continue;
    std::vector<int> theirs_blocks;
    int64_t cost = 0;
    for (const Step& step : steps_) {
      const BlockSpec& mine = graph_->blocks[step.block];
      int found = -1;
      for (int b = 0; b < other.n_blocks && found < 0; ++b) {
        const BlockSpec& theirs = other.blocks[b];
        bool same = theirs.n_nodes == mine.n_nodes;
        for (int k = 0; same && k < mine.n_nodes; ++k) {
          same = other.nodes[theirs.first_node + k].index == graph_->nodes[mine.first_node + k].index;
        }
        const BlockRun run = same ? RunAt(context, other, theirs, nullptr) : BlockRun();
        if (run.ok) found = b, cost += RunCost(run);
      }
      if (found < 0) break;
      theirs_blocks.push_back(found);
    }
    if (theirs_blocks.size() == steps_.size() && (best == nullptr || cost < best_cost)) {
      best = &other;
      best_cost = cost;
      *blocks = theirs_blocks;
    }
  }
  return best;
}

void Partition::Rebind(const GraphSpec& graph, const std::vector<int>& blocks) {
  if (!state_.options.profile.empty()) WriteProfile();
  FreeDeviceMemory();
  graph_ = &graph;
  steps_.clear();
  for (int b : blocks) {
    Step step;
    step.block = b;
    steps_.push_back(std::move(step));
  }
  buffers_.clear();
  by_key_.clear();
  arena_offset_.clear();
  built_ = false;
}

TfLiteStatus Partition::Prepare(TfLiteContext* context) {
  if (!error_.empty()) return Fail(context, error_);
  if (!built_) {
    if (Build(context) != kTfLiteOk) return kTfLiteError;
    built_ = true;
  }
  const std::string change = ShapeChange(context);
  decoded_ = false;  // a Prepare may move what the decoders wrote: decode again
  if (change.empty()) {
    falling_back_ = false;
    return decoders_.Prepare(context);
  }
  if (!custom_op_.empty()) {
    // TFLite may hold no kernel of its own for it (MediaPipe's ops: only XNNPACK runs them).
    return Fail(context, change + "; the kernels are compiled for static shapes and the partition holds custom op " +
                             custom_op_ + ", which TFLite may not run itself (re-run `tflite_tools fuse`)");
  }
  // TFLite's own kernels size every tensor of the partition at the new shapes (its shape rules,
  // not ours); a graph of the bundle compiled for exactly those shapes then takes over.
  if (fallback_.Prepare(context) != kTfLiteOk) return kTfLiteError;
  std::vector<int> blocks;
  if (const GraphSpec* other = GraphForShapes(context, &blocks)) {
    Log(LogLevel::kInfo, "a partition of %zu nodes runs the kernels of %s at its new shapes", nodes_.size(),
        other->name);
    Rebind(*other, blocks);
    if (Build(context) != kTfLiteOk) return kTfLiteError;
    built_ = true;
    falling_back_ = false;
    return decoders_.Prepare(context);
  }
  if (!falling_back_) {
    Log(LogLevel::kWarning, "a partition of %zu nodes runs TFLite's kernels: %s, and no kernels of the bundle are "
        "compiled for these shapes (`tflite_tools fuse --shape` adds some)", nodes_.size(), change.c_str());
  }
  falling_back_ = true;
  return kTfLiteOk;
}

int Partition::RunStep(Step& step) {
  const BlockSpec& block = graph_->blocks[step.block];
  int err = step.run.direction >= 0 ? RunWindows(step)
                                    : (SharesMemory(step.in_place) ? block.in_place_kernel : block.kernel)(step.argv.data());
  for (Buffer* b : step.to_host) {
    if (err == 0) err = halide_copy_to_host(nullptr, &b->raw);  // no-op unless a GPU wrote it
    if (err == 0 && b->copy_to != nullptr) std::memcpy(b->copy_to, b->raw.host, b->copy_bytes);
  }
  return err;
}

int Partition::RunWindows(Step& step) {
  const KernelEntry kernel = graph_->blocks[step.block].kernel;
  const int steps = step.run.steps;
  const int window = step.run.compiled_steps;
  for (Step::Cut& cut : step.cut) cut.base = cut.buffer->raw.host;
  int err = 0;
  if (steps < window) {
    // The steps there are, then zeros (a valid index, a finite value): no step reads another's, so
    // what the kernel makes of the padding is dropped.
    for (Step::Cut& cut : step.cut) {
      if (!cut.output) std::memcpy(cut.padded.data(), cut.base, cut.step_bytes * steps);
      cut.buffer->raw.host = cut.padded.data();
    }
    err = kernel(step.argv.data());
    for (Step::Cut& cut : step.cut) {
      if (err == 0 && cut.output) std::memcpy(cut.base, cut.padded.data(), cut.step_bytes * steps);
    }
  } else {
    // Windows side by side; the last ends at the last step, computing again, to the same values,
    // the steps it shares with the one before.
    for (int start = 0; err == 0 && start < steps; start += window) {
      const int at = std::min(start, steps - window);
      for (Step::Cut& cut : step.cut) cut.buffer->raw.host = cut.base + at * cut.step_bytes;
      err = kernel(step.argv.data());
    }
  }
  for (Step::Cut& cut : step.cut) cut.buffer->raw.host = cut.base;
  return err;
}

bool Partition::SharesMemory(const std::vector<std::pair<const Buffer*, const Buffer*>>& pairs) {
  for (const auto& pair : pairs) {
    if (pair.first->raw.host != pair.second->raw.host) return false;  // an aligned output's shadow differs too
  }
  return !pairs.empty();
}

TfLiteStatus Partition::Invoke(TfLiteContext* context) {
  if (falling_back_) return fallback_.Invoke(context);
  if (!decoded_) {  // the weights, decoded once into persistent memory
    if (decoders_.Invoke(context) != kTfLiteOk) return kTfLiteError;
    decoded_ = true;
  }
  const GraphSpec& graph = *graph_;
  SetThreadPoolSize(KernelThreads(state_.options, context->recommended_num_threads));
  // Whichever way this returns, the pool's workers stop spinning once the partition is done; after
  // the partition that ends the invoke they linger for the next one (thread_pool.h).
  struct Park {
    bool linger;
    ~Park() { ParkThreadPool(linger); }
  } park{ends_invoke_};
  const ScopedDenormalsAsZero denormals_as_zero;  // the pool's workers run so throughout
  const ArenaLease arena(state_.arena, arena_bytes_, own_arena_);
  if (arena.data() != arena_base_) {  // the shared arena grew, or another invoke holds it
    arena_base_ = arena.data();
    for (Buffer& b : buffers_) {
      if (b.role == Role::kInternal) b.raw.host = arena_base_ + b.arena_offset;
    }
  }
  // TFLite's memory for the partition's edges may move between invokes: rebind it every time.
  for (Buffer& b : buffers_) {
    if (b.role == Role::kDecoded && TakeDecoded(context, b) != kTfLiteOk) return kTfLiteError;
    if (b.role != Role::kInput && b.role != Role::kOutput) continue;
    const TfLiteTensor& t = context->tensors[b.tensor];
    if (t.data.raw == nullptr) {
      return Fail(context, std::string("tensor '") + (t.name ? t.name : "?") + "' has no memory");
    }
    b.raw.host = reinterpret_cast<uint8_t*>(t.data.raw);
    b.copy_to = nullptr;
    if (b.role == Role::kOutput && Aligned(b.raw.host) != b.raw.host) {
      b.raw.host = b.shadow.Allocate(t.bytes);
      b.copy_to = t.data.raw;
      b.copy_bytes = t.bytes;
    }
    if (b.role == Role::kInput) b.raw.set_host_dirty(true);  // new data: upload on first use
  }
  auto* profiler = static_cast<tflite::Profiler*>(context->profiler);
  for (Step& step : steps_) {
    const BlockSpec& block = graph.blocks[step.block];
    uint32_t event = 0;
    if (profiler) {
      event = profiler->BeginEvent(block.name, tflite::Profiler::EventType::DELEGATE_OPERATOR_INVOKE_EVENT,
                                   step.block, 0);
    }
    // At log_level:verbose the debug runtime's trace of launches, allocations and copies follows,
    // and bench/gpu_counts.py attributes it to the block named here.
    Log(LogLevel::kVerbose, "block %s", block.name);
    for (const IndexCheck& check : step.index_checks) {
      const std::string out_of_bounds = IndexOutOfBounds(check.buffer->raw, check.bounds, check.n_bounds);
      if (!out_of_bounds.empty()) {
        return Fail(context, std::string("block ") + block.name + ": " + check.op + " index out of bounds: " +
                                 out_of_bounds);
      }
    }
    ClearHalideError();
    const bool timed = !state_.options.profile.empty();
    const auto start = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    const int err = RunStep(step);
    if (timed) {
      step.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++step.calls;
    }
    if (profiler) profiler->EndEvent(event);
    if (err != 0) {
      return Fail(context, std::string("block ") + block.name + " failed (Halide error " + std::to_string(err) +
                               "): " + LastHalideError());
    }
  }
  return kTfLiteOk;
}

}  // namespace dnnfusion
