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
// block may run on windows of its compiled steps (BlockRun) at the shapes they have now.
std::string BlockShapeProblem(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block);

// How a block's kernel runs at its tensors' current shapes: as compiled (`direction` -1), or, where
// the model was resized along a direction the block may run windowed in (BlockSpec::windows), on
// windows of its compiled steps along it: its tensors carrying the direction (those of its outputs
// and non-constant arguments whose TensorSpec names an axis for it) hold `steps` steps there, the
// kernel takes `compiled_steps`; every other dimension and tensor is as compiled.
struct BlockRun {
  bool ok = false;  // false: neither (`why` says which tensor differs)
  int direction = -1;
  int steps = 0;
  int compiled_steps = 0;
};
BlockRun RunAt(TfLiteContext* context, const GraphSpec& graph, const BlockSpec& block, std::string* why,
               bool constants = true);

// What running a block so costs beside running it as compiled (0), in steps computed: each window
// computes the compiled steps, and costs as many again as a window of kRunSteps steps (the weights
// read again). Chooses between graphs compiled at other shapes that could each run a resized model.
int64_t RunCost(const BlockRun& run);

// The axis of tensor `spec` carrying `direction` (0: the batch, 1: the sequence), or -1.
int WindowAxis(const TensorSpec& spec, int direction);

// Whether a block run on windows along `direction` takes argument `arg` in windows (a tensor it
// computes from, carrying the direction), not whole (weights, a tensor every step shares).
bool TakesInWindows(const GraphSpec& graph, const ArgSpec& arg, int direction);

// The spec of tensor `index` in a graph of the bundle, or nullptr.
const TensorSpec* FindTensorSpec(const GraphSpec& graph, int index);

}  // namespace dnnfusion
