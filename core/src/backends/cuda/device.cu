// CUDA device queries, GPU peak table, error reporting (see device.hpp).
#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cuda/device.hpp"
#include "strata/types.hpp"

namespace strata::cuda {

namespace {

std::string cuda_hint(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return "the GPU is out of memory: use a smaller --micro-batch or model, a sharded strategy "
             "(zero2/zero3/fsdp), or --recompute";
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return "no usable GPU for this rank: check CUDA_VISIBLE_DEVICES, the Slurm GPU allocation "
             "(--gpus-per-task) and `nvidia-smi`";
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
      return "the NVIDIA driver is missing or older than the CUDA runtime strata was built with: "
             "check `nvidia-smi` and the driver version";
    case cudaErrorNoKernelImageForDevice:
      return "strata was not compiled for this GPU's architecture: rebuild with "
             "-DSTRATA_CUDA_ARCHITECTURES=<this GPU's sm, e.g. 100>";
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureImplicit:
      return "a call that CUDA graph capture does not allow ran inside a captured micro-batch "
             "(--cuda-graphs): a bug in strata or the plugin; run without --cuda-graphs";
    default:
      return "rerun with CUDA_LAUNCH_BLOCKING=1 (and compute-sanitizer) to find the failing kernel";
  }
}

}  // namespace

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Reset the runtime's last-error slot (a no-op for sticky device faults): this error is reported
  // now, and must not resurface at the next STRATA_CUDA_CHECK_LAUNCH() as a kernel's failure.
  (void)cudaGetLastError();
  std::ostringstream os;
  os << file << ':' << line << ": CUDA error " << cudaGetErrorName(err) << " ("
     << cudaGetErrorString(err) << ") in " << call;
  throw Error(os.str(), cuda_hint(err));
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  std::ostringstream os;
  os << file << ':' << line << ": cuBLAS error " << cublasGetStatusName(st) << " ("
     << cublasGetStatusString(st) << ") in " << call;
  std::string hint = st == CUBLAS_STATUS_ALLOC_FAILED
                         ? "the GPU is out of memory for cuBLAS's workspace: use a smaller "
                           "--micro-batch or model"
                         : "check the GEMM shapes and leading dimensions; rerun with "
                           "CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=stderr for cuBLAS's own log";
  throw Error(os.str(), std::move(hint));
}

int cuda_device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
      err == cudaErrorStubLibrary) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  STRATA_CUDA_CHECK(err);
  return n;
}

std::string cuda_device_name(int device) {
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::string s = "GPU-";
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

// Figures from NVIDIA's data sheets, per GPU, dense (no structured sparsity):
//   fp32 = FP32 (CUDA cores, not TF32 tensor);  bf16 = BF16 tensor core, half the "with
//   sparsity" figure the data sheets print.
//   H100 SXM5   67 TF   989.4 TF      H100 PCIe  51 TF  756 TF      H100 NVL  60 TF  835.5 TF
//   H200 (SXM)  67 TF   989.4 TF      H200 NVL   60 TF  835.5 TF
//   A100 SXM4 and PCIe (40 and 80 GB)  19.5 TF  312 TF
//   L40S        91.6 TF 362.05 TF     A10        31.2 TF  125 TF
// Names as cudaDeviceProp::name reports them, e.g. "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
// "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", "NVIDIA A10".
// Matching is on whole tokens (split at spaces and '-', case-insensitive), so "A100" is not "A10"
// and "L40" is not "L40S"; a variant the table does not know (A10G, L40, GH200) gives 0.
double peak_dense_flops(const std::string& device_name, bool bf16) {
  std::vector<std::string> tokens;
  std::string cur;
  for (char ch : device_name) {
    if (ch == ' ' || ch == '-' || ch == '_') {
      if (!cur.empty()) tokens.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(char(std::toupper(static_cast<unsigned char>(ch))));
    }
  }
  if (!cur.empty()) tokens.push_back(cur);
  const auto has = [&](const char* t) {
    return std::find(tokens.begin(), tokens.end(), std::string(t)) != tokens.end();
  };
  const auto pick = [bf16](double fp32_tf, double bf16_tf) {
    return (bf16 ? bf16_tf : fp32_tf) * 1e12;
  };
  if (has("H200")) return has("NVL") ? pick(60.0, 835.5) : pick(67.0, 989.4);
  if (has("H100")) {
    if (has("NVL")) return pick(60.0, 835.5);
    if (has("PCIE")) return pick(51.0, 756.0);
    if (has("HBM3") || has("SXM") || has("SXM5")) return pick(67.0, 989.4);
    return 0.0;
  }
  if (has("A100")) {
    if (has("PCIE") || has("SXM4") || has("SXM")) return pick(19.5, 312.0);
    return 0.0;
  }
  if (has("L40S")) return pick(91.6, 362.05);
  if (has("A10")) return pick(31.2, 125.0);
  return 0.0;
}

}  // namespace strata::cuda
