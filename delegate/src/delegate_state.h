// What one delegate instance (one tflite_plugin_create_delegate call) holds: its options and the
// bundle, read-only after creation, so interpreters may share the delegate.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "dnnfusion/bundle.h"
#include "memory_plan.h"
#include "options.h"

namespace dnnfusion {

struct DelegateState {
  Options options;
  const Bundle* bundle = nullptr;
  std::mutex report_mutex;  // serialises appends to options.report and options.profile
  bool report_warned = false;   // a failed append to options.report was said (once)
  bool profile_warned = false;  // the same for options.profile
  int last_node = -1;       // the execution plan's last node when the delegate last claimed
  SharedArena arena;        // the partitions' internal tensors (memory_plan.h)
  // Who holds the state: the delegate and each partition it made. A host may destroy the delegate
  // before the interpreter frees its partitions (a Python process's teardown finalizes objects in
  // no fixed order); their destructors still write the profile to the path they were given.
  std::atomic<int> holders{1};

  // The bundle's graph the last claim in `context`'s subgraph used: its partitions, created
  // while that claim replaces nodes, read it.
  void SetGraph(const TfLiteContext* context, const GraphSpec* graph) {
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    graph_of_[context] = graph;
  }
  const GraphSpec* GraphOf(const TfLiteContext* context) {
    std::lock_guard<std::mutex> lock(graphs_mutex_);
    const auto it = graph_of_.find(context);
    return it == graph_of_.end() ? nullptr : it->second;
  }

 private:
  std::mutex graphs_mutex_;
  std::map<const TfLiteContext*, const GraphSpec*> graph_of_;
};

// Takes one more hold of `state` (a partition made from it).
inline DelegateState& Hold(DelegateState& state) {
  state.holders.fetch_add(1, std::memory_order_relaxed);
  return state;
}

// Gives back one hold; the last frees the state.
inline void Release(DelegateState* state) {
  if (state != nullptr && state->holders.fetch_sub(1, std::memory_order_acq_rel) == 1) delete state;
}

}  // namespace dnnfusion
