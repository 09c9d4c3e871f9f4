// CUDA device queries, the GPU peak-FLOP table used for MFU, and the error-check macros every
// CUDA source of the backend uses. Plain C++: includable from host-only translation units.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace strata::cuda {

// Number of usable CUDA devices. 0 (not an error) when the machine has no GPU or no working
// driver: cudaGetDeviceCount failing with cudaErrorNoDevice, cudaErrorInsufficientDriver or
// cudaErrorStubLibrary (only the toolkit's stub libcuda.so is installed). Any other failure throws.
int cuda_device_count();

// cudaDeviceProp::name of device `device`, e.g. "NVIDIA H100 80GB HBM3".
std::string cuda_device_name(int device);
// cudaDeviceProp::uuid as nvidia-smi prints it ("GPU-" and 32 hex digits in 8-4-4-4-12 groups):
// the same GPU seen by two processes under different ordinals (CUDA_VISIBLE_DEVICES) has one UUID.
std::string cuda_device_uuid(int device);

// Dense peak FLOP/s of one GPU from NVIDIA's data sheets, keyed on the device name as CUDA reports
// it: bf16 = true gives the bf16 tensor-core figure without sparsity, false the fp32 non-tensor
// (CUDA core) figure. 0 when the name is not in the table (the caller then reports no MFU).
// Known: H100 SXM5, H100 PCIe, H100 NVL, H200 (SXM), H200 NVL, A100 SXM4 / PCIe, L40S, A10.
double peak_dense_flops(const std::string& device_name, bool bf16);

// Throw strata::Error naming file:line, the failing call, CUDA's error string and a hint.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                     int line);

}  // namespace strata::cuda

// Check a CUDA runtime call; throws strata::Error on failure.
#define STRATA_CUDA_CHECK(call)                                                      \
  do {                                                                               \
    const cudaError_t strata_cuda_err_ = (call);                                     \
    if (strata_cuda_err_ != cudaSuccess)                                             \
      ::strata::cuda::throw_cuda_error(strata_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Check a cuBLAS call; throws strata::Error on failure.
#define STRATA_CUBLAS_CHECK(call)                                                       \
  do {                                                                                  \
    const cublasStatus_t strata_cublas_st_ = (call);                                    \
    if (strata_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                     \
      ::strata::cuda::throw_cublas_error(strata_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)

// Check the most recent kernel launch (launch configuration errors; asynchronous faults surface
// at the next synchronising call).
#define STRATA_CUDA_CHECK_LAUNCH() STRATA_CUDA_CHECK(cudaGetLastError())
