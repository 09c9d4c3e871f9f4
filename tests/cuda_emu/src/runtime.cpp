// The CUDA emulator's device, errors and launch checks.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "internal.hpp"

namespace strata_emu {
namespace {

// As an H100's: 48 KiB of dynamic shared memory without the opt-in, 227 KiB with it.
constexpr std::size_t kSharedDefault = 48 * 1024;
constexpr std::size_t kSharedOptin = 227 * 1024;

thread_local cudaError_t tls_last_error = cudaSuccess;

std::mutex attr_mutex;
std::map<const void*, std::size_t> max_dynamic_shared;  // kernels that opted in, and how far

std::size_t shared_limit(const void* kernel) {
  std::lock_guard lock(attr_mutex);
  const auto it = max_dynamic_shared.find(kernel);
  return it == max_dynamic_shared.end() ? kSharedDefault : it->second;
}

// cudaErrorInvalidConfiguration for block or grid shapes CUDA refuses, cudaErrorInvalidValue for
// more dynamic shared memory than the kernel may use (as CUDA reports them).
cudaError_t check_config(const LaunchConfig& c) {
  const dim3 b = c.block, g = c.grid;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
    report("kernel %s: block (%u, %u, %u) is not a valid block (at most 1024 threads, z <= 64)",
           c.name, b.x, b.y, b.z);
    return cudaErrorInvalidConfiguration;
  }
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
    report("kernel %s: grid (%u, %u, %u) is not a valid grid", c.name, g.x, g.y, g.z);
    return cudaErrorInvalidConfiguration;
  }
  const std::size_t limit = shared_limit(c.kernel);
  if (c.smem > limit) {
    report("kernel %s: %zu bytes of dynamic shared memory, above its limit of %zu%s", c.name,
           c.smem, limit,
           limit == kSharedDefault ? " (cudaFuncAttributeMaxDynamicSharedMemorySize opts in)" : "");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

thread_local int current_device = 0;

int device_count() {
  static const int count = [] {
    const char* v = std::getenv("STRATA_CUDA_EMU_DEVICES");
    if (v == nullptr || *v == '\0') return 1;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 16)
      fatal("STRATA_CUDA_EMU_DEVICES=%s: must be a whole number of devices in 1..16", v);
    return int(n);
  }();
  return count;
}

void report(const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  std::fprintf(stderr, "strata CUDA emulator: %s\n", message);
}

void fatal(const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);
  std::fprintf(stderr, "strata CUDA emulator: fatal: %s\n", message);
  std::abort();
}

cudaError_t set_last_error(cudaError_t error) {
  if (error != cudaSuccess) tls_last_error = error;
  return error;
}

void launch_kernel(const LaunchConfig& config, std::function<void()> body,
                   const std::vector<const void*>& pointer_args) {
  if (const cudaError_t err = check_config(config); err != cudaSuccess) {
    set_last_error(err);
    return;
  }
  for (std::size_t i = 0; i < pointer_args.size(); ++i) {
    if (pointer_args[i] != nullptr && !in_device_memory(pointer_args[i], 0)) {
      report("kernel %s: pointer argument %zu (%p) is not in device memory", config.name, i + 1,
             pointer_args[i]);
      set_last_error(cudaErrorInvalidValue);
      return;
    }
  }
  // One grid at a time: __shared__ variables are statics shared by every launch.
  static std::mutex launch_mutex;
  const cudaError_t err = enqueue(config.stream, [config, body = std::move(body)] {
    std::lock_guard lock(launch_mutex);
    run_grid(config, body);
  });
  set_last_error(err);
}

}  // namespace strata_emu

using strata_emu::set_last_error;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return set_last_error(cudaErrorInvalidValue);
  *count = strata_emu::device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= strata_emu::device_count())
    return set_last_error(cudaErrorInvalidDevice);
  strata_emu::current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return set_last_error(cudaErrorInvalidValue);
  *device = strata_emu::current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return set_last_error(cudaErrorInvalidValue);
  if (device < 0 || device >= strata_emu::device_count())
    return set_last_error(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "strata CUDA emulator");
  prop->uuid.bytes[15] = char(device);
  prop->totalGlobalMem = std::size_t(16) << 30;
  prop->sharedMemPerBlock = strata_emu::kSharedDefault;
  prop->sharedMemPerBlockOptin = strata_emu::kSharedOptin;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (strata_emu::capture_forbids("cudaDeviceSynchronize"))
    return set_last_error(cudaErrorStreamCaptureUnsupported);
  strata_emu::synchronize_all_streams();
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return set_last_error(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) { return cudaRuntimeGetVersion(version); }

cudaError_t cudaGetLastError(void) {
  const cudaError_t err = strata_emu::tls_last_error;
  strata_emu::tls_last_error = cudaSuccess;
  return err;
}

cudaError_t cudaPeekAtLastError(void) { return strata_emu::tls_last_error; }

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return set_last_error(cudaErrorInvalidValue);
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
      std::size_t(value) > strata_emu::kSharedOptin)
    return set_last_error(cudaErrorInvalidValue);
  std::lock_guard lock(strata_emu::attr_mutex);
  strata_emu::max_dynamic_shared[func] = std::size_t(value);
  return cudaSuccess;
}

#define STRATA_EMU_ERROR_CASE(name, text) \
  case name:                              \
    return want_name ? #name : text;

static const char* error_text(cudaError_t error, bool want_name) {
  switch (error) {
    STRATA_EMU_ERROR_CASE(cudaSuccess, "no error")
    STRATA_EMU_ERROR_CASE(cudaErrorInvalidValue, "invalid argument")
    STRATA_EMU_ERROR_CASE(cudaErrorMemoryAllocation, "out of memory")
    STRATA_EMU_ERROR_CASE(cudaErrorInitializationError, "initialization error")
    STRATA_EMU_ERROR_CASE(cudaErrorInvalidConfiguration, "invalid configuration argument")
    STRATA_EMU_ERROR_CASE(cudaErrorInvalidDevicePointer, "invalid device pointer")
    STRATA_EMU_ERROR_CASE(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")
    STRATA_EMU_ERROR_CASE(cudaErrorStubLibrary, "CUDA driver is a stub library")
    STRATA_EMU_ERROR_CASE(cudaErrorInsufficientDriver,
                          "CUDA driver version is insufficient for CUDA runtime version")
    STRATA_EMU_ERROR_CASE(cudaErrorNoDevice, "no CUDA-capable device is detected")
    STRATA_EMU_ERROR_CASE(cudaErrorInvalidDevice, "invalid device ordinal")
    STRATA_EMU_ERROR_CASE(cudaErrorNoKernelImageForDevice,
                          "no kernel image is available for execution on the device")
    STRATA_EMU_ERROR_CASE(cudaErrorInvalidResourceHandle, "invalid resource handle")
    STRATA_EMU_ERROR_CASE(cudaErrorIllegalState,
                          "the operation cannot be performed in the present state")
    STRATA_EMU_ERROR_CASE(cudaErrorNotReady, "device not ready")
    STRATA_EMU_ERROR_CASE(cudaErrorIllegalAddress, "an illegal memory access was encountered")
    STRATA_EMU_ERROR_CASE(cudaErrorLaunchFailure, "unspecified launch failure")
    STRATA_EMU_ERROR_CASE(cudaErrorNotSupported, "operation not supported")
    STRATA_EMU_ERROR_CASE(cudaErrorStreamCaptureUnsupported,
                          "operation not permitted when stream is capturing")
    STRATA_EMU_ERROR_CASE(cudaErrorStreamCaptureInvalidated,
                          "operation failed due to a previous error during capture")
    STRATA_EMU_ERROR_CASE(cudaErrorStreamCaptureImplicit,
                          "operation would make the legacy stream depend on a capturing blocking "
                          "stream")
    STRATA_EMU_ERROR_CASE(
        cudaErrorStreamCaptureWrongThread,
        "attempt to terminate a thread-local capture sequence from another thread")
    STRATA_EMU_ERROR_CASE(cudaErrorUnknown, "unknown error")
  }
  return want_name ? "cudaErrorUnknown" : "unrecognized error code";
}

const char* cudaGetErrorName(cudaError_t error) { return error_text(error, true); }
const char* cudaGetErrorString(cudaError_t error) { return error_text(error, false); }

}  // extern "C"
