// For the CUDA tests (test_cuda_layers, test_cuda_ops, test_cuda_kernels): built against the real
// CUDA runtime they skip, by name, on a machine without a GPU; built against the CUDA emulator
// (the *_emu executables) a device always exists, and ctest fails any test that prints the skip
// message ("no CUDA device").
#pragma once
#include <gtest/gtest.h>

#include "cuda/device.hpp"
#include "random_inputs.hpp"

// Skip the current test, by name, when there is no GPU.
#define STRATA_REQUIRE_GPU()                                                                 \
  if (strata::cuda::cuda_device_count() == 0)                                                \
  GTEST_SKIP() << "no CUDA device: "                                                         \
               << ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() \
               << "." << ::testing::UnitTest::GetInstance()->current_test_info()->name()     \
               << " needs a GPU"
