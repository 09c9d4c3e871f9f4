// The CUDA build's /provenance entries on the machine the test runs on: versions always, the
// driver "none" and no GPU names where there is no GPU or driver (as in CI), and quickly.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>

#include "backends/cuda/cuda_provenance.hpp"
#include "backends/cuda/device.hpp"

namespace {

std::string value(const strata::Provenance& p, const std::string& key) {
  for (const auto& [k, v] : p)
    if (k == key) return v;
  return "(absent)";
}

TEST(CudaProvenance, VersionsAndDevices) {
  const auto start = std::chrono::steady_clock::now();
  const auto p = strata::cuda::cuda_provenance();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(std::regex_match(value(p, "cuda_version"), std::regex(R"(\d+\.\d+)")))
      << value(p, "cuda_version");
  EXPECT_TRUE(std::regex_match(value(p, "cublas_version"), std::regex(R"(\d+\.\d+\.\d+)")))
      << value(p, "cublas_version");
#if STRATA_HAVE_CUDNN
  // The configure step found cuDNN 9.10 or newer, so the run-time loader finds a cuDNN 9 too.
  EXPECT_TRUE(std::regex_match(value(p, "cudnn_version"), std::regex(R"(9\.\d+\.\d+)")))
      << value(p, "cudnn_version");
#else
  EXPECT_EQ(value(p, "cudnn_version"), "(absent)");
#endif
#if STRATA_HAVE_NCCL
  EXPECT_TRUE(std::regex_match(value(p, "nccl_version"), std::regex(R"(2\.\d+\.\d+)")))
      << value(p, "nccl_version");
#endif
  const int devices = strata::cuda::cuda_device_count();
  EXPECT_EQ(value(p, "gpu_count"), std::to_string(devices));
  if (devices == 0) {
    EXPECT_EQ(value(p, "gpu_names"), "(absent)");
    EXPECT_LT(seconds, 5.0) << "the no-GPU path must stay quick";
  } else {
    EXPECT_EQ(value(p, "gpu_names").rfind(strata::cuda::cuda_device_name(0), 0), 0u);
    EXPECT_NE(value(p, "cuda_driver_version"), "none");
  }
}

// The device queries on the real runtime: without a GPU (as in CI) they must answer, not throw.

TEST(CudaDevice, CountDoesNotThrowWithoutAGpu) {
  int n = -1;
  EXPECT_NO_THROW(n = strata::cuda::cuda_device_count());
  EXPECT_GE(n, 0);
  // Asking twice gives the same answer (no sticky error left behind by the first call).
  EXPECT_EQ(strata::cuda::cuda_device_count(), n);
  if (n > 0) {
    EXPECT_FALSE(strata::cuda::cuda_device_name(0).empty());
  }
}

TEST(CudaDevice, PeakTable) {
  // H100 SXM5 and H200: 67 TFLOP/s fp32, 989.4 TFLOP/s dense bf16.
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA H100 80GB HBM3", true), 989.4e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA H100 80GB HBM3", false), 67.0e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA H200", true), 989.4e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA H200", false), 67.0e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA H100 PCIe", true), 756.0e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA A100-SXM4-80GB", true), 312.0e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA A100 80GB PCIe", false), 19.5e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA L40S", true), 362.05e12);
  // Whole-token matching: "A10" is not a prefix match of "A100", "L40" is not "L40S".
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA A10", true), 125.0e12);
  EXPECT_DOUBLE_EQ(strata::cuda::peak_dense_flops("NVIDIA A10", false), 31.2e12);
  EXPECT_EQ(strata::cuda::peak_dense_flops("NVIDIA L40", true), 0.0);
  EXPECT_EQ(strata::cuda::peak_dense_flops("NVIDIA A10G", true), 0.0);
  // Unknown names: 0, so no MFU is reported rather than a wrong one.
  EXPECT_EQ(strata::cuda::peak_dense_flops("NVIDIA GeForce GTX 1080", true), 0.0);
  EXPECT_EQ(strata::cuda::peak_dense_flops("", false), 0.0);
}

}  // namespace
