// One delegated partition: the TFLite node that replaces a connected run of claimed nodes. It
// runs the blocks inside it in order, each through its Halide kernel, on buffers bound to the
// TFLite tensors at every Invoke, with an arena of its own for the tensors internal to it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "HalideRuntime.h"
#include "delegate_state.h"
#include "dnnfusion/tflite_abi.h"

namespace dnnfusion {

class Partition {
 public:
  Partition(const DelegateState& state, const TfLiteDelegateParams& params);

  // Binds buffers, packs constants and plans the arena the first time; checks shapes every time
  // (TFLite prepares a delegate kernel more than once, and again after a resize).
  TfLiteStatus Prepare(TfLiteContext* context);

  // Runs every block of the partition.
  TfLiteStatus Invoke(TfLiteContext* context);

 private:
  // One kernel argument or output, as a Halide buffer over a TFLite tensor, a packed constant, or
  // a slice of the arena.
  struct Binding {
    int tensor = -1;
    bool output = false;
    bool internal = false;     // lives in the arena
    size_t arena_offset = 0;
    int packed = -1;           // index into packed_, for packed constants
    std::vector<halide_dimension_t> dims;
    halide_buffer_t buffer{};
  };
  struct Step {
    int block = -1;  // index into the bundle
    std::vector<Binding> bindings;
    std::vector<void*> argv;
  };

  TfLiteStatus Fail(TfLiteContext* context, const std::string& message);
  TfLiteStatus Build(TfLiteContext* context);
  TfLiteStatus CheckShapes(TfLiteContext* context) const;

  const DelegateState& state_;
  std::vector<int> nodes_;    // the nodes this partition replaces
  std::vector<int> outputs_;  // tensors TFLite reads after the partition
  std::vector<Step> steps_;
  std::vector<std::vector<uint8_t>> packed_;
  std::vector<uint8_t> arena_;
  std::string error_;  // a problem found at construction, reported at Prepare
  bool built_ = false;
};

}  // namespace dnnfusion
