#include "claim.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cpu_caps.h"
#include "gpu_caps.h"
#include "pack.h"
#include "page_scan.h"

namespace dnnfusion {
namespace {

std::string SpecShapeText(int rank, const int32_t* dims) {
  std::string text = "[";
  for (int i = 0; i < rank; ++i) text += (i ? "," : "") + std::to_string(dims[i]);
  return text + "]";
}

bool SameDims(const TfLiteIntArray* dims, int rank, const int32_t* expected) {
  if (dims == nullptr || dims->size != rank) return false;
  for (int i = 0; i < rank; ++i) {
    if (dims->data[i] != expected[i]) return false;
  }
  return true;
}

bool SameList(const TfLiteIntArray* list, const int32_t* expected, int count) {
  if (list == nullptr || list->size != count) return false;
  return std::equal(expected, expected + count, list->data);
}

// Why the model is not the one the bundle was built for (its fingerprint), or "" when it is.
std::string CheckModel(TfLiteContext* context, const Bundle& bundle) {
  if (context->GetModelMetadata != nullptr) {
    const char* data = nullptr;
    size_t bytes = 0;
    if (context->GetModelMetadata(context, kFingerprintMetadata, &data, &bytes) != kTfLiteOk) {
      return std::string("the model carries no dnnfusion fingerprint; run the model.fused.tflite that "
                         "`tflite_tools fuse` wrote next to this library (built for ") + bundle.model + ")";
    }
    if (bytes != std::strlen(bundle.fingerprint) || std::memcmp(data, bundle.fingerprint, bytes) != 0) {
      return std::string("this library was built for ") + bundle.model + " (fingerprint " +
             std::string(bundle.fingerprint).substr(0, 12) + "), the model's fingerprint is " +
             std::string(data, std::min<size_t>(bytes, 12));
    }
  }
  return "";
}

// Why this subgraph of the model is not the one the bundle was built for, or "" when it is.
std::string CheckGraph(TfLiteContext* context, const GraphSpec& graph) {
  TfLiteIntArray* plan = nullptr;
  if (context->GetExecutionPlan(context, &plan) != kTfLiteOk || plan == nullptr) {
    return "TFLite gave no execution plan";
  }
  // Kernels may add temporaries to the context before delegation: only fewer tensors than the
  // model had means another graph.
  if (context->tensors_size < static_cast<size_t>(graph.n_tensors) || plan->size != graph.n_graph_nodes) {
    return "this subgraph has " + std::to_string(plan->size) + " nodes and " +
           std::to_string(context->tensors_size) + " tensors; the bundle was built for " +
           std::to_string(graph.n_graph_nodes) + " and " + std::to_string(graph.n_tensors) +
           " (another subgraph, another model, or another delegate applied first)";
  }
  for (int i = 0; i < plan->size; ++i) {
    TfLiteNode* node = nullptr;
    TfLiteRegistration* reg = nullptr;
    if (plan->data[i] != i || context->GetNodeAndRegistration(context, i, &node, &reg) != kTfLiteOk ||
        reg->builtin_code != graph.graph_codes[i]) {
      return "node " + std::to_string(i) + " is not the operator the bundle was built for";
    }
  }
  return "";
}

// False when a float32 or float16 constant holds NaN or infinity (other types are always finite).
// Read without keeping it resident (page_scan.h): the kernel may read only part of it.
bool AllFinite(const TfLiteTensor& t) {
  const auto* data = reinterpret_cast<const uint8_t*>(t.data.raw);
  if (t.type == kTfLiteFloat32) {
    return ScanWithoutKeeping(data, t.bytes / sizeof(float) * sizeof(float), [](const uint8_t* chunk, size_t bytes) {
      const auto* values = reinterpret_cast<const float*>(chunk);
      for (size_t i = 0; i < bytes / sizeof(float); ++i) {
        if (!std::isfinite(values[i])) return false;
      }
      return true;
    });
  }
  if (t.type == kTfLiteFloat16) {
    return ScanWithoutKeeping(data, t.bytes / sizeof(uint16_t) * sizeof(uint16_t), [](const uint8_t* chunk, size_t bytes) {
      const auto* bits = reinterpret_cast<const uint16_t*>(chunk);
      for (size_t i = 0; i < bytes / sizeof(uint16_t); ++i) {
        if ((bits[i] & 0x7c00) == 0x7c00) return false;  // exponent all ones: infinity or NaN
      }
      return true;
    });
  }
  return true;
}

bool IsConstant(const TfLiteTensor& t) {
  return (t.allocation_type == kTfLiteMmapRo || t.allocation_type == kTfLitePersistentRo) && t.data.raw != nullptr;
}

// TFLite's convolutions skip the taps that fall on padding; a kernel reading a zero-padded input
// multiplies them by zero, and 0 * inf is NaN. Weights are read from the model at run time, so
// only here can a model whose weights changed since fuse be caught.
const char kNotFinite[] = "' holds NaN or infinity (the kernel would differ from TFLite's at padding)";

// Why tensor `index` differs from its spec (with axis `axis`, where not -1, of extent `extent`), or "".
std::string CheckTensor(TfLiteContext* context, const GraphSpec& graph, int index, bool constant, int axis = -1,
                        int extent = 0) {
  const TensorSpec* spec = FindTensorSpec(graph, index);
  if (spec == nullptr || index < 0 || static_cast<size_t>(index) >= context->tensors_size) {
    return "tensor " + std::to_string(index) + " is not in the bundle";
  }
  const TfLiteTensor& t = context->tensors[index];
  const std::string name = t.name ? t.name : std::to_string(index);
  if (t.type != spec->type) {
    return "tensor '" + name + "' has type " + std::to_string(t.type) + ", the kernel takes " + std::to_string(spec->type);
  }
  int32_t dims[kMaxRank];
  std::copy(spec->dims, spec->dims + spec->rank, dims);
  if (axis >= 0 && axis < spec->rank) dims[axis] = extent;
  if (!SameDims(t.dims, spec->rank, dims)) {
    return "tensor '" + name + "' has shape " + ShapeText(t.dims) + ", the kernel was compiled for " +
           SpecShapeText(spec->rank, spec->dims) + (axis >= 0 ? " per window" : "");
  }
  // A dimension the signature leaves open (-1) is fine once TFLite has sized it (the dims checked
  // above); a tensor its producer sizes only while the model runs is not.
  if (t.allocation_type == kTfLiteDynamic) return "tensor '" + name + "' is sized only as the model runs";
  if (constant && !IsConstant(t)) return "tensor '" + name + "' is not a constant in this graph";
  if (constant && !AllFinite(t)) return "tensor '" + name + kNotFinite;
  return "";
}

// Why the stored constant a decoded weight comes from (ArgSource::kDecoded) cannot back a kernel,
// or "" when it can. It is decoded only when the partition first runs, so its values are judged
// here by what is stored (decoding fp16, int8 or sparse values keeps them finite).
std::string CheckStored(TfLiteContext* context, int stored) {
  if (stored < 0 || static_cast<size_t>(stored) >= context->tensors_size) {
    return "stored weight " + std::to_string(stored) + " is not in this graph";
  }
  const TfLiteTensor& t = context->tensors[stored];
  const std::string name = t.name ? t.name : std::to_string(stored);
  if (!IsConstant(t)) return "stored weight '" + name + "' is not a constant in this graph";
  if (!AllFinite(t)) return "stored weight '" + name + kNotFinite;
  return "";
}

// The graph's nodes as producers and consumers of tensors (node indices of the execution plan).
struct Dataflow {
  std::map<int, int> producer;                 // tensor -> node writing it
  std::map<int, std::vector<int>> consumers;  // tensor -> nodes reading it
  std::map<int, TfLiteNode*> nodes;
  std::map<int, TfLiteRegistration*> registrations;
};

Dataflow ReadDataflow(TfLiteContext* context) {
  Dataflow flow;
  TfLiteIntArray* plan = nullptr;
  if (context->GetExecutionPlan == nullptr || context->GetNodeAndRegistration == nullptr ||
      context->GetExecutionPlan(context, &plan) != kTfLiteOk) {
    return flow;
  }
  for (int i = 0; i < plan->size; ++i) {
    TfLiteNode* node = nullptr;
    TfLiteRegistration* registration = nullptr;
    if (context->GetNodeAndRegistration(context, plan->data[i], &node, &registration) != kTfLiteOk) continue;
    flow.nodes[plan->data[i]] = node;
    flow.registrations[plan->data[i]] = registration;
    for (int k = 0; k < node->outputs->size; ++k) flow.producer[node->outputs->data[k]] = plan->data[i];
    for (int k = 0; k < node->inputs->size; ++k) {
      if (node->inputs->data[k] >= 0) flow.consumers[node->inputs->data[k]].push_back(plan->data[i]);
    }
  }
  return flow;
}

// The DEQUANTIZE / DENSIFY nodes decoding `block`'s stored weights (ArgSource::kDecoded), found by
// walking back from each decoded tensor through the decoders that write it; in execution order.
std::vector<int> DecoderNodes(const Dataflow& flow, const GraphSpec& graph, const BlockSpec& block) {
  std::set<int> found;
  for (int k = 0; k < block.n_args; ++k) {
    const ArgSpec& arg = graph.args[block.first_arg + k];
    if (arg.source != ArgSource::kDecoded) continue;
    for (auto p = flow.producer.find(arg.tensor); p != flow.producer.end();) {
      const int code = flow.registrations.at(p->second)->builtin_code;
      if (code != kBuiltinDensify && code != kBuiltinDequantize) break;
      found.insert(p->second);
      p = flow.producer.find(flow.nodes.at(p->second)->inputs->data[0]);
    }
  }
  return {found.begin(), found.end()};
}

// Why block `b` cannot run on this graph, or "" when it can.
std::string CheckBlock(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block) {
  for (int k = 0; k < block.n_nodes; ++k) {
    const NodeSpec& spec = graph.nodes[block.first_node + k];
    TfLiteNode* node = nullptr;
    TfLiteRegistration* reg = nullptr;
    if (context->GetNodeAndRegistration(context, spec.index, &node, &reg) != kTfLiteOk) {
      return "node " + std::to_string(spec.index) + " does not exist";
    }
    if (reg->builtin_code != spec.builtin_code) {
      return "node " + std::to_string(spec.index) + " is operator " + std::to_string(reg->builtin_code) +
             ", the kernel was built for " + std::to_string(spec.builtin_code);
    }
    if (node->delegate != nullptr) return "node " + std::to_string(spec.index) + " is already delegated";
    const int32_t* io = graph.node_tensors + spec.first_io;
    if (!SameList(node->inputs, io, spec.n_inputs) || !SameList(node->outputs, io + spec.n_inputs, spec.n_outputs)) {
      return "node " + std::to_string(spec.index) + " reads or writes other tensors than the kernel";
    }
  }
  std::string why = BlockShapeProblem(context, graph, block);
  for (int k = 0; why.empty() && k < block.n_args; ++k) {
    const ArgSpec& arg = graph.args[block.first_arg + k];
    if (arg.source == ArgSource::kDecoded) why = CheckStored(context, arg.stored);
    if (arg.source == ArgSource::kConstant) {
      // Some packings hold only for some values (weights read at run time may differ from fuse's).
      const TfLiteTensor& t = context->tensors[arg.tensor];
      why = PackValueProblem(arg.pack, t.data.raw, t.bytes, t.type == kTfLiteInt8 ? 1 : 0);
    }
  }
  return why;
}

// Sets the claimed blocks, and the nodes the delegate replaces: theirs and their decoders.
void SetBlocks(const GraphSpec& graph, const std::vector<int>& blocks, Claim* claim) {
  claim->blocks = blocks;
  std::set<int> nodes;
  for (int b : blocks) {
    const BlockSpec& block = graph.blocks[b];
    for (int k = 0; k < block.n_nodes; ++k) nodes.insert(graph.nodes[block.first_node + k].index);
    const auto decoders = claim->decoders.find(b);
    if (decoders != claim->decoders.end()) nodes.insert(decoders->second.begin(), decoders->second.end());
  }
  claim->nodes.assign(nodes.begin(), nodes.end());
}

}  // namespace

std::string ShapeText(const TfLiteIntArray* dims) {
  if (dims == nullptr) return "[?]";
  return SpecShapeText(dims->size, dims->data);
}

namespace {

// Calls `visit(index, spec, axis)` for each tensor of the block taken in windows along `direction`
// (its outputs, and the arguments TakesInWindows); false when an output does not carry it.
template <typename Visit>
bool ForEachWindowed(const GraphSpec& graph, const BlockSpec& block, int direction, Visit visit) {
  for (int k = 0; k < block.n_args + block.n_outputs; ++k) {
    const bool output = k >= block.n_args;
    const ArgSpec* arg = output ? nullptr : &graph.args[block.first_arg + k];
    if (!output && !TakesInWindows(graph, *arg, direction)) continue;
    const int index = output ? graph.outputs[block.first_output + k - block.n_args] : arg->tensor;
    const TensorSpec* spec = FindTensorSpec(graph, index);
    const int axis = spec == nullptr ? -1 : WindowAxis(*spec, direction);
    if (axis < 0 || axis >= spec->rank || spec->dims[axis] <= 0) return false;
    visit(index, *spec, axis);
  }
  return true;
}

// Why the block's tensors differ from its spec with those it takes in windows along `direction`
// (-1: none) holding `steps` steps of which it was compiled for `compiled`, or "". `constants`:
// check constant arguments are constants.
std::string ShapesAt(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block, int direction,
                     int steps, int compiled, bool constants) {
  std::map<int, std::pair<int, int>> windowed;  // tensor -> (axis, extent now)
  if (direction >= 0) {
    ForEachWindowed(graph, block, direction, [&](int index, const TensorSpec& spec, int axis) {
      windowed[index] = {axis, spec.dims[axis] / compiled * steps};
    });
  }
  auto check = [&](int index, bool constant) {
    auto it = windowed.find(index);
    return it == windowed.end() ? CheckTensor(context, graph, index, constant)
                                : CheckTensor(context, graph, index, constant, it->second.first, it->second.second);
  };
  for (int k = 0; k < block.n_args; ++k) {
    const ArgSpec& arg = graph.args[block.first_arg + k];
    std::string why = check(arg.tensor, constants && arg.source == ArgSource::kConstant);
    if (!why.empty()) return why;
  }
  for (int k = 0; k < block.n_outputs; ++k) {
    std::string why = check(graph.outputs[block.first_output + k], false);
    if (!why.empty()) return why;
  }
  return "";
}

// The steps along `direction` a block's windowed tensors hold at compile time (the fewest any
// holds; the others hold whole multiples of them) and now (0, 0 where it cannot run so).
std::pair<int, int> StepsAlong(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block,
                               int direction) {
  if (!(block.windows >> direction & 1) || block.n_outputs == 0) return {0, 0};
  int compiled = 0;
  int first_index = -1, first_axis = -1, first_extent = 0;
  const bool all = ForEachWindowed(graph, block, direction, [&](int index, const TensorSpec& spec, int axis) {
    if (compiled == 0 || spec.dims[axis] < compiled) compiled = spec.dims[axis];
    if (first_index < 0) first_index = index, first_axis = axis, first_extent = spec.dims[axis];
  });
  if (!all || compiled <= 0 || first_index < 0 || static_cast<size_t>(first_index) >= context->tensors_size) {
    return {0, 0};
  }
  const TfLiteIntArray* dims = context->tensors[first_index].dims;
  const int per_step = first_extent / compiled;
  if (dims == nullptr || first_axis >= dims->size || dims->data[first_axis] % per_step != 0) return {0, 0};
  return {compiled, dims->data[first_axis] / per_step};
}

}  // namespace

int WindowAxis(const TensorSpec& spec, int direction) {
  return direction == 0 ? spec.batch_axis : direction == 1 ? spec.sequence_axis : -1;
}

bool TakesInWindows(const GraphSpec& graph, const ArgSpec& arg, int direction) {
  const TensorSpec* spec = FindTensorSpec(graph, arg.tensor);
  return arg.source == ArgSource::kComputed && spec != nullptr && WindowAxis(*spec, direction) >= 0;
}

BlockRun RunAt(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block, std::string* why,
               bool constants) {
  BlockRun run;
  std::string exact = ShapesAt(context, graph, block, -1, 0, 0, constants);
  if (exact.empty()) {
    run.ok = true;
    return run;
  }
  for (int direction = 0; direction < 2; ++direction) {
    const auto steps = StepsAlong(context, graph, block, direction);
    if (steps.second <= 0 || steps.second == steps.first) continue;
    if (ShapesAt(context, graph, block, direction, steps.second, steps.first, constants).empty()) {
      run.ok = true;
      run.direction = direction;
      run.compiled_steps = steps.first;
      run.steps = steps.second;
      return run;
    }
  }
  if (why != nullptr) *why = exact;
  return run;
}

int64_t RunCost(const BlockRun& run) {
  // A product over this many rows reads its weights about as long as it computes (a guess: each
  // window of a few steps is worth fewer windows of more, even padded).
  constexpr int64_t kRunSteps = 16;
  if (run.direction < 0) return 0;
  const int64_t windows = (std::max(run.steps, run.compiled_steps) + run.compiled_steps - 1) / run.compiled_steps;
  return windows * (run.compiled_steps + kRunSteps);
}

std::string BlockShapeProblem(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block) {
  std::string why;
  RunAt(context, graph, block, &why, /*constants=*/true);
  return why;
}

const TensorSpec* FindTensorSpec(const GraphSpec& graph, int index) {
  const TensorSpec* end = graph.tensors + graph.n_tensor_specs;
  const TensorSpec* it =
      std::lower_bound(graph.tensors, end, index, [](const TensorSpec& s, int i) { return s.index < i; });
  return it != end && it->index == index ? it : nullptr;
}

namespace {

// True when every tensor the graph's blocks touch is as they were compiled for (CheckTensor).
bool ShapesAgree(TfLiteContext* context, const GraphSpec& graph) {
  for (int i = 0; i < graph.n_tensor_specs; ++i) {
    if (!CheckTensor(context, graph, graph.tensors[i].index, /*constant=*/false).empty()) return false;
  }
  return true;
}

// What a graph's kernels can do at the tensors' current shapes: how many nodes its blocks that
// run (as compiled or on windows) replace, and their summed RunCost.
struct Fit {
  int nodes = 0;
  int64_t cost = 0;
  bool Better(const Fit& other) const { return nodes != other.nodes ? nodes > other.nodes : cost < other.cost; }
};
Fit FitAt(TfLiteContext* context, const GraphSpec& graph) {
  Fit fit;
  for (int b = 0; b < graph.n_blocks; ++b) {
    const BlockRun run = RunAt(context, graph, graph.blocks[b], nullptr, /*constants=*/false);
    if (!run.ok) continue;
    fit.nodes += graph.blocks[b].n_nodes;
    fit.cost += RunCost(run);
  }
  return fit;
}

// The bundle's graph for the subgraph in `context`: of those whose operators it has (CheckGraph),
// the first with blocks whose tensor shapes agree too, else the one whose blocks that can run at
// these shapes (on windows of a resized model's steps) replace the most nodes, at the least
// RunCost, else the first with blocks (they are then declined one by one, naming the tensor that
// differs), else one without blocks (the entry subgraph's, which claims nothing). Any graph
// accepted here computes what this subgraph computes (fuse leaves out graphs another subgraph
// could be mistaken for: bundle.indistinguishable), so the choice only decides which shapes'
// kernels run. Null, with the reason, when none matches.
const GraphSpec* SelectGraph(TfLiteContext* context, const Bundle& bundle, std::string* why) {
  const GraphSpec* first = nullptr;
  const GraphSpec* empty = nullptr;
  const GraphSpec* best = nullptr;  // of the others, the one whose kernels replace the most nodes, cheapest
  Fit best_fit;
  for (int g = 0; g < bundle.n_graphs; ++g) {
    const GraphSpec& graph = bundle.graphs[g];
    const std::string problem = CheckGraph(context, graph);
    if (!problem.empty()) {
      if (bundle.n_graphs == 1) *why = problem;
      continue;
    }
    if (graph.n_blocks == 0) {
      if (empty == nullptr) empty = &graph;
      continue;
    }
    if (ShapesAgree(context, graph)) return &graph;
    const Fit fit = FitAt(context, graph);
    if (fit.nodes > 0 && (best == nullptr || fit.Better(best_fit))) best = &graph, best_fit = fit;
    if (first == nullptr) first = &graph;
  }
  if (best != nullptr) return best;
  if (first == nullptr) first = empty;
  if (first == nullptr && bundle.n_graphs == 0) *why = "the bundle holds no kernel for any subgraph of the model";
  if (first == nullptr && bundle.n_graphs > 1) {
    *why = "this subgraph (" + std::to_string(context->tensors_size) + " tensors) is none of the " +
           std::to_string(bundle.n_graphs) + " subgraphs the bundle was built for";
  }
  return first;
}

}  // namespace

Claim ClaimBlocks(TfLiteContext* context, const Bundle& bundle, const Options& options) {
  Claim claim;
  // Another model, or a machine the kernels cannot run on, is the user's to know (a warning);
  // another subgraph of the right model (a control-flow body) is expected.
  std::string why = CheckModel(context, bundle);
  if (why.empty()) why = CpuProblem(bundle);
  if (why.empty()) why = GpuDeviceProblem(bundle);
  const bool expected = why.empty();
  const GraphSpec* selected = why.empty() ? SelectGraph(context, bundle, &why) : nullptr;
  if (selected == nullptr) {
    claim.declined.push_back({-1, why, expected});
    return claim;
  }
  const GraphSpec& graph = *selected;
  claim.graph = selected;
  claim.graph_matches = true;
  const Dataflow flow = ReadDataflow(context);
  for (int b = 0; b < graph.n_blocks; ++b) {
    const BlockSpec& block = graph.blocks[b];
    why = CheckBlock(context, graph, block);
    if (!why.empty()) {
      claim.declined.push_back({b, why});
      continue;
    }
    const bool listed = options.blocks.empty() ||
                        std::find(options.blocks.begin(), options.blocks.end(), block.name) != options.blocks.end();
    if (!listed || options.claim == ClaimPolicy::kNone ||
        (options.claim == ClaimPolicy::kProfitable && !block.profitable)) {
      ++claim.skipped;
      continue;
    }
    claim.blocks.push_back(b);
    claim.decoders[b] = DecoderNodes(flow, graph, block);
  }
  SetBlocks(graph, claim.blocks, &claim);
  return claim;
}

namespace {

// Nodes reachable from `start` along the dataflow, forward (consumers) or backward (producers).
std::set<int> Reachable(const Dataflow& flow, const std::vector<int>& start, bool forward) {
  std::set<int> seen;
  std::vector<int> stack(start);
  while (!stack.empty()) {
    const int n = stack.back();
    stack.pop_back();
    const auto node = flow.nodes.find(n);
    if (node == flow.nodes.end()) continue;
    const TfLiteIntArray* tensors = forward ? node->second->outputs : node->second->inputs;
    for (int k = 0; k < tensors->size; ++k) {
      std::vector<int> next;
      if (forward) {
        const auto c = flow.consumers.find(tensors->data[k]);
        if (c != flow.consumers.end()) next = c->second;
      } else {
        const auto p = flow.producer.find(tensors->data[k]);
        if (p != flow.producer.end()) next = {p->second};
      }
      for (int m : next) {
        if (seen.insert(m).second) stack.push_back(m);
      }
    }
  }
  return seen;
}

// Why TFLite would split `block`: the unclaimed nodes its later nodes wait on. TFLite's partitioner
// emits a delegate partition only once every node it waits on has run, so an unclaimed node that
// one of the block's nodes reads (directly or through other unclaimed nodes), but its first node
// does not wait on, puts the block's nodes into two partitions: a node on a path out of the block
// and back into it, or a node that simply runs later.
std::string SplitReason(const Dataflow& flow, const GraphSpec& graph, const BlockSpec& block,
                        const std::vector<int>& claimed) {
  std::vector<int> members;
  for (int k = 0; k < block.n_nodes; ++k) members.push_back(graph.nodes[block.first_node + k].index);
  const std::set<int> first = Reachable(flow, {members.front()}, /*forward=*/false);
  std::set<int> culprits;
  for (int m : members) {
    const TfLiteNode* node = flow.nodes.count(m) ? flow.nodes.at(m) : nullptr;
    for (int k = 0; node != nullptr && k < node->inputs->size; ++k) {
      const auto p = flow.producer.find(node->inputs->data[k]);
      if (p == flow.producer.end() || first.count(p->second) ||
          std::binary_search(claimed.begin(), claimed.end(), p->second)) {
        continue;
      }
      culprits.insert(p->second);
    }
  }
  std::string named;
  for (int n : culprits) {
    const TfLiteRegistration* r = flow.registrations.at(n);
    const std::string what = r->custom_name != nullptr ? std::string("custom op ") + r->custom_name
                                                       : "builtin code " + std::to_string(r->builtin_code);
    named += (named.empty() ? "" : ", ") + ("node " + std::to_string(n) + " (" + what + ")");
  }
  return "TFLite would split it across delegate partitions: " +
         (named.empty() ? std::string("a node it waits on is left to TFLite")
                        : "it waits on " + named + ", left to TFLite");
}

}  // namespace

namespace {

// The claimed blocks TFLite would keep in one partition each (declining the others with the node
// that splits them); all of them when the context has no partitioning preview.
std::vector<int> WholeBlocks(TfLiteContext* context, const GraphSpec& graph, Claim* claim) {
  if (context->PreviewDelegatePartitioning == nullptr || claim->nodes.empty()) return claim->blocks;
  TfLiteIntArray* nodes = static_cast<TfLiteIntArray*>(std::malloc(sizeof(int) * (1 + claim->nodes.size())));
  if (nodes == nullptr) return claim->blocks;
  nodes->size = static_cast<int>(claim->nodes.size());
  std::copy(claim->nodes.begin(), claim->nodes.end(), nodes->data);
  TfLiteDelegateParams* partitions = nullptr;
  int count = 0;
  const TfLiteStatus status = context->PreviewDelegatePartitioning(context, nodes, &partitions, &count);
  std::free(nodes);
  if (status != kTfLiteOk) return claim->blocks;
  std::map<int, int> partition_of;
  for (int p = 0; p < count; ++p) {
    const TfLiteIntArray* members = partitions[p].nodes_to_replace;
    for (int i = 0; i < members->size; ++i) partition_of[members->data[i]] = p;
  }
  std::vector<int> kept;
  for (int b : claim->blocks) {
    const BlockSpec& block = graph.blocks[b];
    bool whole = true;
    for (int k = 1; k < block.n_nodes; ++k) {
      whole = whole && partition_of[graph.nodes[block.first_node + k].index] ==
                           partition_of[graph.nodes[block.first_node].index];
    }
    if (whole) {
      kept.push_back(b);
    } else {
      claim->declined.push_back({b, SplitReason(ReadDataflow(context), graph, block, claim->nodes)});
    }
  }
  return kept;
}

// The claimed blocks whose group (BlockSpec::group) is claimed whole; the others are declined
// naming the group's unclaimed blocks. MediaPipe's argmax pooling and its unpoolings share an
// index encoding that only the kernels of one runtime agree on (halide_gen/lower/mediapipe.py).
std::vector<int> WholeGroups(const GraphSpec& graph, Claim* claim) {
  std::vector<int> kept;
  for (int b : claim->blocks) {
    const int group = graph.blocks[b].group;
    std::string missing;
    for (int other = 0; group != 0 && other < graph.n_blocks; ++other) {
      if (graph.blocks[other].group == group &&
          std::find(claim->blocks.begin(), claim->blocks.end(), other) == claim->blocks.end()) {
        missing += std::string(missing.empty() ? "" : ", ") + graph.blocks[other].name;
      }
    }
    if (missing.empty()) {
      kept.push_back(b);
    } else {
      claim->declined.push_back({b, "it shares MediaPipe argmax indices with " + missing +
                                        ", left to TFLite: their kernels could encode the indices otherwise"});
    }
  }
  return kept;
}

}  // namespace

void KeepBlocksWhole(TfLiteContext* context, Claim* claim) {
  if (claim->graph == nullptr) return;
  const GraphSpec& graph = *claim->graph;
  // Declining one block can split another or break a group: repeat until nothing changes.
  for (bool changed = true; changed && !claim->blocks.empty();) {
    std::vector<int> kept = WholeGroups(graph, claim);
    if (kept.size() == claim->blocks.size()) kept = WholeBlocks(context, graph, claim);
    changed = kept.size() != claim->blocks.size();
    SetBlocks(graph, kept, claim);
  }
}

}  // namespace dnnfusion
