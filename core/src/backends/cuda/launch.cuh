// Kernel launches and dynamic shared memory, written once for two compilers: nvcc, where they are
// the CUDA syntax itself, and the host C++ compiler of the CUDA emulation layer (tests/cuda_emu),
// which has no `<<<...>>>` and no `extern __shared__`. Every kernel launch and every dynamic
// shared-memory array of the CUDA sources goes through these macros, so the emulated build runs the
// same kernels.
//
//   STRATA_LAUNCH(kernel, grid, block, smem_bytes, stream)(args...);
//   STRATA_DYNAMIC_SHARED(float, shared);  // in a kernel: the launch's smem_bytes as float[]
//   allow_shared_memory(kernel, smem_bytes);  // before a launch of more than 48 KiB
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "backends/cuda/device.hpp"  // STRATA_CUDA_CHECK

#if defined(__CUDACC__)
#define STRATA_LAUNCH(kernel, grid, block, smem, stream) \
  kernel<<<(grid), (block), (smem), (stream)>>>
#define STRATA_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#elif defined(STRATA_CUDA_EMULATOR)
// The emulator's launcher checks the configuration like CUDA, converts the arguments to the
// kernel's parameter types and queues the kernel on `stream`
// (tests/cuda_emu/include/cuda_emu/launch.hpp).
#define STRATA_LAUNCH(kernel, grid, block, smem, stream) \
  ::strata_emu::Launch(&kernel, #kernel, (grid), (block), (smem), (stream))
#define STRATA_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::strata_emu::dynamic_shared_memory())
#else
#error "cuda/launch.cuh: compile with nvcc, or against the CUDA emulator's headers (tests/cuda_emu)"
#endif

namespace strata::cuda {

// Above the default 48 KiB of dynamic shared memory a kernel must opt in (CUDA refuses the launch
// otherwise; the emulator checks the same).
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    STRATA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace strata::cuda
