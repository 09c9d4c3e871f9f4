// For the CUDA tests (test_cuda_layers, test_cuda_ops, test_cuda_kernels, test_cuda_backend): built
// against the real CUDA runtime they are the ctest label `gpu`, which `make test` runs only where
// nvidia-smi sees a GPU; built against the CUDA emulator (the *_emu executables, tests emu.*) a
// device always exists. Either way a test that finds no device FAILS by name: none is skipped.
#pragma once
#include <gtest/gtest.h>

#include "backends/cuda/device.hpp"
#include "random_inputs.hpp"

// Fail the current test, by name, when there is no GPU.
#define STRATA_REQUIRE_GPU()                                                                 \
  if (strata::cuda::cuda_device_count() == 0)                                                \
  GTEST_FAIL() << "no CUDA device: "                                                         \
               << ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() \
               << "." << ::testing::UnitTest::GetInstance()->current_test_info()->name()     \
               << " needs a GPU"
