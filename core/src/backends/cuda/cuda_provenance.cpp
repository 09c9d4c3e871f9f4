// The CUDA build's provenance entries (see cuda/cuda_provenance.hpp).
#include "backends/cuda/cuda_provenance.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "backends/cuda/device.hpp"
#if STRATA_HAVE_CUDNN
#include "backends/cuda/cudnn_attention.hpp"
#endif
#if STRATA_HAVE_NCCL
#include "backends/cuda/nccl_transport.hpp"
#endif

namespace strata::cuda {

namespace {

// CUDA encodes versions as 1000 * major + 10 * minor (13000 is 13.0).
std::string cuda_version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string driver_version() {
  // 0 (or an error, with only the toolkit's stub libcuda) means no driver: not a failure here.
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess || v == 0) {
    (void)cudaGetLastError();  // leave no error behind for the next checked call
    return "none";
  }
  return cuda_version_string(v);
}

std::string cublas_version() {
  // cublasGetProperty needs no handle (a handle would need a device).
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
    return "unknown";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace

Provenance cuda_provenance() {
  Provenance p;
  int runtime = 0;
  p.emplace_back("cuda_version", cudaRuntimeGetVersion(&runtime) == cudaSuccess
                                     ? cuda_version_string(runtime)
                                     : "unknown");
  p.emplace_back("cuda_driver_version", driver_version());
  p.emplace_back("cublas_version", cublas_version());
#if STRATA_HAVE_CUDNN
  p.emplace_back("cudnn_version", cudnn_library_version());
#endif
#if STRATA_HAVE_NCCL
  p.emplace_back("nccl_version", nccl::nccl_version());
#endif
  const int devices = cuda_device_count();  // 0 without GPU or driver, without selecting one
  p.emplace_back("gpu_count", std::to_string(devices));
  std::string names;
  for (int d = 0; d < devices; ++d) names += (d ? "; " : "") + cuda_device_name(d);
  if (devices > 0) p.emplace_back("gpu_names", names);
  return p;
}

void register_provenance() { register_provenance_provider(&cuda_provenance); }

}  // namespace strata::cuda
