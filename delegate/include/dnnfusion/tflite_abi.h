// The slice of the TensorFlow Lite C ABI a delegate needs, declared here so the runtime builds
// without TFLite's headers (no package on the build machines ships them) and links no TFLite
// symbol: the interpreter hands us every function we call through TfLiteContext.
//
// The layouts must match the interpreter byte for byte. They have been stable from
// tflite-runtime 2.14 to ai-edge-litert 2.3 (TF 2.22); the static_asserts below pin the sizes
// and offsets that matter on LP64 (Linux x86-64, AArch64, Android arm64-v8a). There is no
// switch to TFLite's own headers: no package ships them, so such a path could never be built or
// tested here; the asserts are what keeps these declarations honest.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef enum TfLiteStatus {
  kTfLiteOk = 0,
  kTfLiteError = 1,
  kTfLiteDelegateError = 2,
  kTfLiteApplicationError = 3,
  kTfLiteDelegateDataNotFound = 4,
  kTfLiteDelegateDataWriteError = 5,
  kTfLiteDelegateDataReadError = 6,
  kTfLiteUnresolvedOps = 7,
  kTfLiteCancelled = 8,
} TfLiteStatus;

typedef enum TfLiteType {
  kTfLiteNoType = 0,
  kTfLiteFloat32 = 1,
  kTfLiteInt32 = 2,
  kTfLiteUInt8 = 3,
  kTfLiteInt64 = 4,
  kTfLiteString = 5,
  kTfLiteBool = 6,
  kTfLiteInt16 = 7,
  kTfLiteComplex64 = 8,
  kTfLiteInt8 = 9,
  kTfLiteFloat16 = 10,
  kTfLiteFloat64 = 11,
  kTfLiteInt4 = 18,  // two a byte, the first in the low nibble
} TfLiteType;

typedef enum TfLiteAllocationType {
  kTfLiteMemNone = 0,
  kTfLiteMmapRo,
  kTfLiteArenaRw,
  kTfLiteArenaRwPersistent,
  kTfLiteDynamic,
  kTfLitePersistentRo,
  kTfLiteCustom,
  kTfLiteVariantObject,
  kTfLiteNonCpu,
} TfLiteAllocationType;

typedef enum TfLiteDelegateFlags {
  kTfLiteDelegateFlagsNone = 0,
  kTfLiteDelegateFlagsAllowDynamicTensors = 1,
} TfLiteDelegateFlags;

typedef struct TfLiteIntArray {
  int size;
  int data[];
} TfLiteIntArray;

typedef struct TfLiteQuantizationParams {
  float scale;
  int32_t zero_point;
} TfLiteQuantizationParams;

typedef struct TfLiteQuantization {
  int type;
  void* params;
} TfLiteQuantization;

typedef union TfLitePtrUnion {
  int32_t* i32;
  float* f;
  char* raw;
  const char* raw_const;
  uint8_t* uint8;
  int8_t* int8;
  void* data;
} TfLitePtrUnion;

struct TfLiteDelegate;
struct TfLiteRegistration;

typedef struct TfLiteTensor {
  TfLiteType type;
  TfLitePtrUnion data;
  TfLiteIntArray* dims;
  TfLiteQuantizationParams params;
  TfLiteAllocationType allocation_type;
  size_t bytes;
  const void* allocation;
  const char* name;
  struct TfLiteDelegate* delegate;
  int buffer_handle;
  bool data_is_stale;
  bool is_variable;
  TfLiteQuantization quantization;
  void* sparsity;
  const TfLiteIntArray* dims_signature;
} TfLiteTensor;

typedef struct TfLiteNode {
  TfLiteIntArray* inputs;
  TfLiteIntArray* outputs;
  TfLiteIntArray* intermediates;
  TfLiteIntArray* temporaries;
  void* user_data;
  void* builtin_data;
  const void* custom_initial_data;
  int custom_initial_data_size;
  struct TfLiteDelegate* delegate;
  bool might_have_side_effect;
} TfLiteNode;

typedef struct TfLiteDelegateParams {
  struct TfLiteDelegate* delegate;
  TfLiteIntArray* nodes_to_replace;
  TfLiteIntArray* input_tensors;
  TfLiteIntArray* output_tensors;
} TfLiteDelegateParams;

typedef struct TfLiteContext {
  size_t tensors_size;
  TfLiteStatus (*GetExecutionPlan)(struct TfLiteContext* context, TfLiteIntArray** execution_plan);
  TfLiteTensor* tensors;
  void* impl_;
  TfLiteStatus (*ResizeTensor)(struct TfLiteContext*, TfLiteTensor* tensor, TfLiteIntArray* new_size);
  void (*ReportError)(struct TfLiteContext*, const char* msg, ...);
  TfLiteStatus (*AddTensors)(struct TfLiteContext*, int tensors_to_add, int* first_new_tensor_index);
  TfLiteStatus (*GetNodeAndRegistration)(struct TfLiteContext*, int node_index, TfLiteNode** node,
                                         struct TfLiteRegistration** registration);
  TfLiteStatus (*ReplaceNodeSubsetsWithDelegateKernels)(struct TfLiteContext*,
                                                        struct TfLiteRegistration registration,
                                                        const TfLiteIntArray* nodes_to_replace,
                                                        struct TfLiteDelegate* delegate);
  int recommended_num_threads;
  void* (*GetExternalContext)(struct TfLiteContext*, int);
  void (*SetExternalContext)(struct TfLiteContext*, int, void*);
  bool allow_fp32_relax_to_fp16;
  void* profiler;
  void* (*AllocatePersistentBuffer)(struct TfLiteContext* ctx, size_t bytes);
  TfLiteStatus (*AllocateBufferForEval)(struct TfLiteContext* ctx, size_t bytes, void** ptr);
  TfLiteStatus (*RequestScratchBufferInArena)(struct TfLiteContext* ctx, size_t bytes, int* buffer_idx);
  void* (*GetScratchBuffer)(struct TfLiteContext* ctx, int buffer_idx);
  TfLiteStatus (*ResizeTensorExplicit)(struct TfLiteContext* ctx, TfLiteTensor* tensor, int dims,
                                       const int* shape);
  TfLiteStatus (*PreviewDelegatePartitioning)(struct TfLiteContext* context, const TfLiteIntArray* nodes_to_replace,
                                              TfLiteDelegateParams** partition_params_array, int* num_partitions);
  TfLiteTensor* (*GetTensor)(const struct TfLiteContext* context, int tensor_idx);
  void* (*GetEvalTensor)(const struct TfLiteContext* context, int tensor_idx);
  TfLiteStatus (*GetModelMetadata)(const struct TfLiteContext* context, const char* name, const char** ptr,
                                   size_t* bytes);
} TfLiteContext;

typedef struct TfLiteRegistration {
  void* (*init)(TfLiteContext* context, const char* buffer, size_t length);
  void (*free)(TfLiteContext* context, void* buffer);
  TfLiteStatus (*prepare)(TfLiteContext* context, TfLiteNode* node);
  TfLiteStatus (*invoke)(TfLiteContext* context, TfLiteNode* node);
  const char* (*profiling_string)(const TfLiteContext* context, const TfLiteNode* node);
  int32_t builtin_code;
  const char* custom_name;
  int version;
  void* registration_external;
  void* async_kernel;
  uint64_t inplace_operator;
} TfLiteRegistration;

typedef struct TfLiteDelegate {
  void* data_;
  TfLiteStatus (*Prepare)(TfLiteContext* context, struct TfLiteDelegate* delegate);
  TfLiteStatus (*CopyFromBufferHandle)(TfLiteContext* context, struct TfLiteDelegate* delegate, int buffer_handle,
                                       TfLiteTensor* tensor);
  TfLiteStatus (*CopyToBufferHandle)(TfLiteContext* context, struct TfLiteDelegate* delegate, int buffer_handle,
                                     TfLiteTensor* tensor);
  void (*FreeBufferHandle)(TfLiteContext* context, struct TfLiteDelegate* delegate, int* handle);
  int64_t flags;
  void* opaque_delegate_builder;  // must stay NULL: we are a classic (non-opaque) delegate
} TfLiteDelegate;

}  // extern "C"

namespace tflite {

// The op-level profiler behind TfLiteContext::profiler. Only the virtual table matters: the
// order of the virtual functions is the ABI (Itanium: two destructor slots, then declaration
// order), unchanged since TF 2.5.
class Profiler {
 public:
  enum class EventType {
    DEFAULT = 1,
    OPERATOR_INVOKE_EVENT = 2,
    DELEGATE_OPERATOR_INVOKE_EVENT = 4,
  };
  virtual ~Profiler() {}
  virtual uint32_t BeginEvent(const char* tag, EventType event_type, int64_t event_metadata1,
                              int64_t event_metadata2) = 0;
  virtual void EndEvent(uint32_t event_handle, int64_t event_metadata1, int64_t event_metadata2) = 0;
  virtual void EndEvent(uint32_t event_handle) = 0;
};

}  // namespace tflite

#if defined(__LP64__) || defined(_LP64)
static_assert(sizeof(TfLiteTensor) == 112, "TfLiteTensor layout differs from TFLite's");
static_assert(offsetof(TfLiteTensor, data) == 8, "TfLiteTensor::data offset");
static_assert(offsetof(TfLiteTensor, dims) == 16, "TfLiteTensor::dims offset");
static_assert(offsetof(TfLiteTensor, allocation_type) == 32, "TfLiteTensor::allocation_type offset");
static_assert(offsetof(TfLiteTensor, bytes) == 40, "TfLiteTensor::bytes offset");
static_assert(offsetof(TfLiteTensor, name) == 56, "TfLiteTensor::name offset");
static_assert(offsetof(TfLiteTensor, delegate) == 64, "TfLiteTensor::delegate offset");
static_assert(offsetof(TfLiteTensor, dims_signature) == 104, "TfLiteTensor::dims_signature offset");
static_assert(sizeof(TfLiteNode) == 80, "TfLiteNode layout differs from TFLite's");
static_assert(offsetof(TfLiteNode, user_data) == 32, "TfLiteNode::user_data offset");
static_assert(offsetof(TfLiteNode, delegate) == 64, "TfLiteNode::delegate offset");
static_assert(sizeof(TfLiteRegistration) == 88, "TfLiteRegistration is passed by value: size must match");
static_assert(offsetof(TfLiteRegistration, builtin_code) == 40, "TfLiteRegistration::builtin_code offset");
static_assert(offsetof(TfLiteRegistration, custom_name) == 48, "TfLiteRegistration::custom_name offset");
static_assert(sizeof(TfLiteDelegate) == 56, "TfLiteDelegate layout differs from TFLite's");
static_assert(sizeof(TfLiteDelegateParams) == 32, "TfLiteDelegateParams layout");
static_assert(offsetof(TfLiteContext, tensors) == 16, "TfLiteContext::tensors offset");
static_assert(offsetof(TfLiteContext, ReplaceNodeSubsetsWithDelegateKernels) == 64, "TfLiteContext layout");
static_assert(offsetof(TfLiteContext, recommended_num_threads) == 72, "TfLiteContext::recommended_num_threads");
static_assert(offsetof(TfLiteContext, profiler) == 104, "TfLiteContext::profiler offset");
static_assert(offsetof(TfLiteContext, GetModelMetadata) == 176, "TfLiteContext::GetModelMetadata offset");
#endif
