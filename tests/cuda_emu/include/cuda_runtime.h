// The CUDA emulator's cuda_runtime.h (tests/cuda_emu): the runtime API, the device side of kernels
// compiled as host C++ (qualifiers, built-in variables, barriers, shuffles, atomics) and launches.
#pragma once
#include "cuda_emu/kernel.hpp"
#include "cuda_emu/launch.hpp"
#include "cuda_runtime_api.h"

// The C++ form CUDA's header offers: the attribute of a kernel, named by its function.
template <class... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}
