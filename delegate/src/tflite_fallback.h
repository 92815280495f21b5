// TFLite's own kernels for some of a partition's nodes: all of them, in the partition's place,
// when a resize gives its tensors shapes the bundle's kernels were not built for; the decoders of
// its blocks' stored weights, always (claim.h says why the delegate runs them).
//
// A delegate that allows dynamic tensors (bundles of models with run-time shapes, plugin.cc) stays
// in the graph across `resize_tensor_input`: TFLite re-prepares the partition instead of running
// the claim again, so the partition cannot decline then. It runs the nodes it replaced itself,
// with the registrations and node data TFLite made for them: the model runs as in stock LiteRT.
//
// The nodes are copied when the partition is created (the only time TFLite lets a delegate read
// them). Each copy gets a temporaries array of its own, since a kernel's prepare replaces it.
// TFLite's arena plans only the nodes in its execution plan, and these are not: the memory of
// tensors written inside the partition, and of the kernels' temporaries, is the fallback's own,
// bound to them before each node runs (TFLite may reset an arena tensor's pointer in between).
// Tensors a kernel makes dynamic are TFLite's to allocate, as always.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "dnnfusion/tflite_abi.h"

namespace dnnfusion {

class TfliteFallback {
 public:
  TfliteFallback() = default;
  ~TfliteFallback();
  TfliteFallback(const TfliteFallback&) = delete;
  TfliteFallback& operator=(const TfliteFallback&) = delete;

  // Copies the nodes (in execution order) and their registrations; `outputs`: the tensors read
  // after the partition, kept in TFLite's persistent arena with `persistent_outputs` (decoded
  // weights, written once). Call from the partition's init, inside the delegate's Prepare.
  // Returns an error message, or "".
  std::string Capture(TfLiteContext* context, const std::vector<int>& nodes, const std::vector<int>& outputs,
                      bool persistent_outputs = false);

  // Prepares every node in order for the tensors' current shapes.
  TfLiteStatus Prepare(TfLiteContext* context);

  // Runs every node in order.
  TfLiteStatus Invoke(TfLiteContext* context);

 private:
  struct Node {
    int index = -1;
    TfLiteNode node{};
    TfLiteRegistration registration{};
  };
  struct Block {  // aligned memory of one tensor's, kept across Prepares (persistent tensors' content too)
    void* data = nullptr;
    size_t bytes = 0;
  };
  // The tensors of `node` whose memory is ours: internal outputs and temporaries of arena type.
  std::vector<int> OwnMemory(TfLiteContext* context, const TfLiteNode& node) const;
  // Grows `tensor`'s block to its size (keeping the content) and points the tensor at it.
  TfLiteStatus Bind(TfLiteContext* context, int tensor);

  std::vector<Node> nodes_;
  std::set<int> internal_;  // tensors written and read only inside the partition
  std::set<int> outputs_;   // with persistent_outputs: the nodes' outputs read after the partition
  std::map<int, Block> memory_;
};

}  // namespace dnnfusion
