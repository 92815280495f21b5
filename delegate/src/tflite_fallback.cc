#include "tflite_fallback.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dnnfusion {
namespace {

constexpr size_t kAlignment = 64;  // what TFLite's arena gives: kernels may vectorize on it

// A TfLiteIntArray as TFLite allocates one: TFLite frees these with free().
TfLiteIntArray* NewIntArray(int size) {
  auto* array = static_cast<TfLiteIntArray*>(std::malloc(sizeof(TfLiteIntArray) + sizeof(int) * size));
  if (array != nullptr) array->size = size;
  return array;
}

bool InArena(const TfLiteTensor& t) {
  return t.allocation_type == kTfLiteArenaRw || t.allocation_type == kTfLiteArenaRwPersistent;
}

}  // namespace

TfliteFallback::~TfliteFallback() {
  for (Node& n : nodes_) std::free(n.node.temporaries);  // ours: see Capture
  for (auto& [tensor, block] : memory_) std::free(block.data);
}

std::string TfliteFallback::Capture(TfLiteContext* context, const std::vector<int>& nodes,
                                    const std::vector<int>& outputs, bool persistent_outputs) {
  std::set<int> written;
  for (int index : nodes) {
    TfLiteNode* node = nullptr;
    TfLiteRegistration* registration = nullptr;
    if (context->GetNodeAndRegistration(context, index, &node, &registration) != kTfLiteOk) {
      return "cannot read node " + std::to_string(index);
    }
    Node copy;
    copy.index = index;
    copy.node = *node;
    copy.registration = *registration;
    // The original node keeps its own array (TFLite frees it); a kernel's prepare frees and
    // replaces the copy's.
    copy.node.temporaries = NewIntArray(0);
    if (copy.node.temporaries == nullptr) return "out of memory";
    nodes_.push_back(copy);
    for (int j = 0; j < node->outputs->size; ++j) written.insert(node->outputs->data[j]);
  }
  const std::set<int> read_after(outputs.begin(), outputs.end());
  for (int t : written) {
    if (t >= 0 && read_after.count(t) == 0) internal_.insert(t);
    if (t >= 0 && read_after.count(t) != 0 && persistent_outputs) outputs_.insert(t);
  }
  return "";
}

std::vector<int> TfliteFallback::OwnMemory(TfLiteContext* context, const TfLiteNode& node) const {
  std::vector<int> tensors;
  for (int j = 0; j < node.outputs->size; ++j) {
    const int t = node.outputs->data[j];
    if (internal_.count(t) && InArena(context->tensors[t])) tensors.push_back(t);
  }
  for (int j = 0; node.temporaries != nullptr && j < node.temporaries->size; ++j) {
    const int t = node.temporaries->data[j];
    if (t >= 0 && InArena(context->tensors[t])) tensors.push_back(t);
  }
  return tensors;
}

TfLiteStatus TfliteFallback::Bind(TfLiteContext* context, int tensor) {
  TfLiteTensor& t = context->tensors[tensor];
  Block& block = memory_[tensor];
  if (block.bytes < t.bytes || block.data == nullptr) {
    const size_t bytes = std::max<size_t>(t.bytes, 1);
    void* data = nullptr;
    if (posix_memalign(&data, kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment) != 0) {
      context->ReportError(context, "dnnfusion: out of memory for tensor %d (%zu bytes)", tensor, t.bytes);
      return kTfLiteError;
    }
    if (block.data != nullptr) std::memcpy(data, block.data, block.bytes);
    std::free(block.data);
    block = {data, bytes};
  }
  t.data.raw = static_cast<char*>(block.data);
  return kTfLiteOk;
}

TfLiteStatus TfliteFallback::Prepare(TfLiteContext* context) {
  for (Node& n : nodes_) {
    if (n.registration.prepare != nullptr && n.registration.prepare(context, &n.node) != kTfLiteOk) {
      context->ReportError(context, "dnnfusion: TFLite's kernel for node %d failed to prepare", n.index);
      return kTfLiteError;
    }
    for (int t : OwnMemory(context, n.node)) {
      if (Bind(context, t) != kTfLiteOk) return kTfLiteError;
    }
    for (int j = 0; j < n.node.outputs->size; ++j) {
      TfLiteTensor& t = context->tensors[n.node.outputs->data[j]];
      if (outputs_.count(n.node.outputs->data[j]) && t.allocation_type == kTfLiteArenaRw) {
        t.allocation_type = kTfLiteArenaRwPersistent;  // TFLite plans it after this Prepare
      }
    }
  }
  return kTfLiteOk;
}

TfLiteStatus TfliteFallback::Invoke(TfLiteContext* context) {
  for (Node& n : nodes_) {
    for (int t : OwnMemory(context, n.node)) {
      if (Bind(context, t) != kTfLiteOk) return kTfLiteError;
    }
    if (n.registration.invoke != nullptr && n.registration.invoke(context, &n.node) != kTfLiteOk) {
      context->ReportError(context, "dnnfusion: TFLite's kernel for node %d failed", n.index);
      return kTfLiteError;
    }
  }
  return kTfLiteOk;
}

}  // namespace dnnfusion
