// For the CUDA tests (test_cuda_layers, test_cuda_ops, test_cuda_kernels): built against the real
// CUDA runtime they skip, by name, on a machine without a GPU; built against the CUDA emulator
// (the *_emu executables) a device always exists, and ctest fails any test that prints the skip
// message ("no CUDA device").
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/device.hpp"

// n floats uniform in [lo, hi) from a seed, and n tokens in [0, V): the tests' inputs.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
inline std::vector<std::int32_t> random_tokens(std::size_t n, int V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, V - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Skip the current test, by name, when there is no GPU.
#define STRATA_REQUIRE_GPU()                                                                 \
  if (strata::cuda::cuda_device_count() == 0)                                                \
  GTEST_SKIP() << "no CUDA device: "                                                         \
               << ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() \
               << "." << ::testing::UnitTest::GetInstance()->current_test_info()->name()     \
               << " needs a GPU"
