// The CUDA backend of DeviceOps (cuda/ops.hpp) against the CPU backend on the same data: every
// operation in fp32 and bf16, bit for bit where both round once per element with the same
// operations (copy, cast, fill, scale, axpy: signed zeros included), AdamW to a last-bit
// difference (FMA contraction may differ), the sum of squares to fp32 summation error. Runs on a
// GPU, and on the CUDA emulator in every build (test_cuda_ops_emu).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backends/cuda/device.hpp"
#include "backends/cuda/ops.hpp"
#include "cuda_test.hpp"
#include "strata/device.hpp"
#include "strata/types.hpp"

using namespace strata;

namespace {

// `n` elements of a dtype on the device, with a host mirror of the same bits.
struct DeviceArray {
  DType dtype;
  std::size_t n;
  std::vector<std::uint8_t> host;
  void* dev = nullptr;
  DeviceArray(DType t, std::size_t count, std::uint32_t seed) : dtype(t), n(count) {
    host.resize(n * dtype_size(t));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    for (std::size_t i = 0; i < n; ++i) {
      const float v = d(rng);
      if (t == DType::f32)
        reinterpret_cast<float*>(host.data())[i] = v;
      else
        reinterpret_cast<bf16*>(host.data())[i] = to_bf16(v);
    }
    STRATA_CUDA_CHECK(cudaMalloc(&dev, host.size()));
    STRATA_CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(dev); }
  BufferView device_view() { return {dev, n, dtype, Device::cuda}; }
  BufferView host_view() { return {host.data(), n, dtype, Device::cpu}; }
  // The device's bits equal the host mirror's.
  void expect_equal(const char* what) {
    std::vector<std::uint8_t> back(host.size());
    STRATA_CUDA_CHECK(cudaMemcpy(back.data(), dev, back.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(back, host) << what << " " << dtype_name(dtype);
  }
};

struct CudaOpsTest : ::testing::Test {
  cudaStream_t stream = nullptr;
  void SetUp() override {
    if (strata::cuda::cuda_device_count() == 0) return;
    STRATA_CUDA_CHECK(cudaStreamCreate(&stream));
  }
  void TearDown() override {
    if (stream) cudaStreamDestroy(stream);
  }
};

TEST_F(CudaOpsTest, ElementwiseOpsMatchTheCpuBackendBitForBit) {
  STRATA_REQUIRE_GPU();
  cuda::CudaOps ops(stream);
  DeviceOps& cpu = cpu_ops();
  const std::size_t n = 70001;  // several blocks, a ragged end
  for (DType t : {DType::f32, DType::bf16}) {
    DeviceArray y(t, n, 1), x(t, n, 2);
    ops.axpy(y.device_view(), 0.75, x.device_view());
    cpu.axpy(y.host_view(), 0.75, x.host_view());
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    y.expect_equal("axpy");
    ops.scale(y.device_view(), -1.5);
    cpu.scale(y.host_view(), -1.5);
    ops.copy(x.device_view(), y.device_view());
    cpu.copy(x.host_view(), y.host_view());
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    y.expect_equal("scale");
    x.expect_equal("copy");
    ops.fill(y.device_view(), 0.1);
    cpu.fill(y.host_view(), 0.1);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    y.expect_equal("fill");
  }
  DeviceArray f(DType::f32, n, 3), b(DType::bf16, n, 4);
  ops.cast(b.device_view(), f.device_view());
  cpu.cast(b.host_view(), f.host_view());
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  b.expect_equal("cast f32 -> bf16");
}

TEST_F(CudaOpsTest, SumOfSquaresToFp32SummationError) {
  STRATA_REQUIRE_GPU();
  cuda::CudaOps ops(stream);
  for (DType t : {DType::f32, DType::bf16}) {
    DeviceArray x(t, 100003, 5);
    const double want = cpu_ops().sum_of_squares(x.host_view());
    EXPECT_NEAR(ops.sum_of_squares(x.device_view()), want, 1e-5 * want) << dtype_name(t);
  }
}

TEST_F(CudaOpsTest, AdamWMatchesTheCpuBackendWithAndWithoutAMaster) {
  STRATA_REQUIRE_GPU();
  cuda::CudaOps ops(stream);
  const std::size_t n = 4099;
  const DeviceOps::AdamWStep st{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
  for (DType param : {DType::f32, DType::bf16})
    for (DType grad : {DType::f32, DType::bf16}) {
      DeviceArray p(param, n, 6), g(grad, n, 7), m(DType::f32, n, 8), v(DType::f32, n, 9);
      DeviceArray master(DType::f32, param == DType::bf16 ? n : 0, 10);
      for (auto& byte : v.host) byte &= 0x7f;  // v >= 0
      STRATA_CUDA_CHECK(cudaMemcpy(v.dev, v.host.data(), v.host.size(), cudaMemcpyHostToDevice));
      const bool mixed = param == DType::bf16;
      ops.adamw(p.device_view(), mixed ? master.device_view() : BufferView{}, g.device_view(),
                m.device_view(), v.device_view(), st);
      cpu_ops().adamw(p.host_view(), mixed ? master.host_view() : BufferView{}, g.host_view(),
                      m.host_view(), v.host_view(), st);
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
      // sqrtf on the device vs the CPU's sqrt_nonneg may differ in the last bit of v's root.
      std::vector<float> back(n), want(n);
      BufferView p32 = mixed ? master.host_view() : p.host_view();
      STRATA_CUDA_CHECK(cudaMemcpy(back.data(), mixed ? master.dev : p.dev, n * sizeof(float),
                                   cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_NEAR(back[i], static_cast<const float*>(p32.data)[i],
                    1e-6f * std::fabs(static_cast<const float*>(p32.data)[i]) + 1e-7f)
            << i << " " << dtype_name(param) << " params " << dtype_name(grad) << " grads";
      // m and v: the CPU's vectorised clones may contract into FMAs: a last-bit difference.
      for (DeviceArray* a : {&m, &v}) {
        STRATA_CUDA_CHECK(
            cudaMemcpy(back.data(), a->dev, n * sizeof(float), cudaMemcpyDeviceToHost));
        const float* w = reinterpret_cast<const float*>(a->host.data());
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_NEAR(back[i], w[i], 1e-6f * (std::fabs(w[i]) + 1.0f))  // terms are O(1)
              << (a == &m ? "m " : "v ") << i;
      }
    }
}

TEST_F(CudaOpsTest, HostViewsAndFp64AreRefused) {
  STRATA_REQUIRE_GPU();
  cuda::CudaOps ops(stream);
  std::vector<float> host(4);
  EXPECT_THROW(ops.fill(view(host.data(), 4), 0.0), Error);
  void* d = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(&d, 4 * sizeof(double)));
  EXPECT_THROW(ops.fill({d, 4, DType::f64, Device::cuda}, 0.0), Error);
  cudaFree(d);
}

}  // namespace
