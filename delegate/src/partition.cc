#include "partition.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>

#include "claim.h"
#include "halide_hooks.h"
#include "log.h"
#include "memory_plan.h"
#include "pack.h"

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

// Halide's thread pool is process-wide (per delegate library): resize it only when asked for a
// different count.
void UseThreads(int threads) {
  static std::atomic<int> current{-1};
  if (current.exchange(threads) != threads) halide_set_num_threads(threads);
}

}  // namespace

Partition::Partition(const DelegateState& state, const TfLiteDelegateParams& params) : state_(state) {
  const Bundle& bundle = *state.bundle;
  nodes_.assign(params.nodes_to_replace->data, params.nodes_to_replace->data + params.nodes_to_replace->size);
  outputs_.assign(params.output_tensors->data, params.output_tensors->data + params.output_tensors->size);
  const std::set<int> mine(nodes_.begin(), nodes_.end());
  // Blocks are claimed whole, so each lies wholly inside one partition; bundle order is an
  // execution order.
  for (int b = 0; b < bundle.n_blocks; ++b) {
    const BlockSpec& block = bundle.blocks[b];
    int inside = 0;
    for (int k = 0; k < block.n_nodes; ++k) inside += mine.count(bundle.nodes[block.first_node + k].index);
    if (inside == block.n_nodes) {
      Step step;
      step.block = b;
      steps_.push_back(std::move(step));
    } else if (inside > 0) {
      error_ = std::string("block ") + block.name + " was split across delegate partitions";
    }
  }
  size_t covered = 0;
  for (const Step& s : steps_) covered += bundle.blocks[s.block].n_nodes;
  if (error_.empty() && covered != nodes_.size()) error_ = "the partition holds nodes of no bundle block";
}

TfLiteStatus Partition::Fail(TfLiteContext* context, const std::string& message) {
  Log(LogLevel::kError, "%s", message.c_str());
  context->ReportError(context, "dnnfusion: %s", message.c_str());
  return kTfLiteError;
}

TfLiteStatus Partition::Build(TfLiteContext* context) {
  const Bundle& bundle = *state_.bundle;
  const std::set<int> escaping(outputs_.begin(), outputs_.end());

  // Which tensors the partition produces for itself alone, and from which step to which.
  std::map<int, Lifetime> internal;
  for (size_t s = 0; s < steps_.size(); ++s) {
    const BlockSpec& block = bundle.blocks[steps_[s].block];
    for (int k = 0; k < block.n_outputs; ++k) {
      const int t = bundle.outputs[block.first_output + k];
      if (!escaping.count(t)) internal[t] = {context->tensors[t].bytes, static_cast<int>(s), static_cast<int>(s)};
    }
    for (int k = 0; k < block.n_args; ++k) {
      auto it = internal.find(bundle.args[block.first_arg + k].tensor);
      if (it != internal.end()) it->second.last = static_cast<int>(s);
    }
  }
  std::vector<Lifetime> lifetimes;
  for (const auto& kv : internal) lifetimes.push_back(kv.second);
  std::vector<size_t> offsets;
  arena_.assign(PlanArena(lifetimes, &offsets), 0);
  std::map<int, size_t> offset_of;
  size_t i = 0;
  for (const auto& kv : internal) offset_of[kv.first] = offsets[i++];

  std::map<std::pair<int, int>, int> packed_index;  // (tensor, pack) -> packed_ slot
  for (Step& step : steps_) {
    const BlockSpec& block = bundle.blocks[step.block];
    auto bind = [&](int tensor, int rank, const int32_t* dims, bool output) -> Binding& {
      Binding b;
      b.tensor = tensor;
      b.output = output;
      b.dims = HalideDims(rank, dims);
      if (!HalideType(context->tensors[tensor].type, &b.buffer.type)) b.tensor = -2;
      b.buffer.dimensions = rank;
      auto it = offset_of.find(tensor);
      if (it != offset_of.end()) {
        b.internal = true;
        b.arena_offset = it->second;
      }
      step.bindings.push_back(std::move(b));
      return step.bindings.back();
    };
    for (int k = 0; k < block.n_args; ++k) {
      const ArgSpec& arg = bundle.args[block.first_arg + k];
      Binding& b = bind(arg.tensor, arg.rank, arg.dims, false);
      if (arg.pack == Pack::kNone) continue;
      auto key = std::make_pair(arg.tensor, static_cast<int>(arg.pack));
      auto found = packed_index.find(key);
      if (found == packed_index.end()) {
        const TfLiteTensor& t = context->tensors[arg.tensor];
        const TensorSpec* spec = FindTensorSpec(bundle, arg.tensor);
        size_t count = 1;
        for (int d = 0; d < arg.rank; ++d) count *= arg.dims[d];
        const size_t element = t.bytes / std::max<size_t>(1, [&] {
          size_t n = 1;
          for (int d = 0; d < spec->rank; ++d) n *= spec->dims[d];
          return n;
        }());
        std::vector<uint8_t> data(count * element);
        if (!PackConstant(arg.pack, t.data.raw, spec->dims, spec->rank, data.data(), arg.dims, arg.rank, element)) {
          return Fail(context, std::string("block ") + block.name + ": cannot pack constant '" +
                                   (t.name ? t.name : "?") + "'");
        }
        found = packed_index.emplace(key, static_cast<int>(packed_.size())).first;
        packed_.push_back(std::move(data));
      }
      b.packed = found->second;
    }
    for (int k = 0; k < block.n_outputs; ++k) {
      const int t = bundle.outputs[block.first_output + k];
      const TensorSpec* spec = FindTensorSpec(bundle, t);
      bind(t, spec->rank, spec->dims, true);
    }
    for (Binding& b : step.bindings) {
      if (b.tensor == -2) return Fail(context, std::string("block ") + block.name + ": a tensor type Halide cannot hold");
      b.buffer.dim = b.dims.data();
      step.argv.push_back(&b.buffer);
    }
  }
  Log(LogLevel::kVerbose, "partition of %zu nodes: %zu blocks, %zu internal tensors in a %zu-byte arena",
      nodes_.size(), steps_.size(), internal.size(), arena_.size());
  return kTfLiteOk;
}

TfLiteStatus Partition::CheckShapes(TfLiteContext* context) const {
  const Bundle& bundle = *state_.bundle;
  for (const Step& step : steps_) {
    for (const Binding& b : step.bindings) {
      if (b.packed >= 0) continue;
      const TensorSpec* spec = FindTensorSpec(bundle, b.tensor);
      const TfLiteIntArray* dims = context->tensors[b.tensor].dims;
      bool same = dims != nullptr && dims->size == spec->rank;
      for (int d = 0; same && d < spec->rank; ++d) same = dims->data[d] == spec->dims[d];
      if (!same) {
        const TfLiteTensor& t = context->tensors[b.tensor];
        const std::string message = std::string("block ") + bundle.blocks[step.block].name + ": tensor '" +
                                    (t.name ? t.name : "?") + "' is now " + ShapeText(dims) +
                                    "; the kernels are compiled for static shapes (re-run `tflite_tools fuse`)";
        Log(LogLevel::kError, "%s", message.c_str());
        context->ReportError(context, "dnnfusion: %s", message.c_str());
        return kTfLiteError;
      }
    }
  }
  return kTfLiteOk;
}

TfLiteStatus Partition::Prepare(TfLiteContext* context) {
  if (!error_.empty()) return Fail(context, error_);
  if (!built_) {
    if (Build(context) != kTfLiteOk) return kTfLiteError;
    built_ = true;
  }
  return CheckShapes(context);
}

TfLiteStatus Partition::Invoke(TfLiteContext* context) {
  const Bundle& bundle = *state_.bundle;
  const int threads = state_.options.num_threads > 0 ? state_.options.num_threads
                      : context->recommended_num_threads > 0 ? context->recommended_num_threads
                                                             : 1;
  UseThreads(threads);
  auto* profiler = static_cast<tflite::Profiler*>(context->profiler);
  for (Step& step : steps_) {
    for (Binding& b : step.bindings) {
      uint8_t* host = b.packed >= 0  ? packed_[b.packed].data()
                      : b.internal   ? arena_.data() + b.arena_offset
                                     : reinterpret_cast<uint8_t*>(context->tensors[b.tensor].data.raw);
      if (host == nullptr) {
        const char* name = context->tensors[b.tensor].name;
        return Fail(context, std::string("block ") + bundle.blocks[step.block].name + ": tensor '" +
                                 (name ? name : "?") + "' has no memory");
      }
      b.buffer.host = host;
      b.buffer.flags = 0;
    }
    const BlockSpec& block = bundle.blocks[step.block];
    uint32_t event = 0;
    if (profiler) {
      event = profiler->BeginEvent(block.name, tflite::Profiler::EventType::DELEGATE_OPERATOR_INVOKE_EVENT,
                                   step.block, 0);
    }
    ClearHalideError();
    const int err = block.kernel(step.argv.data());
    if (profiler) profiler->EndEvent(event);
    if (err != 0) {
      return Fail(context, std::string("block ") + block.name + " failed (Halide error " + std::to_string(err) +
                               "): " + LastHalideError());
    }
  }
  return kTfLiteOk;
}

}  // namespace dnnfusion
