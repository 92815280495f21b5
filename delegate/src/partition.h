// One delegated partition: the TFLite node that replaces a connected run of claimed nodes. It
// runs the blocks inside it in order, each through its Halide kernel.
//
// Every tensor the partition touches has one Halide buffer, shared by all the blocks that read or
// write it: on a GPU target a block's output stays on the device for the next block, and copies
// happen only at the partition's edges — inputs are marked host-dirty at each Invoke (Halide
// uploads them when a kernel first reads them), weights are marked once, outputs are copied back
// after the block that writes them. On a CPU target the same flags cost nothing. A GPU kernel
// cannot fail an invoke, so indices it reads from data (GATHER's) are checked here on the host
// before it runs, as the CPU kernels check them themselves.
//
// Weights stored compactly (fp16, int8, sparse) are decoded by their DEQUANTIZE / DENSIFY nodes,
// which the delegate claims with the blocks and runs once with TFLite's kernels (claim.h), into
// persistent memory: the partition takes them at its first Invoke (packing them, when the kernel
// wants another layout) and again only after a Prepare.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "HalideRuntime.h"
#include "claim.h"
#include "delegate_state.h"
#include "dnnfusion/tflite_abi.h"
#include "memory_plan.h"
#include "page_scan.h"
#include "tflite_fallback.h"

namespace dnnfusion {

class Partition {
 public:
  // Called from the partition's init, inside the delegate's Prepare (the nodes are read then).
  Partition(TfLiteContext* context, DelegateState& state, const TfLiteDelegateParams& params);
  ~Partition();
  Partition(const Partition&) = delete;
  Partition& operator=(const Partition&) = delete;

  // Binds buffers, packs constants and plans the arena the first time; checks shapes every time
  // (TFLite prepares a delegate kernel more than once, and again after a resize). At shapes the
  // kernels were not built for, the partition runs the kernels another graph of the bundle holds for
  // them (GraphForShapes), or else hands itself to TFLite's own kernels (tflite_fallback.h) until a
  // resize brings known shapes back.
  TfLiteStatus Prepare(TfLiteContext* context);

  // Runs every block of the partition (or TFLite's kernels for its nodes, after such a resize).
  TfLiteStatus Invoke(TfLiteContext* context);

 private:
  enum class Role {
    kInput,     // read from TFLite's memory, written before the partition runs
    kConstant,  // a weight: TFLite's read-only data, or a packed copy the partition owns
    kDecoded,   // a weight its decoders write before the partition first runs: taken then, as kConstant
    kInternal,  // written and read only inside the partition: lives in the arena
    kOutput,    // written here, read by TFLite after: TFLite's memory
    kScratch,   // a GPU kernel's own intermediate (ScratchSpec): allocated once, lives on the device
  };
  struct Buffer {
    int tensor = -1;
    Role role = Role::kInput;
    size_t arena_offset = 0;
    int pack = 0;                  // Pack: the layout the kernel reads
    bool half = false;             // a float32 constant the kernel reads in fp16 (ArgSpec::half)
    size_t stored_bytes = 0;       // bytes of an element as TFLite stores it (the kernel's may differ)
    AlignedBytes packed;           // the packed copy, when `pack` is not kNone
    const int32_t* packed_dims = nullptr;  // its shape, TFLite order (the bundle's ArgSpec::dims)
    const void* taken = nullptr;   // kDecoded: the TFLite data last bound (packed: the data packed)
    // kOutput whose TFLite memory is not kBufferAlignment-aligned: the kernel writes `shadow`
    // (aligned inside), and the step copies it to `copy_to` after.
    AlignedBytes shadow;
    void* copy_to = nullptr;
    size_t copy_bytes = 0;
    std::vector<halide_dimension_t> dims;
    halide_buffer_t raw{};
  };
  // Indices a GPU kernel reads unchecked (device code cannot fail an invoke): each innermost
  // position k must lie in [0, bounds[k % n_bounds]), checked on the host before the block runs.
  struct IndexCheck {
    Buffer* buffer = nullptr;
    const int32_t* bounds = nullptr;
    int n_bounds = 0;
    const char* op = "";
  };
  struct Step {
    int block = -1;                // index into the bundle
    int64_t calls = 0;             // invokes timed (option `profile`)
    double seconds = 0.0;
    std::vector<void*> argv;       // halide_buffer_t*: the kernel's arguments, then its outputs
    std::vector<Buffer*> to_host;  // outputs the partition hands back to TFLite
    std::vector<IndexCheck> index_checks;
    // The block's in-place form runs where each pair's input and output share memory (a KV cache
    // the caller passes in and out as one buffer): empty when the block has none, or when a pair
    // is a tensor internal to the partition (memory of ours, never shared).
    std::vector<std::pair<const Buffer*, const Buffer*>> in_place;
    // Where the model was resized along a direction the block runs windowed in (RunAt), the kernel
    // runs on windows of the compiled steps of the buffers in `cut`: side by side, the last ending
    // at the last step; with fewer steps than compiled, once on copies padded to the compiled steps.
    BlockRun run;
    struct Cut {
      Buffer* buffer = nullptr;
      uint8_t* base = nullptr;  // the buffer's memory while the windows run over it
      size_t step_bytes = 0;    // one step's bytes
      bool output = false;
      AlignedBytes padded;    // the compiled steps' bytes, where the tensor holds fewer
    };
    std::deque<Cut> cut;
  };

  TfLiteStatus Fail(TfLiteContext* context, const std::string& message);
  TfLiteStatus Build(TfLiteContext* context);
  // True when every pair shares its memory (and there is one): the block's in-place form may run.
  static bool SharesMemory(const std::vector<std::pair<const Buffer*, const Buffer*>>& pairs);
  // "" when every tensor has the shape the kernels were built for (on windows where the steps run
  // so); else which one differs.
  std::string ShapeChange(TfLiteContext* context) const;
  // A graph of the bundle for this subgraph (a `fuse --shape` variant, or the model's own shapes
  // again, run on windows of a resized model's steps) holding this partition's blocks, node for node, at
  // the shapes the tensors have now, one compiled for exactly those shapes first; null when none does.
  const GraphSpec* GraphForShapes(TfLiteContext* context, std::vector<int>* blocks) const;
  // Runs step's kernel (on windows where it runs so), then hands its outputs back to TFLite.
  int RunStep(Step& step);
  // Runs a windowed step's kernel on each window of its steps (Step::run).
  int RunWindows(Step& step);
  // Makes `graph`'s `blocks` the partition's steps; what was built for the old graph is dropped.
  void Rebind(const GraphSpec& graph, const std::vector<int>& blocks);
  void FreeDeviceMemory();
  void WriteProfile() const;
  // Fills `b`'s copy of constant or decoded `t` in the kernel's layout and element type, reading
  // Buffer::stored_bytes an element of `t`.
  bool PackWeight(const TfLiteTensor& t, Buffer& b) const;
  TfLiteStatus TakeDecoded(TfLiteContext* context, Buffer& b);
  Buffer* ScratchBuffer(const ScratchSpec& spec, std::string* error);
  // The buffer of `tensor` as the kernels read it (`pack`, in fp16 where `half`); a constant is bound
  // or packed, and the model's pages of a packed one handed back where they lie in `mappings`
  // (page_scan.h).
  Buffer* BufferFor(TfLiteContext* context, int tensor, int pack, bool half, int rank, const int32_t* dims,
                    Role role, const ReadOnlyFileMappings& mappings, std::string* error);

  DelegateState& state_;
  const GraphSpec* graph_;    // the bundle's table for this partition's subgraph
  std::vector<int> nodes_;    // the nodes this partition replaces
  bool ends_invoke_ = false;  // it holds the execution plan's last node: nothing of TFLite's runs after it
  std::vector<int> outputs_;  // tensors TFLite reads after the partition
  std::vector<Step> steps_;
  std::deque<Buffer> buffers_;                  // stable addresses: steps point into it
  std::map<std::tuple<int, int, bool>, Buffer*> by_key_;  // (tensor, packing, half) -> its buffer
  std::map<int, size_t> arena_offset_;          // internal tensor -> offset
  size_t arena_bytes_ = 0;                      // the arena the internal tensors need (state_.arena)
  AlignedBytes own_arena_;                      // used when another invoke holds the shared arena
  uint8_t* arena_base_ = nullptr;               // where the internal buffers point: offsets count from here
  std::string error_;  // a problem found at construction, reported at Prepare
  bool built_ = false;
  TfliteFallback decoders_;  // the DEQUANTIZE / DENSIFY nodes decoding blocks' stored weights
  bool decoded_ = false;     // they ran since the last Prepare
  TfliteFallback fallback_;  // every node, after a resize to shapes the kernels were not built for
  bool falling_back_ = false;  // the last Prepare found shapes the kernels were not built for
  std::string custom_op_;      // a custom op among the nodes: no fallback to TFLite's kernels then
};

}  // namespace dnnfusion
