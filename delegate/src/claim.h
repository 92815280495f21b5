// Claiming: which of the bundle's blocks this graph can run. Every check compares the bundle
// table with what TFLite hands the delegate; anything that differs declines the block (or the
// whole bundle) with a reason, and those nodes stay with TFLite.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dnnfusion/bundle.h"
#include "dnnfusion/tflite_abi.h"
#include "options.h"

namespace dnnfusion {

constexpr int kBuiltinDequantize = 6;  // BuiltinOperator_DEQUANTIZE
constexpr int kBuiltinCustom = 32;     // BuiltinOperator_CUSTOM
constexpr int kBuiltinDensify = 124;   // BuiltinOperator_DENSIFY

struct Decline {
  int block;  // index into the claim's GraphSpec::blocks, or -1 for the whole bundle
  std::string reason;
  bool expected = false;  // another subgraph of the model (a control-flow body): logged at info only
};

struct Claim {
  bool graph_matches = false;   // the subgraph is one the bundle was built for
  const GraphSpec* graph = nullptr;  // the bundle's table for it (null when none matches)
  std::vector<int> blocks;      // claimed block indices into graph->blocks, in execution order
  std::vector<int> nodes;       // their node indices and their decoders', ascending
  // block -> the DEQUANTIZE / DENSIFY nodes decoding its stored weights (ArgSource::kDecoded),
  // which the delegate runs itself with TFLite's kernels (once, into persistent memory): XNNPACK,
  // applied after it, takes a DENSIFY whose DEQUANTIZE feeds a node it does not run and never
  // writes its output (sparse fp16 weights), and decoders left to TFLite between claimed nodes
  // would split partitions.
  std::map<int, std::vector<int>> decoders;
  std::vector<Decline> declined;
  int skipped = 0;  // matching blocks left to TFLite by the claim policy or block list
};

// Checks the bundle against the graph in `context`, picks the bundle's table for that subgraph and
// decides what to claim under the options' policy (and block list).
Claim ClaimBlocks(TfLiteContext* context, const Bundle& bundle, const Options& options);

// Drops claimed blocks that TFLite would split across delegate partitions (it partitions the
// claimed nodes itself: a block whose later node also waits on a node left to TFLite lands in two
// partitions), and blocks of a group (BlockSpec::group) not claimed whole, until none is left.
// Uses the context's partitioning preview.
void KeepBlocksWhole(TfLiteContext* context, Claim* claim);

// The shape of tensor `t` as text, e.g. "[1,8,8,3]".
std::string ShapeText(const TfLiteIntArray* dims);

// Why a tensor block `block` reads or writes differs from the graph's spec (type, shape, a constant
// that is not, a size known only as the model runs), or "" when none does: none differs, or the
// block may run once per item (BlockSpec::per_item) and its batch-carrying tensors hold a whole
// number of the items it was compiled for.
std::string BlockShapeProblem(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block);

// How many times the block's kernel runs at its tensors' current shapes: 1 where they are as
// compiled, B where a per-item block's batch-carrying tensors hold B times its compiled batch, 0
// (`why` says which tensor differs) otherwise. `constants`: also check constant arguments are.
int BlockItems(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block, std::string* why,
               bool constants = true);

// The spec of tensor `index` in a graph of the bundle, or nullptr.
const TensorSpec* FindTensorSpec(const GraphSpec& graph, int index);

}  // namespace dnnfusion
