// The kernel bundle: a table, generated per model and target by `tflite_tools fuse`
// (halide_gen/bundle.py), describing every fused block the library can run — which graph nodes
// it replaces, which tensors its Halide kernel reads and writes (with their types and shapes),
// and the kernel's entry point through Halide's argv interface.
//
// The runtime never trusts the table: at Prepare it checks each block against the graph TFLite
// hands it and claims only the blocks that match (claim.cc).
#pragma once

#include <cstdint>

namespace dnnfusion {

constexpr int kMaxRank = 8;

// How a constant argument is laid out for the kernel (mirror of halide_gen/pack.py).
enum class Pack : int32_t {
  kNone = 0,
  kOhwiToHwio = 1,   // CONV_2D filter [O, kh, kw, I] -> [kh, kw, I, O padded]
  kOiToIo = 2,       // FULLY_CONNECTED weights [units, in] -> [in, units padded]
  kPadChannels = 3,  // pad the innermost (channel) axis
  kOBlocked = 4,     // matrix-vector weights [O, ...] -> [O padded / tile, ..., tile]
};

// A tensor as the model was compiled: its index in the subgraph, TfLiteType and shape
// (TFLite order, outermost first).
struct TensorSpec {
  int32_t index;
  int32_t type;
  int32_t rank;
  int32_t dims[kMaxRank];
};

// A graph node a block replaces: its index, builtin operator code, and its input and output
// tensor indices (a slice of Bundle::node_tensors; -1 marks an omitted optional input).
struct NodeSpec {
  int32_t index;
  int32_t builtin_code;
  int32_t first_io;
  int32_t n_inputs;
  int32_t n_outputs;
};

// One kernel argument: the tensor it reads, whether it is a constant, how it is packed, and the
// shape the kernel sees after packing (TFLite order).
struct ArgSpec {
  int32_t tensor;
  int32_t constant;
  Pack pack;
  int32_t rank;
  int32_t dims[kMaxRank];
};

typedef int (*KernelEntry)(void** args);

struct BlockSpec {
  const char* name;       // as in plan.json and report.md
  const char* signature;  // the kernel's block signature (identical blocks share a kernel)
  KernelEntry kernel;     // Halide's `<name>_argv`: inputs, then outputs, as halide_buffer_t*
  int32_t profitable;     // measured (or estimated) faster than TFLite on the same nodes
  int32_t first_node, n_nodes;      // slice of Bundle::nodes
  int32_t first_arg, n_args;        // slice of Bundle::args
  int32_t first_output, n_outputs;  // slice of Bundle::outputs (tensor indices)
  // Blocks with the same nonzero group are claimed together or not at all: a MediaPipe argmax
  // pooling and the unpoolings that read its indices (their encoding is the kernels' own).
  int32_t group;
};

struct Bundle {
  const char* model;        // the model's file name, for messages
  const char* target;       // halide_gen.aot target name
  const char* fingerprint;  // structure hash, also stored in the fused model's metadata
  int32_t channel_tile;     // padding multiple of packed constants
  int32_t n_tensors;        // tensors in the subgraph
  int32_t n_graph_nodes;    // nodes in the subgraph, and their builtin codes in order:
  const int32_t* graph_codes;
  const TensorSpec* tensors;  // every tensor a block touches, sorted by index
  int32_t n_tensor_specs;
  const NodeSpec* nodes;
  const int32_t* node_tensors;
  const ArgSpec* args;
  const int32_t* outputs;
  const BlockSpec* blocks;
  int32_t n_blocks;
  // The claim policy when the options name none (ClaimPolicy: 0 profitable, 1 all, 2 none):
  // `fuse --measure` picks whichever ran the whole model fastest here, XNNPACK alone included.
  int32_t default_claim;
  // 1 when the model has custom ops: only a delegate applied after this one (XNNPACK, for
  // MediaPipe's) may run them, so TFLite must not prepare the graph before that (plugin.cc).
  int32_t has_custom_ops;
  // Where the kernels run and how, from the target (halide_gen.aot.TargetSpec), so that the
  // runtime reads fields instead of parsing the target's name.
  int32_t gpu_api;                  // GpuApi
  int32_t half_precision;           // 1: float tensors stored as fp16 (--gpu-precision fp16)
  const char* vulkan_alloc_config;  // HL_VK_ALLOC_CONFIG unless the environment sets one
};

// Bundle::gpu_api.
enum GpuApi : int32_t { kNoGpu = 0, kOpenCl = 1, kVulkan = 2 };

// Defined by the generated bundle source linked into each delegate library.
const Bundle& bundle();

// The metadata entry of a fused model that carries Bundle::fingerprint.
constexpr const char* kFingerprintMetadata = "dnnfusion.fingerprint";

}  // namespace dnnfusion
