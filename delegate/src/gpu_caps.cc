#include "gpu_caps.h"

#include <dlfcn.h>

#include <cstdint>
#include <string>

#include "HalideRuntime.h"
#include "log.h"

// The Halide runtime of an OpenCL or Vulkan bundle defines these; other bundles link without
// them, so they are weak references here (null where absent).
extern "C" {
const halide_device_interface_t* halide_opencl_device_interface() __attribute__((weak));
int halide_acquire_cl_context(void* user_context, void** ctx, void** queue, bool create) __attribute__((weak));
int halide_release_cl_context(void* user_context) __attribute__((weak));
int halide_vulkan_acquire_context(void* user_context, void** allocator, void** instance, void** device,
                                  void** physical_device, void** queue, uint32_t* queue_family_index,
                                  void** messenger, bool create) __attribute__((weak));
int halide_vulkan_release_context(void* user_context, void* instance, void* device, void* queue, void* messenger)
    __attribute__((weak));
}

namespace dnnfusion {
namespace {

// A symbol of an API library the Halide runtime has already loaded (dlopen only adds a reference).
void* ApiSymbol(const char* const* libraries, const char* name) {
  for (const char* const* lib = libraries; *lib != nullptr; ++lib) {
    if (void* handle = dlopen(*lib, RTLD_NOW | RTLD_LOCAL)) {
      if (void* symbol = dlsym(handle, name)) return symbol;  // the handle stays open with the runtime's
      dlclose(handle);
    }
  }
  return nullptr;
}

// The OpenCL runtime loads libOpenCL and creates its context on first use; a one-float device
// buffer is that use.
bool OpenOpenClDevice() {
  float host[1] = {0};
  halide_dimension_t dim = {0, 1, 1, 0};
  halide_buffer_t buf = {};
  buf.host = reinterpret_cast<uint8_t*>(host);
  buf.type = {halide_type_float, 32, 1};
  buf.dimensions = 1;
  buf.dim = &dim;
  if (halide_device_malloc(nullptr, &buf, halide_opencl_device_interface()) != 0) return false;
  halide_device_free(nullptr, &buf);
  return true;
}

// OpenCL: a device must open (a phone without a driver, a machine without an ICD); for an fp16
// bundle, the extension string of the context's first device must list cl_khr_fp16.
std::string OpenClProblem(bool fp16) {
  if (halide_opencl_device_interface == nullptr) return "";
  if (!OpenOpenClDevice()) return "no OpenCL device could be opened";
  if (!fp16) return "";
  constexpr unsigned kContextDevices = 0x1081, kDeviceExtensions = 0x1030;  // CL_CONTEXT_DEVICES, CL_DEVICE_EXTENSIONS
  using GetContextInfo = int (*)(void*, unsigned, size_t, void*, size_t*);
  using GetDeviceInfo = int (*)(void*, unsigned, size_t, void*, size_t*);
  static const char* const kLibraries[] = {"libOpenCL.so", "libOpenCL.so.1", nullptr};
  auto context_info = reinterpret_cast<GetContextInfo>(ApiSymbol(kLibraries, "clGetContextInfo"));
  auto device_info = reinterpret_cast<GetDeviceInfo>(ApiSymbol(kLibraries, "clGetDeviceInfo"));
  if (halide_acquire_cl_context == nullptr || context_info == nullptr || device_info == nullptr) {
    Log(LogLevel::kInfo, "cannot query the OpenCL device for cl_khr_fp16; assuming it has it");
    return "";
  }
  void* ctx = nullptr;
  void* queue = nullptr;
  if (halide_acquire_cl_context(nullptr, &ctx, &queue, true) != 0 || ctx == nullptr) {
    return "no OpenCL device could be opened";
  }
  std::string problem;
  void* device = nullptr;
  size_t size = 0;
  if (context_info(ctx, kContextDevices, sizeof(device), &device, nullptr) != 0 ||
      device_info(device, kDeviceExtensions, 0, nullptr, &size) != 0) {
    problem = "cannot read the OpenCL device's extensions";
  } else {
    std::string extensions(size, '\0');
    device_info(device, kDeviceExtensions, size, &extensions[0], nullptr);
    if (extensions.find("cl_khr_fp16") == std::string::npos) {
      problem = "the OpenCL device lacks cl_khr_fp16, which this bundle (--gpu-precision fp16) needs";
    }
  }
  halide_release_cl_context(nullptr);
  return problem;
}

// Whether the Vulkan loader creates an instance with at least one physical device. Asked before
// the Halide runtime is: where it cannot create one, its context code aborts the process.
bool VulkanInstanceOpens(const char* const* libraries) {
  struct InstanceCreateInfo {  // VkInstanceCreateInfo, no layers or extensions
    int32_t s_type = 1;        // VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
    const void* next = nullptr;
    uint32_t flags = 0;
    const void* application = nullptr;
    uint32_t layer_count = 0;
    const char* const* layers = nullptr;
    uint32_t extension_count = 0;
    const char* const* extensions = nullptr;
  };
  using GetProcAddr = void* (*)(void*, const char*);
  using CreateInstance = int32_t (*)(const InstanceCreateInfo*, const void*, void**);
  using EnumerateDevices = int32_t (*)(void*, uint32_t*, void**);
  using DestroyInstance = void (*)(void*, const void*);
  auto proc_addr = reinterpret_cast<GetProcAddr>(ApiSymbol(libraries, "vkGetInstanceProcAddr"));
  if (proc_addr == nullptr) return false;
  auto create = reinterpret_cast<CreateInstance>(proc_addr(nullptr, "vkCreateInstance"));
  void* instance = nullptr;
  const InstanceCreateInfo info;
  if (create == nullptr || create(&info, nullptr, &instance) != 0 || instance == nullptr) return false;
  auto enumerate = reinterpret_cast<EnumerateDevices>(proc_addr(instance, "vkEnumeratePhysicalDevices"));
  auto destroy = reinterpret_cast<DestroyInstance>(proc_addr(instance, "vkDestroyInstance"));
  uint32_t devices = 0;
  const bool found = enumerate != nullptr && enumerate(instance, &devices, nullptr) == 0 && devices > 0;
  if (destroy != nullptr) destroy(instance, nullptr);
  return found;
}

// Vulkan: a device must open; for an fp16 bundle, it must have shaderFloat16 and
// storageBuffer16BitAccess (vkGetPhysicalDeviceFeatures2).
std::string VulkanProblem(bool fp16) {
  // The structures as the Vulkan 1.1 headers define them (no Vulkan headers are needed to build).
  struct Float16Int8Features {
    int32_t s_type = 1000082000;  // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES
    void* next = nullptr;
    uint32_t shader_float16 = 0, shader_int8 = 0;
  };
  struct Storage16BitFeatures {
    int32_t s_type = 1000083000;  // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES
    void* next = nullptr;
    uint32_t storage_buffer_16bit = 0, uniform_and_storage_buffer_16bit = 0, push_constant_16 = 0, io_16 = 0;
  };
  struct Features2 {
    int32_t s_type = 1000059000;  // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2
    void* next = nullptr;
    uint32_t features[55] = {};  // VkPhysicalDeviceFeatures: 55 VkBool32 fields
  };
  using GetProcAddr = void* (*)(void*, const char*);
  using GetFeatures2 = void (*)(void*, Features2*);
  static const char* const kLibraries[] = {"libvulkan.so.1", "libvulkan.so", nullptr};
  if (halide_vulkan_acquire_context == nullptr) return "";
  if (!VulkanInstanceOpens(kLibraries)) return "no Vulkan device could be opened";
  void *allocator = nullptr, *instance = nullptr, *device = nullptr, *physical = nullptr, *queue = nullptr,
       *messenger = nullptr;
  uint32_t family = 0;
  if (halide_vulkan_acquire_context(nullptr, &allocator, &instance, &device, &physical, &queue, &family, &messenger,
                                    true) != 0) {
    return "no Vulkan device could be opened";
  }
  std::string problem;
  auto proc_addr = reinterpret_cast<GetProcAddr>(ApiSymbol(kLibraries, "vkGetInstanceProcAddr"));
  if (!fp16) {
    // The device opens: nothing more to ask.
  } else if (proc_addr == nullptr) {
    Log(LogLevel::kInfo, "cannot query the Vulkan device for fp16 support; assuming it has it");
  } else if (auto get_features = reinterpret_cast<GetFeatures2>(proc_addr(instance, "vkGetPhysicalDeviceFeatures2"));
             get_features == nullptr) {
    problem = "the Vulkan instance has no vkGetPhysicalDeviceFeatures2 (Vulkan 1.1)";
  } else {
    Float16Int8Features f16;
    Storage16BitFeatures storage;
    Features2 features;
    features.next = &f16;
    f16.next = &storage;
    get_features(physical, &features);
    if (!f16.shader_float16 || !storage.storage_buffer_16bit) {
      problem = "the Vulkan device lacks shaderFloat16 or 16-bit storage buffers, which this bundle "
                "(--gpu-precision fp16) needs";
    }
  }
  halide_vulkan_release_context(nullptr, instance, device, queue, messenger);
  return problem;
}

}  // namespace

std::string GpuDeviceProblem(const Bundle& bundle) {
  if (bundle.gpu_api == kNoGpu) return "";
  // One answer per process (a library holds one bundle): the device does not change, and opening
  // it twice costs time.
  static const std::string problem =
      bundle.gpu_api == kOpenCl ? OpenClProblem(bundle.half_precision) : VulkanProblem(bundle.half_precision);
  return problem;
}

}  // namespace dnnfusion
