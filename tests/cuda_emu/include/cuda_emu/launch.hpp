// Kernel launches in the CUDA emulator: STRATA_LAUNCH(kernel, grid, block, smem, stream)(args...)
// (core/src/backends/cuda/launch.cuh) constructs a Launch and calls it with the arguments.
#pragma once
#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_runtime_api.h"

namespace strata_emu {

struct LaunchConfig {
  const void* kernel;  // identifies the kernel for cudaFuncSetAttribute
  const char* name;
  dim3 grid, block;
  std::size_t smem;
  cudaStream_t stream;
};

// Checks the launch as CUDA does (block and grid limits, dynamic shared memory against the
// kernel's limit, the stream) and that every non-null pointer argument points into device memory;
// on failure sets the thread's last error (and says why on stderr) and runs nothing. Otherwise
// queues `body` on the stream, to run once per CUDA thread of every block.
void launch_kernel(const LaunchConfig& config, std::function<void()> body,
                   const std::vector<const void*>& pointer_args);

template <class... Params>
class Launch {
 public:
  Launch(void (*kernel)(Params...), const char* name, dim3 grid, dim3 block, std::size_t smem,
         cudaStream_t stream)
      : kernel_(kernel),
        config_{reinterpret_cast<const void*>(kernel), name, grid, block, smem, stream} {}

  // The arguments convert to the kernel's parameter types here, as in a CUDA launch.
  void operator()(Params... args) const {
    std::vector<const void*> pointers;
    (add_pointer(pointers, args), ...);
    launch_kernel(
        config_,
        [kernel = kernel_, values = std::tuple<Params...>(args...)] { std::apply(kernel, values); },
        pointers);
  }

 private:
  template <class T>
  static void add_pointer(std::vector<const void*>& out, const T& arg) {
    if constexpr (std::is_pointer_v<T>) out.push_back(static_cast<const void*>(arg));
  }

  void (*kernel_)(Params...);
  LaunchConfig config_;
};

}  // namespace strata_emu
