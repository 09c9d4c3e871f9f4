// The CUDA build's /provenance entries on the machine the test runs on: versions always, the
// driver "none" and no GPU names where there is no GPU or driver (as in CI), and quickly.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>

#include "cuda/cuda_provenance.hpp"
#include "cuda/device.hpp"

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

}  // namespace
