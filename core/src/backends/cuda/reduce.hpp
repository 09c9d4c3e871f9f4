// The sum (or sum of squares) of a device buffer, returned to the host: fp32 per block on the
// device, the block sums in double on the host (no double arithmetic on the device: ptxas
// -warn-double-usage is an error in this build). Waits for the stream. Used by the loss sum of the
// model's kernels and the gradient norm of DeviceOps. Plain C++ header.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace strata::cuda {

class DeviceSum {
 public:
  DeviceSum() = default;
  ~DeviceSum();
  DeviceSum(const DeviceSum&) = delete;
  DeviceSum& operator=(const DeviceSum&) = delete;
  // Sum over x[0, n) (f32, or bf16 words) of x[i], or of x[i]^2 with `squares`.
  double operator()(cudaStream_t stream, const void* x, bool bf16, std::size_t n, bool squares);

 private:
  float* partial_ = nullptr;  // one sum per block, allocated on first use
};

}  // namespace strata::cuda
